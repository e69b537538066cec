"""Issue 11: rules that real machines broke — Jetson/Tegra planning and feasibility of local ggml builds.

Machines come from replayed captures built from real dumps (``i11d-*`` by detection, ``i11p-*`` by
``make_i11p_fixtures.py``) or from the report factory for what no dump shows.
"""
from __future__ import annotations

from accelstack.manifests import Manifests, Request, resolve
from accelstack.manifests.hw_rules import driver_hint

from ._factory import amd, candidate, loaded_manifests, machine, nvidia, plan_of, replay


def jetson(cc="8.7", cuda="12.2", l4t="36.3.0", name="NVIDIA Jetson AGX Orin Developer Kit"):
    g = nvidia(name=name, cc=cc, cuda=cuda, driver="540.3.0" if l4t.startswith("36") else l4t, kind="integrated",
               vram=None, driver_name="nvgpu")
    g.l4t_version = l4t  # type: ignore[attr-defined]  # detection's field (set by name, as the resolver reads it)
    return machine(g, arch="arm64", features=["neon"], apis={"cuda": [0]})


# -- Jetson: CPU torch with the pointer to NVIDIA's Jetson wheels; ggml built for the Tegra SM --------
def test_jetson_xavier_gets_cpu_torch_and_its_jetpack_wheels():
    plan = plan_of(replay("i11d-jetson-xavier-jp5"), python="3.11")
    assert plan.backend == "cpu"
    cuda = candidate(plan, "cuda")
    assert cuda.code == "device" and "built for ARM servers (SBSA)" in cuda.reason
    assert "JetPack 5.1.2 (L4T 35.4.1)" in cuda.reason and "forums.developer.nvidia.com/t/pytorch-for-jetson" in cuda.reason
    assert any("CPU torch from PyPI is planned" in n and "JetPack 5.1.2" in n for n in plan.notes)


def test_jetson_orin_never_gets_the_sbsa_wheels_even_with_a_540_driver():
    # JetPack 6 reports a 540.x driver: it is a Tegra driver, not a desktop R535+ one
    plan = plan_of(replay("i11d-jetson-agx-orin-jp6"), python="3.11")
    assert plan.backend == "cpu" and not any(c.name.startswith("cu1") for c in plan.candidates)
    assert "JetPack 6.0 (L4T 36.3.0)" in candidate(plan, "cuda").reason  # 36.3 -> 6.0 (JETPACK-MAP-S)


def test_jetson_ggml_is_a_local_cuda_build_for_the_tegra_sm():
    orin = plan_of(replay("i11d-jetson-agx-orin-jp6"), "ggml")
    assert orin.status == "needs-build" and orin.build.backend == "cuda"
    assert orin.build.properties["sm"] == "8.7" and orin.build.properties["l4t"] == "36.3.0"
    assert "sm_87" in orin.build.reason and "Jetson" in orin.build.reason
    xavier = plan_of(replay("i11d-jetson-xavier-jp5"), "ggml")
    assert xavier.build.properties["sm"] == "7.2" and xavier.build.properties["jetpack"] == "5.1.2"
    assert "cuda_toolkit" not in xavier.build.properties  # JetPack's own CUDA, not a desktop toolkit


def test_jetpack4_nano_has_no_cuda_that_builds_ggml_and_gets_cpu():
    plan = plan_of(jetson(cc="5.3", cuda="10.2", l4t="32.7.1", name="NVIDIA Jetson Nano Developer Kit"), "ggml")
    assert plan.backend == "cpu"
    local = candidate(plan, "local-cuda")
    assert local.code == "driver" and "supports CUDA up to 10.2" in local.reason
    assert "L4T 32.7.1" in candidate(plan_of(jetson(l4t="32.7.1", cuda="10.2"), python="3.11"), "cuda").reason


# -- local ggml builds obey the published builds' rules --------------------------------------------
def test_kepler_gets_no_local_cuda_build():
    report = machine(nvidia(name="Tesla K80", cc="3.7", cuda="11.4", driver="470.57.02", vram=12), apis={"cuda": [0]})
    plan = plan_of(report, "ggml", manifests=Manifests.builtin())
    local = candidate(plan, "local-cuda")
    assert local.code == "kernels" and "Kepler, compute capability 3.7" in local.reason and "starts at compute capability 5.0" in local.reason
    assert plan.build is not None and plan.build.backend == "cpu"


def test_a_cuda10_driver_gets_no_local_cuda_build_and_says_the_minimum():
    plan = plan_of(replay("linux-nvidia-4x-titanx-pascal-418"), "ggml")
    assert plan.build is None and plan.backend == "cpu"
    assert "need a driver of the CUDA 11 family or newer (>= 450.80.02 on Linux)" in candidate(plan, "local-cuda").reason


def test_no_cuda_version_at_all_gets_no_local_cuda_build():
    report = machine(nvidia(cuda="", driver=""), apis={"cuda": [0]})
    plan = plan_of(report, "ggml", manifests=Manifests.builtin())
    assert "reported no CUDA version" in candidate(plan, "local-cuda").reason and plan.build.backend == "cpu"


def test_gfx803_gets_neither_a_published_nor_a_local_rocm_build():
    plan = plan_of(replay("i11p-linux-amd-ellesmere-gfx803"), "ggml")
    assert plan.backend == "cpu" and plan.build is None
    assert "gfx803" in candidate(plan, "local-rocm").reason and "no current ROCm release" in candidate(plan, "local-rocm").reason
    assert plan_of(replay("i11p-linux-amd-ellesmere-gfx803"), python="3.11").backend == "cpu"


def test_local_builds_fall_back_cuda_rocm_vulkan_cpu_with_each_reason():
    kepler = nvidia(0, name="Tesla K40", cc="3.5", cuda="11.4", driver="470.57.02", vram=12)
    polaris = amd(1, name="AMD Radeon RX 580", gfx="gfx803", vram=8)
    report = machine(kepler, polaris, apis={"cuda": [0], "rocm": [1], "vulkan": [1]})
    plan = plan_of(report, "ggml", manifests=Manifests.builtin())
    assert plan.status == "needs-build" and plan.build.backend == "vulkan" and plan.build.gpus == [1]
    rejected = [c.name for c in plan.candidates if c.name.startswith("local-")]
    assert rejected == ["local-cuda", "local-rocm"]
    # a driver that offers only Vulkan 1.1 cannot run ggml's Vulkan backend (needs 1.2): the CPU is left
    next(a for a in report.apis if a.name == "vulkan").version = "1.1.70"
    plan = plan_of(report, "ggml", manifests=Manifests.builtin())
    assert plan.build.backend == "cpu"
    assert "needs Vulkan 1.2" in candidate(plan, "local-vulkan").reason


def test_maxwell_local_build_names_the_cuda12_toolkit():
    report = machine(nvidia(name="NVIDIA GeForce GTX 970", cc="5.2", vram=4), apis={"cuda": [0]})
    plan = plan_of(report, "ggml", manifests=Manifests.builtin())
    assert plan.build.backend == "cuda" and plan.build.properties["cuda_toolkit"] == "12.x"


# -- one report per problem; hints within what the GPU can run -----------------------------------------
def test_identical_gpus_kept_apart_get_one_rejection_with_the_gpu_list():
    # the same card twice, reported with slightly different memory (the grouping keeps them apart)
    a = nvidia(0, name="NVIDIA GeForce GTX 1060 6GB", cc="6.1", cuda="", driver="", vram=6, driver_name="nouveau")
    b = nvidia(1, name="NVIDIA GeForce GTX 1060 6GB", cc="6.1", cuda="", driver="", vram=6, driver_name="nouveau")
    b.vram_total = (a.vram_total or 0) - 2 * 1024 * 1024
    plan = plan_of(machine(a, b, apis={}), python="3.11")
    cuda = [c for c in plan.candidates if c.name == "cuda"]
    assert len(cuda) == 1 and cuda[0].gpus == [0, 1]
    assert cuda[0].reason.startswith("cuda rejected: GPUs 0-1 2x NVIDIA GeForce GTX 1060 6GB runs the open-source nouveau driver")
    old = plan_of(machine(nvidia(0, name="TITAN X (Pascal)", cc="6.1", cuda="10.1", driver="418.39", vram=12),
                          nvidia(1, name="TITAN X (Pascal)", cc="6.1", cuda="10.1", driver="418.39", vram=11)), python="3.11")
    cu126 = [c for c in old.candidates if c.name == "cu126"]
    assert len(cu126) == 1 and cu126[0].gpus == [0, 1]


def test_driver_hints_stay_within_the_gpus_last_driver_branch():
    k80 = machine(nvidia(name="Tesla K80", cc="3.7", cuda="10.1", driver="418.39", vram=12))
    reason = candidate(plan_of(k80, python="3.11"), "cu118").reason
    assert "update the NVIDIA driver to 450.80.02 or newer, at most the R470 branch (the last for Kepler GPUs)" in reason
    # strict policy: CUDA 11.8 needs 520.61.05, past Kepler's R470 branch: no driver it can run is new enough
    strict = resolve(machine(nvidia(name="Tesla K80", cc="3.7", cuda="11.4", driver="470.57.02", vram=12)),
                     Request(stack="torch", python="3.11", cuda_driver="strict"), loaded_manifests())
    assert "no driver this GPU can run is new enough: Kepler GPUs are supported up to the R470 driver branch" in candidate(strict, "cu118").reason
    maxwell = plan_of(machine(nvidia(name="NVIDIA GeForce GTX 970", cc="5.2", cuda="11.4", driver="470.57.02", vram=4)), python="3.11")
    assert "at most the R580 branch (the last for Maxwell GPUs)" in candidate(maxwell, "cu126").reason
    assert "R580" in candidate(plan_of(replay("linux-nvidia-4x-titanx-pascal-418"), "ggml"), "local-cuda").reason


def test_a_gpu_older_than_kepler_is_past_support():
    assert "past NVIDIA's driver support" in driver_hint("2.1", "450.80.02")
    assert driver_hint("8.9", "580.65.06") == "update the NVIDIA driver to 580.65.06 or newer"


# -- torch 2.15: PyPI's own wheels confirmed, index variants marked unverified -------------------------
def test_torch_2_15_linux_is_pypis_cu132_wheel():
    plan = plan_of(machine(nvidia(name="NVIDIA GeForce RTX 4090", cc="8.9", cuda="13.2", driver="595.45.04")), python="3.12")
    assert (plan.variant, plan.torch_version, plan.index_url) == ("cu132", "2.15", "")
    assert not any("unverified" in n for n in plan.notes)
    assert plan_of(machine(nvidia()), python="3.10").torch_version == "2.14"  # 2.15 has no cp310 wheels


def test_an_unverified_index_variant_is_chosen_only_when_asked_for_and_said_in_the_plan():
    """Issue 42, item 6: the default plan picked 2.15, which the plan itself marked "publication
    unverified": the default is the newest confirmed release, and the one passed over is named."""
    plan = plan_of(machine(nvidia(), os="windows"), python="3.12")
    assert plan.torch_version == "2.14" and "[publication unverified]" not in plan.chosen.reason
    assert "not newer: the publication of torch 2.15 is unverified (ask for torch==2.15.* to use it)" in plan.chosen.reason
    assert not any(n.startswith("unverified:") for n in plan.notes)
    asked = plan_of(machine(nvidia(), os="windows"), "torch", "torch==2.15.*", python="3.12")
    assert asked.torch_version == "2.15" and "[publication unverified]" in asked.chosen.reason
    note = next(n for n in asked.notes if n.startswith("unverified:"))
    assert f"torch 2.15 publishes {asked.variant} for windows-x86_64 is not confirmed" in note and "ask for torch<2.15" in note
    assert "chosen because your requirement excludes every release whose publication is confirmed" in note


def test_a_companion_with_no_known_release_excludes_that_line():
    plan = plan_of(machine(nvidia()), "torch", "torchvision", python="3.12")
    assert plan.torch_version == "2.14" and "torchvision==0.29.*" in plan.packages
    assert "no torchvision is known for torch 2.15" in candidate(plan, "cu132").reason


# -- the same driver rule for published ggml CUDA builds ---------------------------------------------
def test_ggml_cuda12_build_runs_on_an_r535_driver_through_minor_version_compatibility():
    report = machine(nvidia(name="NVIDIA GeForce RTX 2060", cc="7.5", cuda="12.2", driver="537.13", vram=6), os="windows")
    plan = plan_of(report, "ggml")
    assert (plan.backend, plan.variant, plan.build) == ("cuda", "win-x64-cuda12", None)
    old = plan_of(machine(nvidia(name="NVIDIA GeForce RTX 2060", cc="7.5", cuda="11.4", driver="472.12", vram=6), os="windows"), "ggml")
    assert "win-x64-cuda12 needs a CUDA 12.x driver (>= 527.41 on Windows" in candidate(old, "win-x64-cuda12").reason


def test_ggml_ptx_only_gpu_needs_the_full_toolkit_driver():
    # GB10 (12.1): the build's 12.0a code is arch-specific, so it runs compute_100 PTX, which a 12.4 driver cannot JIT
    report = machine(nvidia(name="NVIDIA GB10", cc="12.1", cuda="12.4", driver="551.61", vram=128), os="windows")
    reason = candidate(plan_of(report, "ggml"), "win-x64-cuda12").reason
    assert "needs CUDA 12.8 (driver >= 570.65 on Windows), because it reaches this GPU only through PTX" in reason


def test_a_kepler_on_nouveau_is_told_its_last_driver_branch():
    report = machine(nvidia(name="NVIDIA GeForce GTX 780", cc="3.5", cuda="", driver="", vram=3, driver_name="nouveau"), apis={})
    # issue 27: no torch CUDA wheel has sm_35 kernels, so that leads; the last driver branch is still named
    reason = candidate(plan_of(report, python="3.11"), "cuda").reason
    assert reason.startswith("cuda rejected: no torch CUDA wheel has kernels for sm_35") and "R470 is the last driver branch for Kepler GPUs" in reason
