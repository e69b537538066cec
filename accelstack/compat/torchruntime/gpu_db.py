"""``torchruntime.gpu_db``: what a GPU is (compute capability, gfx target, discrete or not), from accelstack's tables.

torchruntime guesses from name patterns and a small table of AMD APUs; here the answers come from
accelstack's tables first (NVIDIA's compute capabilities by marketing and chip name, AMD's gfx
targets by PCI id, the PCI database's discrete flag, Intel's platforms), and torchruntime's own
answer stands only where those tables do not know the GPU. Its pattern constants
(``NVIDIA_ARCH_MAP``, ``NVIDIA_DISCRETE_PATTERN``, ``AMD_INTEGRATED_GPUS``...) are torchruntime's,
read from the installed torchruntime.
"""
from __future__ import annotations

import sys
from typing import Any, Iterable, Optional, Tuple

from ...hardware.protocol import System
from ...hardware.tables import amd_gfx_target, amd_is_integrated, intel_platform, nvidia_compute_capability, pci_lookup
from . import _theirs
from ._facts import gfx_version
from ._machine import machine_report
from .consts import AMD, APPLE, INTEL, NVIDIA

__all__ = ["get_nvidia_arch", "get_amd_gfx_info", "is_gpu_vendor", "get_gpu_type", "NVIDIA", "AMD", "INTEL", "APPLE"]

_THEIR_CONSTANTS = ("NVIDIA_ARCH_MAP", "NVIDIA_DISCRETE_PATTERN", "AMD_DISCRETE_PATTERN", "AMD_INTEGRATED_GPUS", "GPU_DEVICES",
                    "KEPLER_DEVICES", "MAXWELL_DEVICES", "PASCAL_DEVICES", "VOLTA_DEVICES", "TURING_DEVICES", "AMPERE_DEVICES",
                    "HOPPER_DEVICES", "ADA_LOVELACE_DEVICES", "BLACKWELL_DEVICES")


def _original() -> Any:
    """torchruntime's own gpu_db module (loaded under a private name), for what accelstack's tables do not know."""
    if _theirs.original() is None:
        raise NotImplementedError("torchruntime is not installed: its gpu_db patterns are not available")
    return sys.modules[_theirs.NAME + ".gpu_db"]


def __getattr__(name: str) -> Any:  # torchruntime's pattern constants, read from the installed torchruntime
    if name in _THEIR_CONSTANTS:
        return getattr(_original(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _cc(name: str) -> float:
    """accelstack's compute capability for a GPU name, else torchruntime's architecture number (0: unknown)."""
    ours = nvidia_compute_capability(name)
    if ours:
        return float(ours)
    return float(_original().get_nvidia_arch([name]))


def get_nvidia_arch(device_names: Iterable[str], system: Optional[System] = None) -> float:
    """The lowest compute capability (8.6, 12.0) among these NVIDIA GPU names; 0 if none is known.

    Each name is looked up in accelstack's table of NVIDIA GPUs (marketing and chip names, with their
    real compute capability: 6.1 for a GTX 1080, 10.0 for a B100); a name it does not know gets
    torchruntime's number for its architecture. ``system`` (accelstack's addition): the compute
    capabilities detection found on that machine (a replayed capture) for GPUs of these names."""
    names = [str(n) for n in device_names]
    if system is not None:
        found = [float(g.compute_capability) for g in machine_report(system).gpus
                 if g.vendor == "nvidia" and g.compute_capability and (g.name in names or not names)]
        return min(found) if found else 0
    known = [cc for cc in map(_cc, names) if cc]
    return min(known) if known else 0


def _family(device_id: str) -> str:
    known = pci_lookup(AMD, device_id)
    return known[0].split(" [")[0].strip() if known else ""


def get_amd_gfx_info(device_id: str) -> Tuple[str, str, str]:
    """(family name, gfx target, HSA version) of an AMD GPU by PCI device id: ("Renoir", "gfx90c", "9.0.12");
    ("", "", "") when neither accelstack's tables nor torchruntime's know it."""
    gfx = amd_gfx_target(str(device_id))
    theirs = tuple(_original().get_amd_gfx_info(device_id))
    if not gfx:
        return theirs[0], theirs[1], theirs[2]
    return _family(str(device_id)) or theirs[0], gfx, gfx_version(gfx)


def is_gpu_vendor(vendor_id: str) -> bool:
    """Whether a PCI vendor id is one of the GPU vendors accelstack detects (NVIDIA, AMD, Intel, Apple)."""
    return str(vendor_id).lower() in (NVIDIA, AMD, INTEL, APPLE)


def get_gpu_type(vendor_id: str, device_id: str, device_name: str) -> str:
    """"DISCRETE", "INTEGRATED" or "NONE" for a PCI device, from accelstack's tables where they know it."""
    vendor, device = str(vendor_id).lower(), str(device_id).lower()
    known = pci_lookup(vendor, device)
    if known:
        return "DISCRETE" if known[1] else "INTEGRATED"
    gfx = amd_gfx_target(device) if vendor == AMD else ""
    if gfx:
        return "INTEGRATED" if amd_is_integrated(gfx) else "DISCRETE"
    intel = intel_platform(device) if vendor == INTEL else None
    if intel is not None:
        return "INTEGRATED" if intel[2] == "integrated" else "DISCRETE"
    return str(_original().get_gpu_type(vendor, device, device_name))
