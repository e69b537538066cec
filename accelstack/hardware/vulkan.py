"""Vulkan devices as the Vulkan loader itself enumerates them (what a Vulkan build of ggml will see).

``vulkaninfo`` is not on users' machines, and loading a Vulkan driver in this process could crash
it, so the loader is asked by a child process: ``python3 -I -c <_vulkan_probe.py>`` through the
detection ``System``, which keeps the argv fixed (a capture records it, a replay matches it) and
turns a crashing or hanging driver into a problem instead of a dead detection.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..limits import MalformedInput, parse_json
from .common import Probe
from .protocol import CommandResult
from .report import GPU, VulkanDevice, VulkanHeap

__all__ = ["DEVICE_TYPES", "PROBE_ARGV", "PROBE_SOURCE", "api_version", "driver_version", "enumerate_devices",
           "interpret", "match_gpus", "parse", "probe_argv"]

PROBE_SOURCE = (Path(__file__).with_name("_vulkan_probe.py")).read_text(encoding="utf-8")
# "python3", not this interpreter's path: the command line must be the same on every machine for
# replay to match it, and the probe needs only the standard library of any Python 3.
PROBE_ARGV = ("python3", "-I", "-c", PROBE_SOURCE)

DEVICE_TYPES = {0: "other", 1: "integrated", 2: "discrete", 3: "virtual", 4: "cpu"}  # VkPhysicalDeviceType
VENDOR_NVIDIA = 0x10DE


def probe_argv() -> List[str]:
    return list(PROBE_ARGV)


def api_version(raw: int) -> str:
    """VK_API_VERSION_MAJOR/MINOR/PATCH (the variant bits are 0 for Vulkan)."""
    return f"{(raw >> 22) & 0x7F}.{(raw >> 12) & 0x3FF}.{raw & 0xFFF}"


def driver_version(raw: int, vendor_id: int) -> str:
    """``driverVersion`` is vendor-encoded: NVIDIA packs 10.8.8.6 bits (written the way nvidia-smi
    writes its version, "550.40.07", "418.56"); everyone else on Linux (Mesa, AMD) uses the Vulkan
    version encoding."""
    if vendor_id == VENDOR_NVIDIA:
        major, minor, patch = (raw >> 22) & 0x3FF, (raw >> 14) & 0xFF, (raw >> 6) & 0xFF
        return f"{major}.{minor:02d}" + (f".{patch:02d}" if patch else "")
    return api_version(raw)


def parse(text: str) -> Tuple[str, List[VulkanDevice], str]:
    """(loader version, devices, error) from the probe's JSON; malformed entries are skipped."""
    try:
        data = parse_json(text.strip().splitlines()[-1], what="the Vulkan probe's answer") if text.strip() else None
    except MalformedInput:  # not JSON, or nested past the parser's depth
        data = None
    if not isinstance(data, dict):
        return "", [], "the Vulkan probe printed no result"
    devices: List[VulkanDevice] = []
    for entry in data.get("devices") or []:
        device = _device(entry)
        if device is not None:
            devices.append(device)
    return str(data.get("loader") or ""), devices, str(data.get("error") or "")


def _int(entry: Dict[str, Any], key: str) -> int:
    value = entry.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _device(entry: Any) -> Optional[VulkanDevice]:
    if not isinstance(entry, dict) or not isinstance(entry.get("index"), int) or not isinstance(entry.get("name"), str):
        return None
    vendor = _int(entry, "vendor_id")
    heaps = [VulkanHeap(size=_int(h, "size"), device_local=bool(h.get("device_local")))
             for h in entry.get("heaps") or [] if isinstance(h, dict)]
    return VulkanDevice(
        index=entry["index"],
        name=entry["name"].strip(),
        type=DEVICE_TYPES.get(_int(entry, "type"), "other"),
        vendor_id=f"{vendor:04x}",
        device_id=f"{_int(entry, 'device_id'):04x}",
        api_version=api_version(_int(entry, "api_version")),
        driver_version=driver_version(_int(entry, "driver_version"), vendor),
        driver_name=str(entry.get("driver_name") or ""),
        driver_info=str(entry.get("driver_info") or ""),
        driver_id=_int(entry, "driver_id"),
        heaps=heaps,
    )


def enumerate_devices(probe: Probe) -> Tuple[str, List[VulkanDevice]]:
    """(loader version, devices) from the loader; a failing probe is a problem, no devices.

    A missing ``python3`` (or a capture made before this probe existed) gives nothing, silently.
    """
    return interpret(probe, probe.run(probe_argv(), "vulkan_probe"))


def interpret(probe: Probe, result: CommandResult) -> Tuple[str, List[VulkanDevice]]:
    """(loader version, devices) from the probe's ``result`` (run now, or kept from an earlier run);
    a failed run becomes a problem."""
    if result.missing or result.timed_out:
        return "", []
    loader, devices, error = parse(result.stdout)
    if result.returncode != 0:
        how = f"signal {-result.returncode}" if result.returncode is not None and result.returncode < 0 else f"exit {result.returncode}"
        last = (result.stderr.strip().splitlines() or [""])[-1][:200]
        probe.problem("vulkan_probe_crashed", f"enumerating Vulkan devices crashed ({how}){': ' + last if last else ''}",
                 "a Vulkan driver (ICD) failed while loading: update or remove the broken driver package", "warning")
        return loader, devices
    if error:
        probe.problem("vulkan_enumeration_failed", f"the Vulkan loader could not enumerate devices: {error}",
                 "install the Vulkan driver of your GPU (e.g. mesa-vulkan-drivers, or the vendor's driver)", "info")
    return loader, devices


def match_gpus(devices: List[VulkanDevice], gpus: List[GPU]) -> None:
    """Link each Vulkan device to the GPU with the same PCI vendor and device id (in order, so two
    identical cards pair up one to one); CPU-type devices are never GPUs."""
    taken: set = set()
    for device in devices:
        if device.type == "cpu":
            continue
        for position, gpu in enumerate(gpus):  # the report's GPU index is its position in the list
            if position not in taken and (gpu.pci_vendor_id, gpu.pci_device_id) == (device.vendor_id, device.device_id):
                device.gpu = position
                taken.add(position)
                break
