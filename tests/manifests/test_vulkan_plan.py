"""The ggml planner and Vulkan devices: a CPU-type Vulkan device (lavapipe/llvmpipe, SwiftShader) is
never preferred over the native CPU build unless the Vulkan backend is asked for, and the plan names
the Vulkan device to use as the loader numbers it (``GGML_VK_VISIBLE_DEVICES``: ggml-vulkan skips
CPU-type devices unless that variable names them).

With this machine's own report (captured live, then replayed), with a replayed capture of a host
where lavapipe comes before a discrete NVIDIA GPU in the loader's order (hardware dump 064), and
with reports built directly.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from accelstack.hardware import detect
from accelstack.hardware.report import HardwareReport, VulkanDevice, VulkanHeap
from accelstack.hardware.system import CapturingSystem, LiveSystem, ReplaySystem

from ._factory import CAPTURES, candidate, machine, nvidia, plan_of

HOME = Path("/nonexistent/accelstack-test-home")
LAVAPIPE = any(Path(d, f"lvp_icd.{arch}.json").exists() for d in ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d")
               for arch in ("x86_64", "aarch64"))
needs_lavapipe = pytest.mark.skipif(
    not (LAVAPIPE and sys.platform == "linux") and not os.environ.get("CI"),
    reason="no lavapipe (Mesa's Vulkan on the CPU) here; scripts/setup-vulkan.sh installs it (CI always does)")


def lavapipe(index: int = 0, name: str = "llvmpipe (LLVM 15.0.6, 256 bits)") -> VulkanDevice:
    return VulkanDevice(index=index, name=name, type="cpu", vendor_id="10005", device_id="0000", api_version="1.3.230",
                        driver_name="llvmpipe", driver_info="Mesa 22.3.6 (LLVM 15.0.6)", driver_id=13,
                        heaps=[VulkanHeap(size=2 << 30, device_local=True)])


def with_vulkan(report: HardwareReport, *devices: VulkanDevice) -> HardwareReport:
    report.vulkan_devices = list(devices)
    report.vulkan_loader_version = "1.3.239"
    return report


# -- this machine ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def this_machine(tmp_path_factory) -> HardwareReport:
    """This machine's report, captured live and replayed (the replay is what the plan sees)."""
    capturing = CapturingSystem(LiveSystem())
    live = detect(capturing, home=HOME)
    root = capturing.save(str(tmp_path_factory.mktemp("capture") / "here"))
    replayed = detect(ReplaySystem(str(root)), home=HOME)
    assert [(d.index, d.name, d.type) for d in replayed.vulkan_devices] == [(d.index, d.name, d.type) for d in live.vulkan_devices]
    return replayed


@needs_lavapipe
def test_lavapipe_here_loses_to_the_cpu_build_with_the_reason(this_machine):
    cpu_devices = [d for d in this_machine.vulkan_devices if d.type == "cpu"]
    assert cpu_devices, "lavapipe is installed, so the loader should enumerate it"
    if any(d.type != "cpu" for d in this_machine.vulkan_devices):
        pytest.skip("this machine has a Vulkan GPU too")
    plan = plan_of(this_machine, "ggml")
    assert plan.backend == "cpu" and "GGML_VK_VISIBLE_DEVICES" not in plan.env
    vulkan = candidate(plan, "vulkan")
    assert not vulkan.accepted and vulkan.code == "cpu-device"
    assert f"Vulkan device {cpu_devices[0].index} {cpu_devices[0].name} is a CPU-type device" in vulkan.reason
    assert "--backend vulkan" in vulkan.reason
    assert plan.build is None  # a local Vulkan build would not do better either


@needs_lavapipe
def test_lavapipe_here_is_used_when_vulkan_is_forced_and_named_for_ggml(this_machine):
    if any(d.type != "cpu" for d in this_machine.vulkan_devices):
        pytest.skip("this machine has a Vulkan GPU too")
    lvp = next(d for d in this_machine.vulkan_devices if d.type == "cpu")
    plan = plan_of(this_machine, "ggml", backend="vulkan")
    assert (plan.status, plan.backend, plan.variant) == ("ready", "vulkan", "linux-x64-vulkan")
    assert plan.env == {"GGML_VK_VISIBLE_DEVICES": str(lvp.index)}
    assert "CPU-type device" in plan.device_reason and lvp.name in plan.summary
    assert candidate(plan, "cpu").code == "forced-backend"
    # a variant named by its id forces the same way
    assert plan_of(this_machine, "ggml", backend="linux-x64-vulkan").env == plan.env


# -- a replayed host: lavapipe is Vulkan0, the discrete GPU Vulkan1 ------------------------------------
def _make_fixture():
    spec = importlib.util.spec_from_file_location("accelstack_make_fixture", CAPTURES.parent / "make_fixture.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _probe_json() -> str:
    """Dump 064's devices as the probe prints them (see tests/hardware/test_vulkan_devices.py)."""
    return json.dumps({"loader": "1.3.275", "error": "", "devices": [
        {"index": 0, "name": "llvmpipe (LLVM 17.0.6, 256 bits)", "type": 4, "vendor_id": 0x10005, "device_id": 0,
         "api_version": (1 << 22) | (3 << 12) | 267, "driver_version": 1, "driver_id": 13, "driver_name": "llvmpipe",
         "driver_info": "Mesa 24.0.9 (LLVM 17.0.6)", "heaps": [{"size": 32 << 30, "device_local": True}]},
        {"index": 1, "name": "Quadro P4000", "type": 2, "vendor_id": 0x10DE, "device_id": 0x1BB1,
         "api_version": (1 << 22) | (3 << 12) | 277, "driver_version": (535 << 22) | (183 << 14) | (1 << 6),
         "driver_id": 4, "driver_name": "NVIDIA", "driver_info": "535.183.01",
         "heaps": [{"size": 8 << 30, "device_local": True}]}]}) + "\n"


@pytest.fixture(scope="module")
def p4000(tmp_path_factory) -> HardwareReport:
    from accelstack.hardware import vulkan as vk

    b = _make_fixture().CaptureBuilder()
    b.pci("0000:01:00.0", "030000", "10de", "1bb1", driver="nvidia")
    b.file("/sys/module/nvidia/version", "535.183.01\n")
    b.smi([[0, "00000000:01:00.0", "Quadro P4000", 8192, 8100, "535.183.01", "6.1"]])
    b.file("/usr/lib/x86_64-linux-gnu/libvulkan.so.1", "").file("/usr/share/vulkan/icd.d/nvidia_icd.json", "{}")
    b.file("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json", "{}")
    b.command(vk.probe_argv(), stdout=_probe_json())
    root = b.write(tmp_path_factory.mktemp("p4000") / "p4000")
    return detect(ReplaySystem(str(root)), home=HOME, timeout=5.0)


def test_forced_vulkan_on_a_replayed_gpu_host_names_the_gpu_by_its_loader_index(p4000):
    assert [(d.index, d.type, d.gpu) for d in p4000.vulkan_devices] == [(0, "cpu", None), (1, "discrete", 0)]
    plan = plan_of(p4000, "ggml", backend="vulkan")
    assert (plan.backend, plan.gpus) == ("vulkan", [0])
    assert plan.env == {"GGML_VK_VISIBLE_DEVICES": "1"}  # not 0: that is lavapipe
    assert "Quadro P4000" in plan.summary and "CPU-type" not in plan.summary


def test_the_replayed_gpu_host_prefers_cuda_and_never_lavapipe(p4000):
    plan = plan_of(p4000, "ggml")
    assert plan.backend == "cuda"
    lvp = [c for c in plan.candidates if c.code == "cpu-device"]
    assert len(lvp) == 1 and "llvmpipe (LLVM 17.0.6, 256 bits) is a CPU-type device" in lvp[0].reason


# -- reports built directly -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["llvmpipe (LLVM 15.0.6, 256 bits)", "SwiftShader Device (Subzero)"])
def test_a_cpu_type_device_is_never_preferred_unless_forced(name):
    report = with_vulkan(machine(), lavapipe(0, name))
    plan = plan_of(report, "ggml")
    assert plan.backend == "cpu" and plan.variant == "linux-x64-cpu-avx2" and plan.env == {}
    assert candidate(plan, "vulkan").code == "cpu-device" and name in candidate(plan, "vulkan").reason
    forced = plan_of(report, "ggml", backend="vulkan")
    assert forced.variant == "linux-x64-vulkan" and forced.env == {"GGML_VK_VISIBLE_DEVICES": "0"}
    assert forced.chosen is not None and "GGML_VK_VISIBLE_DEVICES=0" in forced.chosen.reason


def test_forced_vulkan_prefers_a_real_gpu_over_lavapipe_and_names_its_loader_index():
    report = with_vulkan(machine(nvidia(0)), lavapipe(0),
                         VulkanDevice(index=1, name="NVIDIA GeForce RTX 4090", type="discrete", vendor_id="10de", gpu=0))
    plan = plan_of(report, "ggml", backend="vulkan")
    assert (plan.backend, plan.gpus, plan.env) == ("vulkan", [0], {"GGML_VK_VISIBLE_DEVICES": "1"})
    assert plan_of(report, "ggml").backend == "cuda"


def test_without_a_cpu_type_device_plans_stay_as_they_were():
    plan = plan_of(machine(), "ggml")
    assert plan.backend == "cpu" and not [c for c in plan.candidates if c.code == "cpu-device"]
    forced = plan_of(machine(), "ggml", backend="vulkan")
    assert forced.status == "unsatisfiable" and forced.backend != "vulkan"
