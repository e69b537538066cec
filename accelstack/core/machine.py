"""The machine's memory for the engine's planner, read from the ``System`` the core already has.

The engine never reads the machine itself: a live, replayed or injected ``System`` (``Services.system``)
reaches the memory planner as it reaches the plan. GPUs are read only for a backend that runs on one
(nvidia-smi or sysfs: nothing for a CPU generation).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

from ..engine.config import shown
from ..engine.errors import InvalidRequestError
from ..engine.memory.device import BACKEND_VENDORS, GpuMemory, MachineMemory, reads_gpus
from ..hardware.live import LiveSystem
from ..hardware.protocol import System

__all__ = ["available_ram", "machine_memory", "parse_size", "declared_machine", "MAX_DECLARED"]


def available_ram(system: System) -> Optional[int]:
    """RAM available to a new allocation now (None when it cannot be told)."""
    return system.memory()[1]


def machine_memory(backend: str, system: Optional[System] = None) -> MachineMemory:
    """What the planner needs of ``system`` (default: this machine) for a generation on ``backend``."""
    system = LiveSystem() if system is None else system
    gpus: Tuple[GpuMemory, ...] = ()
    if reads_gpus(backend, system.platform().os_name):
        from ..hardware.gpu_memory import gpu_memory  # only for a GPU backend: a CPU generation reads nothing

        gpus = tuple(GpuMemory(g.vendor, g.kind, g.vram_free) for g in gpu_memory(system))
    return MachineMemory(ram_available=available_ram(system), gpus=gpus)


# -- a machine declared by hand (generate --dry-run --vram 8GiB --ram 16GiB) -------------------------------------
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "kb": 10 ** 3, "m": 1 << 20, "mib": 1 << 20, "mb": 10 ** 6,
          "g": 1 << 30, "gib": 1 << 30, "gb": 10 ** 9, "t": 1 << 40, "tib": 1 << 40, "tb": 10 ** 12}
MAX_DECLARED = 64 << 40  # 64 TiB: more than any machine's RAM or GPU; a larger figure is a typo


def parse_size(text: str, flag: str) -> int:
    """``8GiB``, ``8 GiB``, ``8G`` (binary), ``8GB`` (decimal), ``1536MiB`` or bytes; anything else, zero, or
    more than 64 TiB is an InvalidRequestError (exit 2) naming ``flag``."""
    raw = str(text).strip().lower().replace(" ", "")
    number = raw.rstrip("kmgtib")
    unit = raw[len(number):]
    bad = InvalidRequestError(f"{flag} {shown(text)} is not a memory size", hint="write it as 8GiB, 16G, 8GB or 1536MiB "
                              "(more than 0, at most 64 TiB)")
    try:
        value = float(number) * _UNITS[unit]
    except (ValueError, KeyError, OverflowError):
        raise bad from None
    if not math.isfinite(value) or value < 1 or value > MAX_DECLARED:
        raise bad
    return int(value)


def declared_machine(backend: str, *, ram: Optional[int] = None, vram: Optional[int] = None,
                     base: Optional[MachineMemory] = None) -> MachineMemory:
    """``base`` (default: nothing known) with the RAM and ``backend``'s GPU free VRAM declared by hand."""
    for flag, value in (("--ram", ram), ("--vram", vram)):
        if value is not None and not 0 < value <= MAX_DECLARED:
            raise InvalidRequestError(f"{flag} {value} bytes is not a memory size", hint="more than 0, at most 64 TiB")
    base = base or MachineMemory()
    gpus = base.gpus
    if vram is not None:
        vendor = BACKEND_VENDORS.get(backend, ("nvidia",))[0]
        gpus = (GpuMemory(vendor, "discrete", vram),)
    return MachineMemory(ram_available=base.ram_available if ram is None else ram, gpus=gpus)
