"""Each rule the resolver must hold, on machines built to show it."""
from __future__ import annotations

import copy
import json

import pytest

from accelstack.errors import UsageError
from accelstack.hardware.report import GPU, CPUInfo, HardwareReport, MemoryInfo, OSInfo
from accelstack.manifests import Manifests, Plan, Request, load_manifest, resolve
from accelstack.manifests.torch_matrix import builtin_torch_matrix
from accelstack.serde import from_dict, to_dict

from ._factory import AVX2, AVX512, REPO, amd, apple, candidate, intel, loaded_manifests, machine, nvidia, plan_of


def names(plan: Plan, accepted=None):
    return [c.name for c in plan.candidates if accepted is None or c.accepted == accepted]


# -- CUDA before DirectML and Vulkan on an NVIDIA machine ------------------------------------------
def test_cuda_before_directml_on_windows_nvidia():
    plan = plan_of(machine(nvidia(), os="windows"))
    assert plan.backend == "cuda" and plan.chosen.name == "cu130"
    dml = candidate(plan, "directml")
    assert dml.accepted and not dml.chosen and "CUDA ranks above DirectML" in dml.reason
    order = names(plan)
    assert order.index("cu130") < order.index("directml") < order.index("cpu")


def test_cuda_before_vulkan_for_ggml_on_nvidia():
    plan = plan_of(machine(nvidia(), os="windows"), "ggml")
    assert plan.backend == "cuda" and plan.variant == "win-x64-cuda12"
    assert len(plan.artifacts) == 2 and all(a.urls for a in plan.artifacts)
    vk = candidate(plan, "win-x64-vulkan")
    assert vk.accepted and "CUDA ranks above Vulkan" in vk.reason


def test_old_driver_falls_to_directml_only_after_cuda_is_explained():
    plan = plan_of(machine(nvidia(name="NVIDIA GeForce GTX 1080 Ti", cc="6.1", cuda="10.2", driver="441.66"), os="windows"))
    assert plan.backend == "directml" and plan.packages == ["torch-directml==0.2.5.dev240914"] and plan.index_url == ""
    cu118 = candidate(plan, "cu118")
    assert cu118.code == "driver" and "supports CUDA up to 10.2" in cu118.reason and "update the NVIDIA driver" in cu118.reason
    assert any("no longer developed" in n for n in plan.notes)


# -- the newest torch the driver AND the architecture support ----------------------------------------
def test_driver_limits_the_cuda_variant_with_an_actionable_reason():
    # NVIDIA's minor-version compatibility: a CUDA 12.x wheel with sm_75 code runs on any R525+ driver
    plan = plan_of(machine(nvidia(name="Quadro RTX 4000", cc="7.5", cuda="12.2", driver="535.104.05")))
    assert (plan.variant, plan.torch_version) == ("cu126", "2.14")
    assert "minor-version compatibility" in plan.chosen.reason
    cu130 = candidate(plan, "cu130")
    assert cu130.code == "driver"
    assert cu130.reason == ("cu130 rejected: NVIDIA driver 535.104.05 supports CUDA up to 12.2; cu130 needs a CUDA 13.x driver "
                            "(>= 580.65.06 on Linux, NVIDIA minor-version compatibility); update the NVIDIA driver to 580.65.06 or newer (or use cu126)")
    assert candidate(plan, "cu128").accepted  # also works, with an older torch
    assert "cu126 gives a newer torch (2.14)" in candidate(plan, "cu128").reason


def test_strict_driver_policy_needs_the_full_toolkit_version():
    report = machine(nvidia(name="Quadro RTX 4000", cc="7.5", cuda="12.2", driver="535.104.05"))
    plan = resolve(report, Request(stack="torch", python="3.11", cuda_driver="strict"), loaded_manifests())
    assert (plan.variant, plan.torch_version) == ("cu118", "2.7")  # the newest torch whose full CUDA version the driver runs
    assert candidate(plan, "cu128").reason.startswith(
        "cu128 rejected: NVIDIA driver 535.104.05 supports CUDA up to 12.2; cu128 needs CUDA 12.8 (driver >= 570.26 on Linux)")
    with pytest.raises(UsageError, match="CUDA driver policy"):
        resolve(report, Request(stack="torch", cuda_driver="lenient"), loaded_manifests())


@pytest.mark.parametrize("driver, cuda, os_name, expected", [
    ("525.60.13", "12.0", "linux", ("cu126", "2.14")),   # the 12.x floor on Linux
    ("555.42.06", "12.5", "linux", ("cu126", "2.14")),
    ("527.41", "12.0", "windows", ("cu126", "2.14")),    # the 12.x floor on Windows
    ("522.06", "11.8", "windows", ("cu118", "2.7")),     # below it: only CUDA 11.x wheels
    ("580.65.06", "13.0", "linux", ("cu132", "2.15")),   # 13.x: 580; 2.15 cu132 is PyPI's own (confirmed) build
])
def test_minor_version_compatibility_per_major(driver, cuda, os_name, expected):
    plan = plan_of(machine(nvidia(name="NVIDIA GeForce RTX 4070", cc="8.9", cuda=cuda, driver=driver, vram=12), os=os_name))
    assert (plan.variant, plan.torch_version) == expected


def test_a_ptx_only_gpu_needs_the_driver_of_the_full_toolkit():
    # a GPU newer than every SASS in the cu130/cu132 wheels reaches them only through 12.0 PTX: the driver's
    # PTX JIT must know the wheel's full CUDA version (13.2 for cu132), minor-version compatibility does not apply
    plan = plan_of(machine(nvidia(name="Future GPU", cc="13.0", cuda="13.0", driver="580.65.06", vram=48)))
    assert plan.variant == "cu130"
    cu132 = candidate(plan, "cu132")
    assert cu132.code == "driver" and "needs CUDA 13.2 (driver >= 595.45.04 on Linux), because it reaches this GPU only through PTX" in cu132.reason


def test_cuda13_needs_r580_and_cu118_quotes_its_own_minimum():
    plan = plan_of(machine(nvidia(name="NVIDIA GeForce RTX 4070", cc="8.9", cuda="12.9", driver="575.57.08", vram=12)))
    assert plan.variant == "cu126" and ">= 580.65.06 on Linux" in candidate(plan, "cu130").reason
    old = plan_of(machine(nvidia(name="NVIDIA GeForce GTX 1080 Ti", cc="6.1", cuda="10.1", driver="418.39", vram=11)))
    assert "cu118 needs a CUDA 11.x driver (>= 450.80.02 on Linux" in candidate(old, "cu118").reason


def test_driver_version_is_used_when_the_driver_reports_no_cuda_version():
    gpu = nvidia(cuda="", driver="560.35.03")
    plan = plan_of(machine(gpu, apis={"cuda": [0]}))
    assert plan.variant == "cu126" and plan.torch_version == "2.14"
    assert "NVIDIA driver 560.35.03 is older than 580.65.06; cu130 needs a CUDA 13.x driver" in candidate(plan, "cu130").reason
    assert candidate(plan, "cu128").accepted  # 12.8 through minor-version compatibility


def test_maxwell_gets_a_build_that_still_has_its_kernels():
    plan = plan_of(machine(nvidia(name="NVIDIA GeForce GTX 970", cc="5.2", vram=4)))
    assert (plan.variant, plan.torch_version) == ("cu126", "2.14")
    cu128 = candidate(plan, "cu128")
    assert cu128.code == "kernels"
    assert cu128.reason == "cu128 rejected: torch 2.7\u20132.11 cu128 builds have no kernels for sm_52 (NVIDIA GeForce GTX 970)"


def test_kepler_is_pinned_to_the_last_torch_with_sm37():
    plan = plan_of(machine(nvidia(name="Tesla K80", cc="3.7", cuda="12.0", driver="525.60.13", vram=12)))
    assert (plan.variant, plan.torch_version) == ("cu118", "2.7")
    assert plan.packages == ["torch==2.7.*"]
    # on its last supported driver (R470, CUDA 11.4) cu118 still runs: 11.x minor-version compatibility (>= 450.80.02)
    old = plan_of(machine(nvidia(name="Tesla K80", cc="3.7", cuda="11.4", driver="470.57.02", vram=12)))
    assert (old.variant, old.torch_version) == ("cu118", "2.7")
    assert candidate(old, "cu126").code == "kernels"


def test_volta_keeps_cu126_and_cu128_stops_at_2_10():
    plan = plan_of(machine(nvidia(name="Tesla V100", cc="7.0", vram=16)))
    assert (plan.variant, plan.torch_version) == ("cu126", "2.14")
    cu128 = candidate(plan, "cu128")
    assert cu128.accepted and cu128.torch_version == "2.10"
    assert "not newer: torch 2.11 cu128 builds have no kernels for sm_70" in cu128.reason
    forced = plan_of(machine(nvidia(name="Tesla V100", cc="7.0", vram=16)), backend="cu128")
    assert (forced.variant, forced.torch_version) == ("cu128", "2.10")


def test_blackwell_needs_cu128_or_newer():
    plan = plan_of(machine(nvidia(name="NVIDIA GeForce RTX 5090", cc="12.0", vram=32)))
    assert plan.variant == "cu132" and plan.torch_version == "2.15"
    assert candidate(plan, "cu126").code == "kernels"


def test_ptx_only_match_is_accepted_and_said():
    # GB10 (12.1) runs the 12.0 cubin; a made-up 13.0 GPU only reaches the Linux cu130 build through PTX
    plan = plan_of(machine(nvidia(name="Future GPU", cc="13.0", vram=48)))
    assert plan.variant == "cu130" and "PTX" in plan.chosen.reason
    assert any("PTX" in n for n in plan.notes)


# -- user pins narrow the choice; impossible requests are said so --------------------------------
def test_pin_selects_the_release_line_and_is_kept_in_the_install_command():
    plan = plan_of(machine(nvidia()), "torch", "torch==2.6.*")
    assert (plan.variant, plan.torch_version, plan.ok) == ("cu126", "2.6", True)
    assert plan.packages == ["torch==2.6.*"]
    assert plan.commands[0].argv == ["{python}", "-m", "pip", "install", "torch==2.6.*", "--index-url",
                                     "https://download.pytorch.org/whl/cu126"]
    assert plan.uv_commands[0].argv[:5] == ["uv", "pip", "install", "--python", "{python}"]


def test_companion_pin_narrows_torch():
    plan = plan_of(machine(nvidia()), "torch", "torchvision<0.22")
    assert plan.torch_version == "2.6"
    assert plan.packages == ["torch==2.6.*", "torchvision==0.21.*,<0.22"]
    assert "your requirement torchvision<0.22 excludes the torchvision that goes with torch 2.9\u20132.14" in candidate(plan, "cu130").reason


def test_torch_below_2_7_on_a_50xx_card_is_impossible_and_says_what_works():
    plan = plan_of(machine(nvidia(name="NVIDIA GeForce RTX 5090", cc="12.0", vram=32)), "torch", "torch<2.7")
    assert not plan.ok and plan.backend == "cpu" and plan.torch_version == "2.6"
    [conflict] = plan.conflicts
    assert conflict.startswith("torch<2.7 leaves no CUDA build that runs on GPU 0 NVIDIA GeForce RTX 5090")
    assert "What would work: torch 2.15 cu132, torch 2.15 cu130, torch 2.11 cu128, torch 2.8 cu129" in conflict
    assert "Using cpu (torch 2.6) instead" in conflict
    assert candidate(plan, "cu126").code == "kernels" and candidate(plan, "cu128").code == "requirement"


def test_pin_that_moves_the_work_to_another_gpu_is_a_conflict_too():
    report = machine(nvidia(0, name="NVIDIA GeForce RTX 5090", cc="12.0", vram=32), nvidia(1, vram=24, bus_id="0000:02:00.0"))
    report.gpus[0].bus_id = "0000:01:00.0"
    plan = plan_of(report, "torch", "torch<2.7")
    assert plan.gpus == [1] and plan.variant == "cu126"
    assert plan.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1"}
    assert plan.conflicts and "GPU 0 NVIDIA GeForce RTX 5090" in plan.conflicts[0]


def test_bad_requirement_is_a_usage_error():
    with pytest.raises(UsageError):
        plan_of(machine(nvidia()), "torch", "torch>>2")


def test_other_requirements_are_installed_from_pypi_after_torch():
    plan = plan_of(machine(nvidia()), "torch", "numpy<2")
    assert plan.commands[1].argv == ["{python}", "-m", "pip", "install", "numpy<2"]


# -- Python version limits torch versions -----------------------------------------------------------
@pytest.mark.parametrize("python, line", [("3.9", "2.8"), ("3.8", "2.4"), ("3.10", "2.14"), ("3.12", "2.15"), ("3.15", "2.15"), ("3.16", None)])
def test_python_version_limits_torch(python, line):
    plan = plan_of(machine(nvidia()), python=python)
    if line is None:
        assert plan.status == "unsatisfiable" and "supports Python up to 3.15" in candidate(plan, "cpu").reason
    else:
        assert plan.torch_version == line


def test_python_of_the_report_is_the_default_and_request_overrides_it():
    report = machine(nvidia(), python="3.9")
    assert plan_of(report).torch_version == "2.8"
    assert plan_of(report, python="3.11").torch_version == "2.15"


def test_old_python_on_blackwell_is_a_conflict_with_the_python_needed():
    plan = plan_of(machine(nvidia(name="NVIDIA GeForce RTX 5090", cc="12.0", vram=32)), python="3.8")
    assert plan.backend == "cpu" and plan.conflicts
    assert "Python 3.8 leaves no CUDA build" in plan.conflicts[0] and "torch 2.8 cu129 (Python >=3.9,<3.14)" in plan.conflicts[0]


# -- mixed vendors choose the best device and say why -------------------------------------------------
def test_nvidia_dgpu_over_intel_igpu():
    plan = plan_of(machine(intel(0, name="Intel UHD Graphics 770", generation="Xe-LP (Gen12)", kind="integrated", vram=None), nvidia(1)))
    assert plan.backend == "cuda" and plan.gpus == [1]
    assert "GPU 0 Intel UHD Graphics 770: no torch build runs on it" in plan.device_reason
    assert candidate(plan, "xpu").code == "device"


def test_bigger_amd_card_beats_small_nvidia_card_and_says_why():
    plan = plan_of(machine(amd(0, vram=24), nvidia(1, name="NVIDIA GeForce GTX 1050", cc="6.1", vram=2)))
    assert plan.backend == "rocm" and plan.gpus == [0]
    assert "GPU 1 NVIDIA GeForce GTX 1050: ranks lower (more memory (24 GiB vs 2 GiB))" in plan.device_reason
    cu126 = candidate(plan, "cu126", gpu=1)
    assert cu126.accepted and "GPU 0 AMD Radeon RX 7900 XTX is preferred" in cu126.reason


def test_discrete_arc_beats_integrated_radeon_on_windows():
    report = machine(amd(0, name="AMD Radeon(TM) Graphics", gfx="gfx1036", kind="integrated", vram=None),
                     intel(1, name="Intel(R) Arc(TM) B580 Graphics", generation="Xe2-HPG (Battlemage)", vram=12), os="windows")
    plan = plan_of(report)
    assert (plan.backend, plan.gpus) == ("xpu", [1])
    assert plan_of(report, "ggml").gpus == [1]
    assert plan_of(report, "ggml").env == {"GGML_VK_VISIBLE_DEVICES": "1"}


def test_two_nvidia_cards_without_a_common_build_hide_the_other_one():
    report = machine(nvidia(0, name="NVIDIA GeForce RTX 5090", cc="12.0", vram=32, bus_id="0000:01:00.0"),
                     nvidia(1, name="NVIDIA GeForce GTX 1080", cc="6.1", vram=8, bus_id="0000:02:00.0"))
    plan = plan_of(report)
    assert plan.gpus == [0] and plan.variant == "cu132"
    assert plan.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0"}


def test_two_nvidia_cards_sharing_a_build_use_both():
    report = machine(nvidia(0, name="NVIDIA GeForce RTX 5090", cc="12.0", vram=32), nvidia(1, vram=24))
    plan = plan_of(report)
    assert plan.gpus == [0, 1] and plan.env == {}
    assert "GPU 1 NVIDIA GeForce RTX 4090: used as well" in plan.device_reason
    report = machine(nvidia(0, name="NVIDIA TITAN V", cc="7.0", vram=12), nvidia(1, name="NVIDIA RTX 5880 Ada Generation", cc="8.9", vram=48))
    plan = plan_of(report, python="3.11")  # the newest torch first: 2.15 has no cu126, so cu132 runs on the Ada card only
    assert (plan.variant, plan.gpus) == ("cu132", [1])
    both = plan_of(report, "torch", "torch<2.15", python="3.11")  # cu130 would drop the TITAN V; cu126 of the same torch keeps both
    assert (both.variant, both.gpus) == ("cu126", [1, 0])


# -- AMD: gfx targets, overrides, visible devices ----------------------------------------------------
def test_rdna2_discrete_uses_the_override_where_the_rocm_allows_it():
    # torch < 2.11: before AMD's own gfx1031 build (rocm-amd, chosen otherwise: test_amd_linux_rocm.py)
    plan = plan_of(machine(amd(name="AMD Radeon RX 6700 XT", gfx="gfx1031", vram=12)), "torch", "torch<2.11")
    assert (plan.variant, plan.torch_version) == ("rocm7.1", "2.10")
    assert plan.env == {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}
    assert "this ROCm fails when HSA_OVERRIDE_GFX_VERSION is set" in candidate(plan, "rocm7.14").reason


def test_integrated_rdna2_is_refused_with_the_reason():
    # PyTorch's wheels refuse it; AMD's index builds gfx1036 itself (test_amd_linux_rocm.py)
    plan = plan_of(machine(amd(name="AMD Radeon 680M", gfx="gfx1036", kind="integrated", vram=None)))
    assert plan.variant == "rocm-amd" and "HSA_OVERRIDE_GFX_VERSION" not in plan.env
    reason = candidate(plan, "rocm6.2").reason
    assert reason == ("rocm6.2 rejected: gfx1036 (AMD Radeon 680M) is not supported by torch 2.5 rocm6.2; "
                      "HSA_OVERRIDE_GFX_VERSION cannot map an integrated RDNA2 reliably")


def test_gfx906_gets_the_last_rocm_that_works_on_it():
    plan = plan_of(machine(amd(name="AMD Radeon VII", gfx="gfx906", vram=16)))
    assert (plan.variant, plan.torch_version) == ("rocm6.3", "2.8")
    assert "rocBLAS in ROCm 6.4+ ships no Tensile kernels for gfx906" in candidate(plan, "rocm6.4").reason


def test_laptop_dgpu_with_override_hides_the_igpu():
    report = machine(amd(0, name="AMD Radeon RX 6500M", gfx="gfx1034", vram=4),
                     amd(1, name="AMD Radeon Graphics", gfx="gfx1035", kind="integrated", vram=None))
    plan = plan_of(report, "torch", "torch<2.11")  # before AMD's own gfx1034 build
    assert plan.gpus == [0]
    assert plan.env == {"HSA_OVERRIDE_GFX_VERSION": "10.3.0", "HIP_VISIBLE_DEVICES": "0"}
    plan = plan_of(report)  # AMD's own build: gfx1034's code, no override, the iGPU still hidden
    assert (plan.variant, plan.gpus, plan.env) == ("rocm-amd", [0], {"HIP_VISIBLE_DEVICES": "0"})


def test_rocm_unreachable_says_what_to_do():
    plan = plan_of(machine(amd(), unusable=("rocm",)))
    assert plan.backend == "cpu"
    assert "render and video groups" in candidate(plan, "rocm").reason


# -- unknown or unsupported hardware falls back to CPU, never raises ---------------------------------------
@pytest.mark.parametrize(
    "report",
    [
        machine(nvidia(name="NVIDIA GeForce GTX 1060 6GB", cc="6.1", cuda="", driver="", driver_name="nouveau"), apis={}),
        machine(nvidia(cc="", cuda="", driver="")),
        machine(amd(gfx="")),
        machine(amd(name="AMD Radeon RX 580", gfx="gfx803", vram=8)),  # RDNA1 (gfx1010) has AMD's own build now
        machine(GPU(index=0, vendor="other", name="ASPEED Graphics Family", kind="integrated")),
        machine(intel(name="Intel HD Graphics 4600", generation="Gen7.5 (Haswell)", kind="integrated", vram=None)),
        machine(nvidia(), os="macos", arch="x86_64", version="10.15.7"),
    ],
    ids=["nouveau", "nvidia-no-facts", "amd-no-gfx", "polaris", "other-vendor", "old-intel", "nvidia-on-mac"],
)
def test_unsupported_gpus_fall_back_to_cpu_with_a_reason(report):
    plan = plan_of(report)
    assert plan.backend == "cpu" and plan.status == "ready"
    gpu_candidates = [c for c in plan.candidates if c.backend != "cpu"]
    assert all(not c.accepted and c.reason for c in gpu_candidates)


def test_nouveau_reason_says_install_the_driver():
    plan = plan_of(machine(nvidia(cc="6.1", cuda="", driver="", driver_name="nouveau"), apis={}))
    assert "nouveau" in candidate(plan, "cuda").reason and "install it" in candidate(plan, "cuda").reason


@pytest.mark.parametrize(
    "report",
    [
        HardwareReport(os=OSInfo(name=""), cpu=CPUInfo(), memory=MemoryInfo()),
        machine(os="linux", arch="riscv64"),
        machine(nvidia(), libc="musl", glibc="1.2.4"),
        machine(os="freebsd"),
    ],
    ids=["empty-report", "riscv64", "musl", "freebsd"],
)
@pytest.mark.parametrize("stack", ["torch", "ggml"])
def test_nothing_runs_is_a_plan_not_an_exception(report, stack):
    plan = plan_of(report, stack)
    assert plan.status in ("unsatisfiable", "needs-build", "ready")
    assert plan.summary and all(c.reason for c in plan.candidates)
    if stack == "torch":
        assert plan.status == "unsatisfiable" and not plan.ok


def test_glibc_too_old_limits_torch_to_2_6():
    plan = plan_of(machine(nvidia(), glibc="2.17"))
    assert (plan.variant, plan.torch_version) == ("cu124", "2.6")
    assert "wheels need glibc >= 2.28; this system has glibc 2.17" in candidate(plan, "cu126").reason


# -- Apple, Intel ------------------------------------------------------------------------------------
def test_mps_by_macos_version():
    assert plan_of(machine(apple(), os="macos", arch="arm64", version="14.4")).torch_version == "2.15"
    plan = plan_of(machine(apple(name="Apple M1"), os="macos", arch="arm64", version="13.6"))
    assert (plan.variant, plan.torch_version) == ("mps", "2.8")
    assert plan.env == {"PYTORCH_ENABLE_MPS_FALLBACK": "1"} and plan.index_url == ""
    assert "MPS builds need macOS 14.0 or newer; this Mac runs macOS 13.6" in plan.chosen.reason


def test_intel_mac_gets_the_last_x86_64_torch():
    vega = amd(name="Radeon Pro Vega 64", gfx="gfx900", vram=16)
    plan = plan_of(machine(vega, os="macos", arch="x86_64", version="13.6"))
    assert (plan.variant, plan.torch_version) == ("mps", "2.2")  # 2.2 x86_64 wheels drive AMD GPUs through MPS
    old = plan_of(machine(vega, os="macos", arch="x86_64", version="12.1"))
    assert (old.variant, old.torch_version) == ("cpu", "2.2")
    assert "MPS builds need macOS 12.3 or newer; this Mac runs macOS 12.1" in candidate(old, "mps").reason
    iris = plan_of(machine(intel(name="Intel Iris Plus Graphics", generation="Gen11 (Ice Lake)", kind="integrated", vram=None),
                           os="macos", arch="x86_64", version="13.6"))
    assert iris.variant == "cpu" and candidate(iris, "mps").code == "device"


def test_xpu_for_arc_and_zero_mask_when_an_igpu_is_also_xpu():
    report = machine(intel(0, name="Intel Arc Graphics", generation="Xe-LPG (Meteor/Arrow Lake)", kind="integrated", vram=None),
                     intel(1, name="Intel Arc A770"))
    plan = plan_of(report)
    assert (plan.backend, plan.gpus) == ("xpu", [1])
    assert plan.env == {"ZE_AFFINITY_MASK": "1"}


# -- ggml: CPU variants by features, GPU backends, local builds ---------------------------------------
@pytest.mark.parametrize(
    "features, variant",
    [([], "linux-x64-cpu-noavx"), (["sse", "sse2", "ssse3"], "linux-x64-cpu-noavx"), (["sse4.2", "avx"], "linux-x64-cpu-avx"),
     (AVX2, "linux-x64-cpu-avx2"), (AVX512, "linux-x64-cpu-avx512")],
)
def test_ggml_cpu_variant_by_cpu_features(features, variant):
    plan = plan_of(machine(features=features, cpu_model="Pentium(R) Dual-Core CPU E5700"), "ggml")
    assert plan.variant == variant and plan.backend == "cpu"
    if variant.endswith("noavx") and features:
        assert "lacks avx" in candidate(plan, "linux-x64-cpu-avx").reason


def test_ggml_vulkan_points_at_the_discrete_gpu():
    report = machine(intel(0, name="Intel UHD Graphics 630", generation="Gen9.5", kind="integrated", vram=None),
                     nvidia(1, name="NVIDIA GeForce RTX 2060", cc="7.5", cuda="11.4", driver="472.12", vram=6), os="windows")
    plan = plan_of(report, "ggml")
    assert (plan.backend, plan.gpus) == ("vulkan", [1])
    assert plan.env == {"GGML_VK_VISIBLE_DEVICES": "1"}
    assert plan.build is not None and plan.build.backend == "cuda" and plan.build.properties["sm"] == "7.5"
    assert any("a local CUDA build would do better" in n for n in plan.notes)


def test_ggml_vulkan_version_is_read_from_the_driver_text():
    """The Vulkan version a report carries is the driver's text: compared by its leading number, never a crash."""
    def vulkan_plan(text):
        report = machine(intel(0, name="Intel UHD Graphics 630", generation="Gen9.5", kind="integrated", vram=None),
                         nvidia(1, name="NVIDIA GeForce RTX 2060", cc="7.5", cuda="11.4", driver="472.12", vram=6), os="windows")
        next(a for a in report.apis if a.name == "vulkan").version = text
        return plan_of(report, "ggml")

    assert vulkan_plan("1.3.275 (NVIDIA 472.12)").backend == "vulkan"
    old = vulkan_plan("1.1.130 (an old driver)")
    assert old.backend != "vulkan" and "needs Vulkan 1.2; the driver offers Vulkan 1.1.130" in candidate(old, "win-x64-vulkan").reason
    assert vulkan_plan("unknown").backend == "vulkan"  # no version to compare: the driver's presence decides


def test_ggml_arch_specific_sm_120a_does_not_run_on_12_1():
    plan = plan_of(machine(nvidia(name="NVIDIA GB10", cc="12.1", vram=128), os="windows"), "ggml")
    cuda = candidate(plan, "win-x64-cuda12")
    assert cuda.accepted and "compute_100 (PTX" in cuda.reason  # 12.0a SASS is not forward compatible: PTX 10.0 is


def test_ggml_rocm_gfx_list_and_no_artifact_build_spec():
    plan = plan_of(machine(amd(name="AMD Radeon 780M", gfx="gfx1103", kind="integrated", vram=None)), "ggml")
    assert plan.variant == "linux-x64-rocm"
    bare = plan_of(machine(amd()), "ggml", manifests=Manifests.builtin())
    assert bare.status == "needs-build" and bare.backend == "rocm" and bare.gpus == [0]
    assert bare.build.properties["gfx"] == "gfx1100" and bare.artifacts == []
    assert "no ggml manifest was given" in candidate(bare, "rocm").reason


def test_ggml_jetson_needs_a_cuda_build():
    report = machine(nvidia(name="NVIDIA Jetson Orin NX", cc="8.7", cuda="11.4", driver="35.3.1", kind="integrated", vram=None,
                            driver_name="nvgpu"), arch="arm64", features=[], apis={"cuda": [0]})
    plan = plan_of(report, "ggml")
    assert plan.status == "needs-build" and plan.backend == "cuda"
    assert plan.build.properties["sm"] == "8.7" and plan.build.properties["cuda_max"] == "11.4"
    assert "nvidia_driver" in plan.build.properties  # L4T version kept as a fact, never compared as a desktop driver


# -- forced backend ------------------------------------------------------------------------------------
def test_forced_backend_and_variant():
    report = machine(nvidia())
    assert plan_of(report, backend="cpu").backend == "cpu"
    assert plan_of(report, "ggml", backend="vulkan").variant == "linux-x64-vulkan"
    assert (plan_of(report, backend="cu126").variant, plan_of(report, backend="CU126").variant) == ("cu126", "cu126")
    plan = plan_of(report, backend="vulkan")
    assert plan.status == "unsatisfiable" and "torch backends: cuda, rocm, xpu, mps, directml, cpu" in plan.summary
    assert all(c.code == "forced-backend" for c in plan.candidates)


# -- purity, determinism, data-driven -------------------------------------------------------------------
def test_resolve_is_deterministic_and_the_plan_round_trips():
    report = machine(nvidia(0, name="NVIDIA GeForce RTX 5090", cc="12.0", vram=32), nvidia(1), os="windows")
    before = json.dumps(to_dict(report), sort_keys=True)
    a = plan_of(report, "torch", "torchvision<0.25")
    b = plan_of(copy.deepcopy(report), "torch", "torchvision<0.25")
    assert to_dict(a) == to_dict(b)
    assert json.dumps(to_dict(report), sort_keys=True) == before  # the report is not modified
    assert from_dict(Plan, json.loads(json.dumps(to_dict(a)))) == a
    g = plan_of(report, "ggml")
    assert from_dict(Plan, json.loads(json.dumps(to_dict(g)))) == g


def test_plan_ok_is_derived_and_still_in_json():
    plan = plan_of(machine(nvidia(name="NVIDIA GeForce RTX 4070", cc="8.9", vram=12)), "torch")
    doc = to_dict(plan)
    assert doc["ok"] is True and plan.ok
    plan.conflicts = ["torch<2 leaves no CUDA build"]
    assert not plan.ok and to_dict(plan)["ok"] is False
    doc["ok"] = False  # a stored "ok" (old JSON, or edited) is ignored: ok follows status and conflicts
    assert from_dict(Plan, doc).ok
    assert not from_dict(Plan, {**doc, "status": "needs-build"}).ok


def test_chosen_is_the_first_accepted_candidate():
    for report in (machine(nvidia()), machine(amd(0), nvidia(1, vram=8)), machine(apple(), os="macos", arch="arm64")):
        for stack in ("torch", "ggml"):
            plan = plan_of(report, stack)
            first = next(c for c in plan.candidates if c.accepted)
            assert first.chosen and sum(c.chosen for c in plan.candidates) == 1


def test_changing_the_data_changes_the_decision():
    doc = json.loads((REPO / "accelstack" / "manifests" / "data" / "torch.json").read_text())
    for r in doc["releases"]:
        if r["torch"] == "2.15":
            r["variants"] = [v for v in r["variants"] if v["backend"] != "cuda"]
        if r["torch"] == "2.14":
            r["variants"] = [v for v in r["variants"] if v["name"] not in ("cu130", "cu132")]
    matrix = load_manifest(json.dumps(doc).encode(), check_expiry=False)
    plan = resolve(machine(nvidia()), Request(stack="torch", python="3.11"), Manifests(torch=matrix))
    assert (plan.variant, plan.torch_version) == ("cu126", "2.14")
    # and an arch list edited in the data moves it again
    for r in doc["releases"]:
        for v in r["variants"]:
            if v["name"] == "cu126":
                v["platforms"]["linux-x86_64"]["sm"] = ["9.0"]
    matrix = load_manifest(json.dumps(doc).encode(), check_expiry=False)
    plan = resolve(machine(nvidia()), Request(stack="torch", python="3.11"), Manifests(torch=matrix))
    assert (plan.variant, plan.torch_version) == ("cu130", "2.13")  # cu130 runs natively on the 13.0 driver: before cu132
    assert "torch 2.6\u20132.14 cu126 builds have no kernels for sm_89" in candidate(plan, "cu126").reason


def test_stale_bundled_matrix_is_used_and_said():
    from datetime import datetime, timezone

    stale = Manifests(torch=builtin_torch_matrix(now=datetime(2100, 1, 1, tzinfo=timezone.utc)))
    plan = resolve(machine(nvidia()), Request(stack="torch"), stale)
    assert plan.variant == "cu132" and any("expired" in n for n in plan.notes)


def test_unknown_stack_and_bad_python_are_usage_errors():
    with pytest.raises(UsageError):
        resolve(machine(), Request(stack="onnx"), Manifests.builtin())
    with pytest.raises(UsageError):
        resolve(machine(), Request(stack="torch", python="three"), Manifests.builtin())


def test_wsl_uses_the_windows_driver_and_allows_directml():
    report = machine(nvidia(name="NVIDIA GeForce RTX 3060 Laptop GPU", cc="8.6", cuda="", driver="546.80", vram=6,
                            driver_name="dxg"), wsl=True, apis={"cuda": [0], "directml": [0]})
    plan = plan_of(report)
    assert (plan.variant, plan.torch_version) == ("cu126", "2.14")  # 12.x minor-version compatibility (>= 527.41 on Windows)
    strict = resolve(report, Request(stack="torch", python="3.11", cuda_driver="strict"), loaded_manifests())
    # 546.80 is below the Windows minimum for CUDA 12.4 (551.61), though above the Linux one (550.54.14)
    assert "NVIDIA driver 546.80 is older than 551.61; cu124 needs CUDA 12.4 (driver >= 551.61 on Windows)" in candidate(strict, "cu124").reason
    assert candidate(plan, "directml").accepted
