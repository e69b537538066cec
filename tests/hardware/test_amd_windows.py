"""Issue 27: Windows detection reports what AMD's ROCm builds of PyTorch need from a Radeon machine.

The gfx target comes from the PCI device id (amd.json), the HIP runtime from the driver's
``amdhip64_<N>.dll`` in the system directory, read through the ``System`` object so captures
record it (fixtures made by tests/hardware/make_amd_windows_fixtures.py from public dumps).
"""
from __future__ import annotations

import json
from pathlib import Path

from accelstack.errors import Action
from accelstack.hardware import detect
from accelstack.hardware.system import CapturingSystem, ReplaySystem

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "captures"
HOME = Path("/nonexistent/accelstack-test-home")
HIP7 = "C:\\Windows\\System32\\amdhip64_7.dll"


def _detect(name: str):
    return detect(ReplaySystem(str(CAPTURES / name)), home=HOME)


def test_a_hip7_driver_is_reported_and_raises_no_problem():
    report = _detect("windows-amd-890m-gfx1150-hip7")
    gpu = report.gpus[0]
    assert (gpu.vendor, gpu.gfx_target, gpu.kind, gpu.hip_runtime) == ("amd", "gfx1150", "integrated", "7")
    assert "hip runtime: amdhip64_7.dll in the system directory" in gpu.sources
    assert not [p for p in report.problems if p.code == "amd_hip_runtime_old"]


def test_a_hip6_driver_is_a_problem_that_names_the_update():
    report = _detect("windows-amd-rx7900xtx-hip6")
    gpu = report.gpus[0]
    assert (gpu.gfx_target, gpu.hip_runtime) == ("gfx1100", "6")
    problem = next(p for p in report.problems if p.code == "amd_hip_runtime_old")
    assert problem.severity == "warning" and problem.action is Action.UPDATE_DRIVER and problem.gpus == [0]
    assert problem.message.startswith("AMD Radeon RX 7900 XTX: the installed AMD driver has HIP runtime 6 (amdhip64_6.dll)")
    assert problem.hint == "update the AMD Software: Adrenalin Edition driver to 26.2.2 or newer (from amd.com)"


def test_an_igpu_without_any_hip_runtime_is_reported_without_a_warning():
    """Captures made before the check recorded no amdhip64 answers: replay says missing, as for any
    path. An iGPU's driver without HIP is common and rarely the GPU to compute on: no warning."""
    report = _detect("windows-ryzen-igpu-arc-b580")
    radeon = next(g for g in report.gpus if g.vendor == "amd")
    assert radeon.gfx_target == "gfx1036" and radeon.kind == "integrated" and radeon.hip_runtime == ""
    assert "hip runtime: no amdhip64_*.dll in the system directory" in radeon.sources
    assert not [p for p in report.problems if p.code == "amd_hip_runtime_old"]


def test_a_discrete_radeon_without_any_hip_runtime_gets_the_update(tmp_path):
    capturing = CapturingSystem(ReplaySystem(str(CAPTURES / "windows-amd-rx7900xtx-hip6")))
    detect(capturing, home=HOME)
    capturing.save(str(tmp_path / "nohip"))
    index_path = tmp_path / "nohip" / "capture.json"
    index = json.loads(index_path.read_text(encoding="utf-8"))
    index["exists"] = {k: v for k, v in index["exists"].items() if "amdhip64_" not in k}  # as a driver without HIP
    index_path.write_text(json.dumps(index), encoding="utf-8")
    report = detect(ReplaySystem(str(tmp_path / "nohip")), home=HOME)
    problem = next(p for p in report.problems if p.code == "amd_hip_runtime_old")
    assert "has no HIP runtime" in problem.message and report.gpus[0].hip_runtime == ""


def test_the_check_is_recorded_in_a_capture_and_replays(tmp_path):
    capturing = CapturingSystem(ReplaySystem(str(CAPTURES / "windows-amd-890m-gfx1150-hip7")))
    first = detect(capturing, home=HOME)
    assert capturing.exists_log[HIP7] is True
    capturing.save(str(tmp_path / "again"))
    index = json.loads((tmp_path / "again" / "capture.json").read_text(encoding="utf-8"))
    assert index["exists"][HIP7] is True
    again = detect(ReplaySystem(str(tmp_path / "again")), home=HOME)
    assert again.gpus[0].hip_runtime == first.gpus[0].hip_runtime == "7"


def test_the_newest_runtime_wins_and_only_the_first_hit_is_asked(tmp_path):
    """A driver keeps the older amdhip64_6.dll beside amdhip64_7.dll; 7 is what counts, and the
    search stops there (one file lookup per AMD GPU on an up-to-date machine)."""
    capturing = CapturingSystem(ReplaySystem(str(CAPTURES / "windows-amd-890m-gfx1150-hip7")))
    detect(capturing, home=HOME)
    asked = [p for p in capturing.exists_log if "amdhip64_" in p]
    assert asked == [HIP7]
