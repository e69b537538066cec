"""``torchruntime.device_db``: the machine's GPUs, with torchruntime's fields, from accelstack's detection.

torchruntime lists PCI ids (lspci / WMI / system_profiler) and names them from a bundled
database; accelstack's detection also reads drivers, compute capability, gfx target and VRAM.
A :class:`GPU` here has torchruntime's five fields (so ``gpu.vendor_id == NVIDIA`` and
``gpu.device_name`` work) and keeps the report it came from, so ``get_torch_platform(gpus)``
plans for the same machine.
"""
from __future__ import annotations

import json
import platform
import re
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

from ...hardware.protocol import System
from ...hardware.report import HardwareReport
from ...hardware.tables import TORCHRUNTIME_PCI_DB, pci_lookup
from . import _theirs
from ._machine import machine_report
from .consts import AMD, APPLE, INTEL, NVIDIA

__all__ = ["GPU", "get_gpus", "gpus_of", "get_device_infos", "get_pci_ids", "parse_windows_output", "parse_linux_output",
           "parse_macos_output", "DEVICE_DB_FILE", "os_name"]

os_name = platform.system()  # kept for callers that read it; the GPUs come from accelstack's detection
_FOLDER = _theirs.package_dir()
# the PCI-id database accelstack names GPUs from: torchruntime's own (an absolute path, so
# os.path.join(os.path.dirname(device_db.__file__), DEVICE_DB_FILE) finds it as torchruntime's callers do)
DEVICE_DB_FILE = str(_FOLDER / TORCHRUNTIME_PCI_DB) if _FOLDER is not None else TORCHRUNTIME_PCI_DB

_VENDOR_IDS = {"nvidia": NVIDIA, "amd": AMD, "intel": INTEL, "apple": APPLE}
# the PCI vendor names torchruntime's database gives (pci.ids' spelling), so a caller comparing them still matches
_VENDOR_NAMES = {"nvidia": "NVIDIA Corporation", "amd": "Advanced Micro Devices, Inc. [AMD/ATI]",
                 "intel": "Intel Corporation", "apple": "Apple Inc."}


@dataclass
class GPU:
    """torchruntime's GPU record; ``report`` (not compared, not shown) is the machine it was found on."""

    vendor_id: str
    vendor_name: str
    device_id: str
    device_name: str
    is_discrete: bool
    report: Optional[HardwareReport] = field(default=None, repr=False, compare=False)


def gpus_of(report: HardwareReport) -> List[GPU]:
    """torchruntime's GPU records for the GPUs of ``report`` (those of a vendor torch has builds for)."""
    out = []
    for g in report.gpus:
        if g.vendor not in _VENDOR_IDS:
            continue
        vendor_id = (g.pci_vendor_id or _VENDOR_IDS[g.vendor]).lower()
        out.append(GPU(vendor_id, _VENDOR_NAMES[g.vendor], g.pci_device_id.lower(), g.name, g.kind != "integrated", report))
    return out


def get_gpus(system: Optional[System] = None) -> List[GPU]:
    """The GPUs of this machine (``system``: of a replayed capture instead), as torchruntime lists them."""
    return gpus_of(machine_report(system))


def get_device_infos(pci_ids: Sequence[Tuple[str, str]]) -> List[GPU]:
    """torchruntime's GPU records for (vendor id, device id) pairs the PCI database knows, in order;
    the database's own names ("AD104 [GeForce RTX 4070]"), as torchruntime returns them."""
    out = []
    for vendor_id, device_id in pci_ids:
        vendor, device = str(vendor_id).lower(), str(device_id).lower()
        known = pci_lookup(vendor, device)
        if known is None:
            continue
        vendor_name = next((n for v, n in _VENDOR_NAMES.items() if _VENDOR_IDS[v] == vendor), vendor)
        out.append(GPU(vendor, vendor_name, device, known[0], known[1]))
    return out


def get_pci_ids(system: Optional[System] = None) -> List[Tuple[str, str]]:
    """(vendor id, device id) of the GPUs accelstack's detection found on this machine (``system``: a capture)."""
    return [(g.pci_vendor_id.lower() or _VENDOR_IDS.get(g.vendor, ""), g.pci_device_id.lower())
            for g in machine_report(system).gpus if g.pci_device_id]


def _pairs(pattern: str, text: str, flags: int = 0) -> List[Tuple[str, str]]:
    return [(m.group(1).lower(), m.group(2).lower()) for m in (re.search(pattern, line, flags) for line in text.splitlines()) if m]


def parse_windows_output(output: str) -> List[Tuple[str, str]]:
    """PCI ids from WMI's PNPDeviceID lines ("PCI\\VEN_10DE&DEV_2504&...")."""
    return _pairs(r"VEN_([0-9A-Fa-f]{4})&DEV_([0-9A-Fa-f]{4})", output, re.IGNORECASE)


def parse_linux_output(output: str) -> List[Tuple[str, str]]:
    """PCI ids from ``lspci -nn`` lines (the last "[vvvv:dddd]" of each)."""
    return [p[-1] for p in ([(m.group(1).lower(), m.group(2).lower()) for m in re.finditer(r"\[([0-9a-fA-F]{4}):([0-9a-fA-F]{4})\]", line)]
                           for line in output.splitlines()) if p]


def parse_macos_output(output: str) -> List[Tuple[str, str]]:
    """PCI ids from ``system_profiler -json SPDisplaysDataType`` (Intel's vendor is named, not numbered); [] if not JSON."""
    try:
        displays = json.loads(output).get("SPDisplaysDataType", []) if output.strip() else []
    except (ValueError, AttributeError):
        return []
    out = []
    for display in displays if isinstance(displays, list) else []:
        vendor_text, device = str(display.get("spdisplays_vendor", "")), str(display.get("spdisplays_device-id", ""))
        number = re.search(r"\(0x([0-9a-fA-F]{4})\)", vendor_text)
        vendor = INTEL if "intel" in vendor_text.lower() else (number.group(1).lower() if number else "")
        if vendor and device:
            out.append((vendor, device.lower().replace("0x", "")))
    return out

