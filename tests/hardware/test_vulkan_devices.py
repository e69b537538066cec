"""Vulkan devices as the Vulkan loader enumerates them: for real on this machine's lavapipe (Mesa's
Vulkan driver on the CPU, device type ``cpu``), through a capture and its replay, and replayed for a
discrete NVIDIA GPU, a crashing driver and garbage output."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from accelstack.hardware import linux
from accelstack.hardware import vulkan as vk
from accelstack.hardware.common import Probe
from accelstack.hardware.report import CPUInfo, HardwareReport, MemoryInfo, OSInfo, VulkanDevice, VulkanHeap
from accelstack.hardware.system import CapturingSystem, LiveSystem, ReplaySystem
from accelstack.serde import dumps, loads

from .conftest import replay

LOADER = next((p for p in linux.VULKAN_LOADERS if os.path.exists(p)), "")
LAVAPIPE = any(os.path.exists(f"{d}/lvp_icd.x86_64.json") or os.path.exists(f"{d}/lvp_icd.aarch64.json")
               for d in linux.VULKAN_ICD_DIRS)
needs_lavapipe = pytest.mark.skipif(not (LOADER and LAVAPIPE), reason="no Vulkan loader with Mesa's lavapipe here "
                                    "(scripts/setup-vulkan.sh installs them)")
VULKAN_LOADER = "/usr/lib/x86_64-linux-gnu/libvulkan.so.1"


def _devices(system):
    probe = Probe(system)
    loader, _icds = linux.vulkan(probe)
    version, devices = linux.vulkan_devices(probe, loader, [])
    return version, devices, probe.problems


@needs_lavapipe
def test_lavapipe_is_enumerated_through_the_loader_as_a_cpu_device():
    version, devices, problems = _devices(LiveSystem())
    assert problems == [] and version.count(".") == 2
    lvp = [d for d in devices if d.driver_name == "llvmpipe"]
    assert lvp, f"lavapipe not among {[d.name for d in devices]}"
    d = lvp[0]
    assert d.type == "cpu" and d.name.startswith("llvmpipe") and d.vendor_id == "10005"  # VK_VENDOR_ID_MESA
    assert d.driver_info.startswith("Mesa") and d.api_version.startswith("1.") and d.gpu is None
    assert d.device_local_bytes > 0 and d.index == devices.index(d)


@needs_lavapipe
def test_a_loader_without_drivers_is_a_problem_not_a_crash(monkeypatch, tmp_path):
    monkeypatch.setenv("VK_ICD_FILENAMES", str(tmp_path / "none.json"))  # the loader's own override
    monkeypatch.setenv("VK_DRIVER_FILES", str(tmp_path / "none.json"))  # its newer name
    _version, devices, problems = _devices(LiveSystem())
    assert devices == []
    assert [p.code for p in problems] == ["vulkan_enumeration_failed"] and "vkCreateInstance" in problems[0].message


@needs_lavapipe
def test_a_capture_replays_the_same_devices_on_any_machine(tmp_path):
    capturing = CapturingSystem(LiveSystem())
    _v, live, _p = _devices(capturing)
    root = capturing.save(str(tmp_path / "capture"))
    _v, replayed, problems = _devices(ReplaySystem(str(root)))
    assert replayed == live and problems == []


def test_the_probe_command_line_is_the_same_on_every_machine():
    argv = vk.probe_argv()
    assert argv[:3] == ["python3", "-I", "-c"]
    assert argv[3] == (Path(vk.__file__).parent / "_vulkan_probe.py").read_text(encoding="utf-8")
    assert str(Path.home()) not in " ".join(argv) and "import accelstack" not in argv[3]


# Dump 064 (shared/reference/hardware-dumps/064-linux-nvidia-quadro-p4000-ollama-vulkan-2026-format.md,
# ollama/ollama#17766): ollama saw a "Quadro P4000" through Vulkan only, as `Vulkan1` (so a device came
# before it), type discrete, pci 0000:01:00.0, total 8.2 GiB. Taken from the dump: name, type, bus,
# the device-local heap, its index 1. Not in the dump, filled in as such a host reports them: the
# PCI device id 1bb1 (GP104GL, the PCI id database), the driver (NVIDIA 535.183.01), lavapipe as
# Vulkan0 and the host-memory heap.
P4000_HEAP = int(8.2 * 1024**3) // (1 << 20) * (1 << 20)
PROBE_064 = {
    "loader": "1.3.275", "error": "",
    "devices": [
        {"index": 0, "name": "llvmpipe (LLVM 17.0.6, 256 bits)", "type": 4, "vendor_id": 0x10005, "device_id": 0,
         "api_version": (1 << 22) | (3 << 12) | 267, "driver_version": (0 << 22) | (0 << 12) | 1, "driver_id": 13,
         "driver_name": "llvmpipe", "driver_info": "Mesa 24.0.9 (LLVM 17.0.6)",
         "heaps": [{"size": 33_554_432_000, "device_local": True}]},
        {"index": 1, "name": "Quadro P4000", "type": 2, "vendor_id": 0x10DE, "device_id": 0x1BB1,
         "api_version": (1 << 22) | (3 << 12) | 277, "driver_version": (535 << 22) | (183 << 14) | (1 << 6),
         "driver_id": 4, "driver_name": "NVIDIA", "driver_info": "535.183.01",
         "heaps": [{"size": P4000_HEAP, "device_local": True}, {"size": 33_554_432_000, "device_local": False}]},
    ],
}


def _p4000_host(builder, tmp_path, **command) -> Path:
    b = builder()
    b.pci("0000:01:00.0", "030000", "10de", "1bb1", driver="nvidia")
    b.file("/sys/module/nvidia/version", "535.183.01\n")
    b.smi([[0, "00000000:01:00.0", "Quadro P4000", 8192, 8100, "535.183.01", "6.1"]])
    b.file(VULKAN_LOADER, "").file("/usr/share/vulkan/icd.d/nvidia_icd.json", "{}")
    b.file("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json", "{}")
    b.command(vk.probe_argv(), **command)
    return b.write(tmp_path / "p4000")


def test_a_discrete_nvidia_gpu_replayed_is_linked_to_its_pci_gpu(builder, tmp_path):
    root = _p4000_host(builder, tmp_path, stdout=json.dumps(PROBE_064) + "\n")
    probe = Probe(ReplaySystem(str(root)))
    gpus = linux.gpus(probe, "linux", False)
    loader, _icds = linux.vulkan(probe)
    version, devices = linux.vulkan_devices(probe, loader, gpus)
    assert version == "1.3.275" and [d.type for d in devices] == ["cpu", "discrete"]
    quadro = devices[1]
    assert (quadro.index, quadro.name, quadro.vendor_id, quadro.device_id) == (1, "Quadro P4000", "10de", "1bb1")
    assert quadro.driver_version == "535.183.01" == gpus[0].driver_version and quadro.api_version == "1.3.277"
    assert quadro.device_local_bytes == P4000_HEAP and f"{P4000_HEAP / 1024**3:.1f}" == "8.2"
    assert quadro.gpu == gpus[0].index and devices[0].gpu is None  # lavapipe is no GPU
    assert devices[0].driver_version == "0.0.1"


def test_a_driver_that_crashes_the_probe_is_a_problem(builder, tmp_path):
    root = _p4000_host(builder, tmp_path, stdout="", stderr="Segmentation fault\n", returncode=-11)
    _v, devices, problems = _devices(ReplaySystem(str(root)))
    assert devices == []
    assert [p.code for p in problems] == ["vulkan_probe_crashed"] and "signal 11" in problems[0].message


def test_garbage_from_the_probe_gives_no_devices(builder, tmp_path):
    root = _p4000_host(builder, tmp_path, stdout='{"devices": [{"index": "x"}, 7, {"index": 0}]}\n')
    assert _devices(ReplaySystem(str(root)))[1] == []
    root = _p4000_host(builder, tmp_path / "2", stdout="Traceback (most recent call last)\n")
    _v, devices, problems = _devices(ReplaySystem(str(root)))
    assert devices == [] and [p.code for p in problems] == ["vulkan_enumeration_failed"]


def test_no_loader_runs_no_probe(builder, tmp_path):
    b = builder()
    b.command(vk.probe_argv(), stdout=json.dumps(PROBE_064))
    _v, devices, problems = _devices(ReplaySystem(str(b.write(tmp_path / "none"))))
    assert devices == [] and problems == []


@pytest.mark.parametrize("raw, vendor, text", [
    ((550 << 22) | (40 << 14) | (7 << 6), 0x10DE, "550.40.07"),
    ((418 << 22) | (56 << 14), 0x10DE, "418.56"),
    ((24 << 22) | (2 << 12) | 8, 0x1002, "24.2.8"),  # RADV: Mesa's version, Vulkan encoding
    (1, 0x10005, "0.0.1"),
])
def test_driver_versions_are_decoded_per_vendor(raw, vendor, text):
    assert vk.driver_version(raw, vendor) == text


def test_vulkan_devices_round_trip_through_a_report_as_json():
    report = HardwareReport(os=OSInfo(name="linux"), cpu=CPUInfo(), memory=MemoryInfo(), vulkan_loader=VULKAN_LOADER,
                            vulkan_loader_version="1.3.239",
                            vulkan_devices=[VulkanDevice(index=0, name="llvmpipe", type="cpu", vendor_id="10005",
                                                         heaps=[VulkanHeap(2 << 30, True), VulkanHeap(1 << 30, False)])])
    text = dumps(report)
    assert json.loads(text)["vulkan_devices"][0]["device_local_bytes"] == 2 << 30
    assert loads(HardwareReport, text) == report


def test_detect_puts_the_loaders_devices_on_the_report(builder, tmp_path):
    report = replay(_p4000_host(builder, tmp_path, stdout=json.dumps(PROBE_064) + "\n"))
    assert report.vulkan_loader == VULKAN_LOADER and report.vulkan_loader_version == "1.3.275"
    assert [(d.index, d.type, d.gpu) for d in report.vulkan_devices] == [(0, "cpu", None), (1, "discrete", 0)]
    assert report.gpus[0].name == report.vulkan_devices[1].name == "Quadro P4000"
