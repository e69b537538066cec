"""Issue 27, plans: what blocks CUDA is said, an unread Windows driver still gets CUDA, the architecture comes first."""
from __future__ import annotations

from accelstack.manifests.machine import Device
from accelstack.manifests.torch_device_rules import driver_unread

from ._factory import machine, nvidia, plan_of, replay

PYTHON = "3.11"


def _cuda_rejections(plan):
    return [c for c in plan.candidates if c.backend == "cuda" and not c.accepted]


# -- the NVIDIA driver is loaded but initialized no GPU --------------------------------------------------

def test_no_devices_found_says_what_blocks_cuda_not_install_a_driver():
    plan = plan_of(replay("linux-nvidia-no-devices-rtx3090-550"), "torch", python=PYTHON)
    assert plan.backend == "cpu"
    (cuda,) = _cuda_rejections(plan)
    assert "could not initialize" in cuda.reason and "dmesg" in cuda.reason
    assert "install or repair the NVIDIA driver" not in cuda.reason and "install the NVIDIA" not in cuda.reason


# -- Windows: NVIDIA's driver is installed, its version could not be read -----------------------------------

def test_an_unread_driver_plans_the_cuda_build_with_the_oldest_driver_floor():
    report = replay("i11d-windows-rtx4060-laptop-partial-wmi")
    plan = plan_of(report, "torch", python=PYTHON)
    assert (plan.backend, plan.variant, plan.gpus) == ("cuda", "cu118", [1])  # the NVIDIA card, never the iGPU's DirectML
    assert any("could not be read" in n and "oldest driver" in n for n in plan.notes)
    chosen = plan.chosen
    assert chosen is not None and "device check" in chosen.reason
    newer = [c for c in plan.candidates if c.backend == "cuda" and c.name != "cu118"]
    assert newer and all(c.code == "driver" and "could not be read" in c.reason for c in newer)
    directml = [c for c in plan.candidates if c.backend == "directml"]
    assert directml and all(c.accepted for c in directml)  # what the install falls back to


def test_the_floor_follows_the_architecture():
    """A Blackwell card has no cu118 kernels: its oldest-driver build is a CUDA 12.8+ one."""
    report = machine(nvidia(name="NVIDIA GeForce RTX 5090", cc="12.0", cuda="", driver=""), os="windows")
    g = report.gpus[0]
    g.driver, g.driver_version, g.cuda_driver_version = "wddm", "", ""
    plan = plan_of(report, "torch", python=PYTHON)
    assert plan.backend == "cuda" and plan.variant not in ("cu118", "cu121", "cu124", "cu126")
    assert any("could not be read" in n for n in plan.notes)


def test_a_read_driver_is_planned_as_before():
    plan = plan_of(replay("windows-nvidia-rtx4060-laptop-driver-unread-smi-system32"), "torch", python=PYTHON)
    assert (plan.backend, plan.variant) == ("cuda", "cu130")
    assert not any("could not be read" in n for n in plan.notes)


def test_only_the_windows_vendor_driver_counts_as_unread():
    report = replay("linux-nvidia-nouveau-intel-haswell")
    assert not driver_unread(Device(gpus=[report.gpus[1]]))


# -- the reason names what the user can act on: the architecture first -------------------------------------

def test_a_kepler_gtx680_on_driver_331_is_told_about_its_architecture():
    plan = plan_of(replay("linux-nvidia-gtx680-331"), "torch", python=PYTHON)
    assert plan.backend == "cpu"
    (cuda,) = _cuda_rejections(plan)
    assert cuda.code == "kernels"
    assert cuda.reason.startswith("cuda rejected: no torch CUDA wheel has kernels for sm_30")
    assert "Kepler" in cuda.reason and "update" not in cuda.reason and "install" not in cuda.reason


def test_a_driver_problem_stays_the_reason_where_wheels_have_kernels():
    """A Pascal card on driver 418: torch has sm_60 kernels, so the driver is what to act on."""
    plan = plan_of(replay("linux-nvidia-4x-titanx-pascal-418"), "torch", python=PYTHON)
    reasons = " ".join(c.reason for c in _cuda_rejections(plan))
    assert "no torch CUDA wheel has kernels" not in reasons and "driver" in reasons
