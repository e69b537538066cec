"""Issue 27, Linux part: AMD's multi-arch ROCm index (TheRock) for targets PyTorch's own ROCm wheels lack.

On Linux PyTorch's own ROCm wheels win wherever they hold the GPU's target natively (upstream's
build, smaller); AMD's index (``rocm-amd``) is chosen only where they lack it (RDNA1, integrated
RDNA2, the RDNA2 cards PyTorch runs only through HSA_OVERRIDE_GFX_VERSION), and never with the
override. The replayed Linux AMD captures go through detect -> plan; constructed reports (and a
capture given the /dev/kfd it lacked) pin down the rest.
"""
from __future__ import annotations

import copy
import json

import pytest

from accelstack.manifests.errors import ManifestError
from accelstack.manifests.torch_matrix import DATA, builtin_torch_matrix, load_torch_matrix

from ._factory import amd, candidate, machine, plan_of, replay

PYTHON = "3.12"
AMD_INDEX = "https://repo.amd.com/rocm/whl-multi-arch/"
PYTORCH_ROCM = "https://download.pytorch.org/whl/rocm7.14"


def _with_kfd(name):
    """A replayed machine as it would be with /dev/kfd reachable (the render group, or --device=/dev/kfd)."""
    report = copy.deepcopy(replay(name))
    api = next(a for a in report.apis if a.name == "rocm")
    api.usable, api.gpus = True, [g.index for g in report.gpus if g.vendor == "amd"]
    return report


# -- PyTorch's own wheel: the target is compiled in --------------------------------------------------
def test_two_rx7900xtx_keep_pytorchs_own_rocm_wheel_and_amds_index_says_why_not():
    plan = plan_of(replay("linux-amd-2x-rx7900xtx-rocm"), python=PYTHON)
    assert (plan.variant, plan.index_url) == ("rocm7.14", PYTORCH_ROCM)
    assert all("[" not in p for p in plan.packages)
    other = candidate(plan, "rocm-amd")
    assert other.accepted and not other.chosen
    assert "not chosen: PyTorch's own rocm7.14 holds gfx1100 natively" in other.reason


@pytest.mark.parametrize("requirement, variant", [("torch<2.15", "rocm7.14"), ("torch<2.14", "rocm7.2")])
def test_pytorchs_wheel_wins_even_where_amd_offers_the_same_torch(requirement, variant):
    plan = plan_of(replay("linux-amd-2x-rx7900xtx-rocm"), "torch", requirement, python=PYTHON)
    assert plan.variant == variant and not candidate(plan, "rocm-amd").chosen


def test_780m_in_docker_keeps_pytorchs_rocm_7_14_which_lists_gfx1103():
    plan = plan_of(replay("linux-amd-780m-apu-docker"), python=PYTHON)
    assert plan.variant == "rocm7.14" and plan.env == {}
    assert candidate(plan, "rocm-amd").accepted


@pytest.mark.parametrize("gfx, name, variant", [
    ("gfx906", "AMD Radeon VII", "rocm6.3"),          # AMD: build-only; PyTorch's rocm6.3 holds it (older torch, tested)
    ("gfx942", "AMD Instinct MI300X", "rocm7.14"),    # release-ready at AMD too: upstream's wheel still wins
    ("gfx950", "AMD Instinct MI355X", "rocm7.14"),
])
def test_targets_pytorch_builds_natively_never_go_to_amds_index(gfx, name, variant):
    plan = plan_of(machine(amd(name=name, gfx=gfx, vram=32)), python=PYTHON)
    assert plan.variant == variant and "HSA_OVERRIDE_GFX_VERSION" not in plan.env


# -- AMD's index: PyTorch's wheels lack the target --------------------------------------------------
def test_680m_with_kfd_gets_amds_native_gfx1035_build_not_an_override():
    plan = plan_of(_with_kfd("linux-amd-680m-apu-proxmox"), python=PYTHON)
    assert (plan.status, plan.backend, plan.variant, plan.torch_version) == ("ready", "rocm", "rocm-amd", "2.14")
    assert plan.packages == ["torch[device-gfx1035]==2.14.*", "torchvision[device-gfx1035]==0.29.*"]
    assert plan.index_url == AMD_INDEX and plan.env == {}
    assert "gfx1035 (AMD Radeon 680M) is compiled in" in candidate(plan, "rocm-amd").reason
    assert "cannot map an integrated RDNA2 reliably" in candidate(plan, "rocm7.14").reason
    assert any("HSA_OVERRIDE_GFX_VERSION" in n and "unset" in n for n in plan.notes)
    assert not any(n.startswith("warning: AMD builds") for n in plan.notes)  # release-ready on Linux


def test_680m_as_captured_has_no_kfd_so_no_rocm_wheel_at_all():
    plan = plan_of(replay("linux-amd-680m-apu-proxmox"), python=PYTHON)
    assert plan.variant == "cpu"
    rocm = candidate(plan, "rocm")
    assert rocm.code == "api" and "/dev/kfd" in rocm.reason


@pytest.mark.parametrize("name", ["linux-amd-rx7900xtx-no-rocm", "container-amd-mi300x-kfd-einval"])
def test_no_kfd_means_neither_wheel(name):
    plan = plan_of(replay(name), python=PYTHON)
    assert plan.variant == "cpu" and candidate(plan, "rocm").code == "api"


def test_polaris_is_in_neither_pytorchs_nor_amds_builds():
    plan = plan_of(replay("i11p-linux-amd-ellesmere-gfx803"), python=PYTHON)
    assert plan.variant == "cpu"
    rocm = candidate(plan, "rocm-amd")
    assert rocm.code == "kernels" and "gfx803" in rocm.reason and "HSA_OVERRIDE_GFX_VERSION" not in plan.env


def test_rdna2_card_gets_its_own_code_from_amd_rather_than_gfx1030_code_through_the_override():
    plan = plan_of(machine(amd(name="AMD Radeon RX 6700 XT", gfx="gfx1031", vram=12)), python=PYTHON)
    assert plan.variant == "rocm-amd" and plan.packages[0] == "torch[device-gfx1031]==2.14.*"
    assert "HSA_OVERRIDE_GFX_VERSION" not in plan.env
    override = candidate(plan, "rocm7.2")
    assert override.accepted and "HSA_OVERRIDE_GFX_VERSION=10.3.0" in override.reason
    assert "not chosen: rocm-amd runs gfx1031's own code" in override.reason


def test_native_beats_the_override_on_the_same_torch_line_too():
    plan = plan_of(machine(amd(name="AMD Radeon RX 6700 XT", gfx="gfx1031", vram=12)), "torch", "torch<2.14", python=PYTHON)
    assert (plan.variant, plan.torch_version, plan.env) == ("rocm-amd", "2.13", {})


@pytest.mark.parametrize("gfx, name", [("gfx1010", "AMD Radeon RX 5700 XT"), ("gfx1036", "AMD Radeon Graphics (Raphael)"),
                                       ("gfx1033", "AMD Custom GPU 0405 (Van Gogh)")])
def test_rdna1_and_integrated_rdna2_refused_by_pytorch_run_amds_build(gfx, name):
    plan = plan_of(machine(amd(name=name, gfx=gfx, vram=8)), python=PYTHON)
    assert plan.variant == "rocm-amd" and plan.packages[0] == f"torch[device-{gfx}]==2.14.*"


def test_a_linux_build_only_target_is_offered_with_a_warning():
    plan = plan_of(machine(amd(name="AMD Radeon 820M", gfx="gfx1153", kind="integrated", vram=0)), python=PYTHON)
    assert plan.variant == "rocm-amd"
    assert any(n.startswith("warning: AMD builds rocm-amd for gfx1153") for n in plan.notes)


def test_asking_for_amds_build_by_name_is_honoured_where_pytorchs_would_win():
    plan = plan_of(machine(amd()), backend="rocm-amd", python=PYTHON)
    assert plan.variant == "rocm-amd" and plan.packages[0] == "torch[device-gfx1100]==2.14.*"


def test_a_gpu_pytorch_covers_and_one_it_lacks_use_pytorchs_wheel_on_the_first():
    report = machine(amd(0), amd(1, name="AMD Radeon Graphics (Raphael)", gfx="gfx1036", kind="integrated", vram=0))
    plan = plan_of(report, python=PYTHON)
    assert plan.variant == "rocm7.14" and plan.gpus == [0] and plan.env == {"HIP_VISIBLE_DEVICES": "0"}


# -- the data ---------------------------------------------------------------------------------------
def test_every_amd_index_entry_has_linux_targets_from_supported_gpus_and_the_ranking_rule():
    matrix = builtin_torch_matrix()
    entries = [r.variant("rocm-amd") for r in matrix.releases if r.variant("rocm-amd")]
    assert entries
    for var in entries:
        assert var is not None and "THEROCK-GPUS-LINUX" in var.sources and "THEROCK-GPUS-LINUX" in matrix.sources
        build = var.platforms["linux-x86_64"]
        assert not set(build.gfx) & set(build.gfx_build_only)
        assert {"gfx942", "gfx1010", "gfx1035", "gfx1200", "gfx1201"} <= set(build.gfx)
        assert {"gfx950", "gfx90a", "gfx908", "gfx906", "gfx900", "gfx1153"} == set(build.gfx_build_only)
        assert build.defer_to_native  # the rule, with its reason
        assert not var.gfx_override  # never HSA_OVERRIDE_GFX_VERSION


def test_the_ranking_rule_on_a_build_that_is_not_rocm_is_refused_with_the_field_named():
    doc = json.loads((DATA / "torch.json").read_bytes())
    cuda = next(v for v in doc["releases"][1]["variants"] if v["backend"] == "cuda")
    cuda["platforms"]["linux-x86_64"]["defer_to_native"] = "why"
    with pytest.raises(ManifestError) as err:
        load_torch_matrix(json.dumps(doc).encode(), check_expiry=False)
    assert "linux-x86_64.defer_to_native" in str(err.value) and "only a ROCm build" in str(err.value)
