"""``torchruntime.device_db``: the machine's GPUs, with torchruntime's fields, from accelstack's detection.

torchruntime lists PCI ids (lspci / WMI / system_profiler) and names them from a bundled
database; accelstack's detection also reads drivers, compute capability, gfx target and VRAM.
A :class:`GPU` here has torchruntime's five fields (so ``gpu.vendor_id == NVIDIA`` and
``gpu.device_name`` work) and keeps the report it came from, so ``get_torch_platform(gpus)``
plans for the same machine.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from ...hardware.protocol import System
from ...hardware.report import HardwareReport
from ._machine import machine_report
from .consts import AMD, APPLE, INTEL, NVIDIA

__all__ = ["GPU", "get_gpus", "gpus_of"]

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
