"""Issue 27: Radeon on Windows gets AMD's own ROCm builds of PyTorch (TheRock's multi-arch index).

Replayed machines (``windows-amd-*``, made by tests/hardware/make_amd_windows_fixtures.py from public
dumps) go through detect -> plan; constructed reports pin down the rules the captures do not cover
(several GPUs, build-only targets, targets AMD does not build for Windows).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from accelstack.manifests.errors import ManifestError
from accelstack.manifests.plan import PYTHON_PLACEHOLDER
from accelstack.manifests.torch_matrix import DATA, builtin_torch_matrix, load_torch_matrix

from ._factory import amd, candidate, fixture_names, machine, plan_of, replay

PYTHON = "3.12"
INDEX = "https://repo.amd.com/rocm/whl-multi-arch/"
AMD_WINDOWS = [n for n in fixture_names() if n.startswith("windows-amd-")]


def _win_amd(*gpus, **kw):
    return machine(*gpus, os="windows", **kw)


def test_release_ready_target_with_hip7_driver_gets_rocm_torch_from_amds_index():
    plan = plan_of(replay("windows-amd-890m-gfx1150-hip7"), python=PYTHON)
    assert (plan.status, plan.backend, plan.variant, plan.torch_version) == ("ready", "rocm", "rocm-amd", "2.14")
    assert plan.packages == ["torch[device-gfx1150]==2.14.*", "torchvision[device-gfx1150]==0.29.*"]
    assert plan.index_url == INDEX
    assert plan.commands[0].argv == [PYTHON_PLACEHOLDER, "-m", "pip", "install", *plan.packages, "--index-url", INDEX]
    assert "HSA_OVERRIDE_GFX_VERSION" not in plan.env
    # DirectML stays behind it as the fallback, with its unmaintained note only if it is ever chosen
    assert candidate(plan, "directml").accepted and not candidate(plan, "directml").chosen
    names = [c.name for c in plan.candidates]
    assert names.index("rocm-amd") < names.index("directml")
    assert not any("pytorch-triton-rocm" in n for n in plan.notes)  # a Linux-only package


def test_driver_without_hip7_is_a_problem_with_its_fix_not_a_silent_fallback():
    report = replay("windows-amd-rx7900xtx-hip6")
    problem = next(p for p in report.problems if p.code == "amd_hip_runtime_old")
    assert problem.gpus == [0] and problem.action.value == "update-driver"
    assert "amdhip64_6.dll" in problem.message and "Adrenalin" in problem.hint and "26.2.2" in problem.hint
    plan = plan_of(report, python=PYTHON)
    rocm = candidate(plan, "rocm-amd")
    assert not rocm.accepted and rocm.code == "driver"
    assert "amdhip64_7.dll" in rocm.reason and "update the AMD Software: Adrenalin Edition driver to 26.2.2 or newer" in rocm.reason
    assert plan.variant == "directml"
    assert any("no longer developed" in n for n in plan.notes)


def test_build_only_target_is_offered_with_a_warning_and_directml_kept_as_fallback():
    report = copy.deepcopy(replay("windows-amd-rx9070xt-gfx1201-hip6"))
    report.gpus[0].hip_runtime = "7"  # the same RX 9070 XT after the driver update
    plan = plan_of(report, python=PYTHON)
    assert plan.variant == "rocm-amd" and plan.packages[0] == "torch[device-gfx1201]==2.14.*"
    assert any(n.startswith("warning: AMD builds rocm-amd for gfx1201") and "not release-tested" in n for n in plan.notes)
    assert "not release-tested" in candidate(plan, "rocm-amd").reason
    assert candidate(plan, "directml").accepted


def test_build_only_target_with_old_driver_still_gets_the_driver_fix():
    plan = plan_of(replay("windows-amd-rx9070xt-gfx1201-hip6"), python=PYTHON)
    assert candidate(plan, "rocm-amd").code == "driver" and plan.variant == "directml"


@pytest.mark.parametrize("name", AMD_WINDOWS)
def test_directml_is_never_chosen_where_rocm_runs(name):
    plan = plan_of(replay(name), python=PYTHON)
    rocm = [c for c in plan.candidates if c.backend == "rocm" and c.accepted]
    if rocm:
        assert plan.backend == "rocm"
    else:
        assert plan.variant == "directml" and any(c.code == "driver" for c in plan.candidates if c.backend == "rocm")


def test_one_gpu_of_several_sets_hip_visible_devices_and_never_the_override():
    report = _win_amd(amd(0, hip_runtime="7"), amd(1, name="AMD Radeon(TM) Graphics", gfx="gfx1036", kind="integrated", vram=0, hip_runtime="7"))
    plan = plan_of(report, python=PYTHON)
    assert plan.variant == "rocm-amd" and plan.gpus == [0]
    assert plan.env == {"HIP_VISIBLE_DEVICES": "0"}
    assert plan.packages[0] == "torch[device-gfx1100]==2.14.*"


def test_two_discrete_targets_get_one_extra_each():
    report = _win_amd(amd(0, hip_runtime="7"), amd(1, name="AMD Radeon RX 7800 XT", gfx="gfx1101", vram=16, hip_runtime="7"))
    plan = plan_of(report, python=PYTHON)
    assert plan.gpus == [0, 1] and plan.env == {}
    assert plan.packages == ["torch[device-gfx1100,device-gfx1101]==2.14.*", "torchvision[device-gfx1100,device-gfx1101]==0.29.*"]


def test_a_target_amd_does_not_build_for_windows_gets_no_override():
    plan = plan_of(_win_amd(amd(0, name="AMD Radeon RX 580", gfx="gfx803", vram=8, hip_runtime="7")), python=PYTHON)
    rocm = candidate(plan, "rocm-amd")
    assert rocm.code == "kernels" and "built for on Windows" in rocm.reason
    assert plan.variant == "directml" and "HSA_OVERRIDE_GFX_VERSION" not in plan.env


def test_user_pins_are_kept_next_to_the_extra():
    plan = plan_of(_win_amd(amd(0, hip_runtime="7")), "torch", "torch<2.14", "torchvision", python=PYTHON)
    assert plan.packages == ["torch[device-gfx1100]==2.13.*,<2.14", "torchvision[device-gfx1100]==0.28.*"]


def test_linux_keeps_pytorchs_own_rocm_wheels():
    plan = plan_of(machine(amd(0)), python=PYTHON)
    assert plan.variant == "rocm7.14" and all("[" not in p for p in plan.packages)


def _matrix_with(change):
    doc = json.loads((DATA / "torch.json").read_bytes())
    var = next(v for v in doc["releases"][1]["variants"] if v["name"] == "rocm-amd")
    change(var)
    return json.dumps(doc).encode()


@pytest.mark.parametrize("change, words", [
    (lambda v: v.update(device_extra="device-gfx1100"), "must name the GPU's target as {gfx}"),
    (lambda v: v.pop("driver_update"), "driver_update"),
    (lambda v: v["platforms"]["windows-x86_64"].update(gfx_build_only=["rdna4"]), "gfx_build_only"),
])
def test_bad_amd_index_entries_are_refused_with_the_field_named(change, words):
    with pytest.raises(ManifestError) as err:
        load_torch_matrix(_matrix_with(change), check_expiry=False)
    assert words in str(err.value)


def test_every_amd_index_entry_cites_its_sources_and_says_what_is_unconfirmed():
    matrix = builtin_torch_matrix()
    entries = [(r, r.variant("rocm-amd")) for r in matrix.releases if r.variant("rocm-amd")]
    assert [r.torch for r, _ in entries] == ["2.14", "2.13", "2.12", "2.11"]
    for rel, var in entries:
        assert var is not None and var.index == INDEX and var.hip_runtime == "7" and var.device_extra == "device-{gfx}"
        assert set(var.sources) <= set(matrix.sources) and "THEROCK-GPUS" in var.sources
        assert var.unverified  # the index itself was not read: the plan says so
        build = var.platforms["windows-x86_64"]
        assert not set(build.gfx) & set(build.gfx_build_only)
        assert "gfx1100" in build.gfx and "gfx1201" in build.gfx_build_only
        assert "torchvision" in rel.companions


# -- the install's check and its fallback ------------------------------------------------------------
FAKE_CPU_TORCH = '''"""A torch that imports and has no GPU: what a ROCm build looks like on a driver it cannot use."""
from types import SimpleNamespace
__version__ = "2.14.0+rocm7.14.0"
version = SimpleNamespace(cuda=None, hip="7.14.0")
cuda = SimpleNamespace(is_available=lambda: False)
backends = SimpleNamespace(mps=SimpleNamespace(is_available=lambda: False))
def device(kind, index=None):
    return SimpleNamespace(type=kind, index=index)
'''


def test_the_torch_check_demands_the_plans_device_not_whatever_torch_finds(tmp_path):
    """A real subprocess runs the engine's torch check on a torch that sees no GPU: for a ROCm plan
    that is a failure (torch.cuda is the API ROCm builds answer), not a pass on the CPU."""
    import sys

    from accelstack.core.stacks.torch import DRIVER
    from accelstack.installer.transaction import StagedRuntime
    from accelstack.settings import Settings

    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(FAKE_CPU_TORCH)
    staged = StagedRuntime(stack="torch", backend="rocm", path=Path(sys.executable), env={"PYTHONPATH": str(tmp_path)},
                           python=sys.executable)
    report = DRIVER.verifier(Settings.resolve(home=tmp_path / "home"), None, {})(staged, lambda e: None)
    assert not report.ok and "device cuda is not available to this torch" in report.reason


def test_a_rocm_torch_that_fails_its_check_gives_way_to_the_next_candidate():
    """The core's fallback over a real plan of a replayed Radeon: rocm-amd fails its check, the plan's
    next candidate (DirectML) is planned and installed, and the notes say why."""
    from accelstack.core.fallback import install_with_fallback
    from accelstack.core.results import InstallSummary
    from accelstack.core.stacks import driver
    from accelstack.installer.errors import VerifyFailed
    from accelstack.verdict import VerifyReport

    assert driver("torch").retries_candidates
    report = replay("windows-amd-890m-gfx1150-hip7")
    first = plan_of(report, python=PYTHON)
    tried = []

    def attempt(plan):
        tried.append(plan.variant)
        if plan.backend == "rocm":
            raise VerifyFailed("the new runtime does not work on this machine: device cuda is not available to this torch",
                               VerifyReport(ok=False, reason="device cuda is not available to this torch", runtime="python", backend="rocm"))
        return InstallSummary("torch", "rid", True, plan)

    summary = install_with_fallback(first, attempt, lambda variant: plan_of(report, backend=variant, python=PYTHON))
    assert tried == ["rocm-amd", "directml"]
    assert summary.plan.variant == "directml"
    assert summary.notes[0].startswith("rocm-amd (rocm) was abandoned: it failed verify on this machine: device cuda is not available")


# -- ggml on Radeon under Windows ----------------------------------------------------------------------
def test_ggml_uses_rocm_only_with_a_hip7_driver_and_a_listed_target_else_vulkan():
    ready = plan_of(replay("windows-amd-890m-gfx1150-hip7"), "ggml")
    assert ready.backend == "rocm" and "gfx1150 is compiled in" in candidate(ready, ready.variant).reason
    old = plan_of(replay("windows-amd-rx7900xtx-hip6"), "ggml")
    assert old.backend == "vulkan"
    rocm = next(c for c in old.candidates if c.backend == "rocm")
    assert not rocm.accepted and "HIP runtime 6" in rocm.reason and "Adrenalin Edition driver to 26.2.2 or newer" in rocm.reason


def test_ggml_on_amd_windows_without_a_published_rocm_build_is_a_local_vulkan_build_not_rocm():
    """Issue 27: "ggml on AMD Windows: Vulkan stays the default; a ROCm/HIP variant is planned only where a
    published build lists the gfx target". With no channel, the local build is Vulkan, and the plan says why
    not ROCm (a local ROCm build on Windows needs AMD's HIP SDK, which no first run has)."""
    from accelstack.manifests.resolver import Manifests

    plan = plan_of(replay("windows-amd-890m-gfx1150-hip7"), "ggml", manifests=Manifests.builtin())
    assert plan.status == "needs-build" and plan.backend == "vulkan", plan.summary
    local = next(c for c in plan.candidates if c.name == "local-rocm")
    assert not local.accepted and "published" in local.reason and "HIP SDK" in local.reason
    # with a published ROCm build that lists gfx1150, ggml uses it; no note proposes a local ROCm build
    published = plan_of(replay("windows-amd-890m-gfx1150-hip7"), "ggml")
    assert published.backend == "rocm" and not any("local ROCm build" in n for n in published.notes)
