"""The machine's memory for the engine's planner, read from the ``System`` the core already has.

The engine never reads the machine itself: a live, replayed or injected ``System`` (``Services.system``)
reaches the memory planner as it reaches the plan. GPUs are read only for a backend that runs on one
(nvidia-smi or sysfs: nothing for a CPU generation).
"""
from __future__ import annotations

from typing import Optional, Tuple

from ..engine.memory.device import GpuMemory, MachineMemory, reads_gpus
from ..hardware.live import LiveSystem
from ..hardware.protocol import System

__all__ = ["available_ram", "machine_memory"]


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
