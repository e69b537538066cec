"""The machine's memory as the planner sees it, and the free VRAM of the GPU a runtime will generate on.

The memory planner (:mod:`accelstack.engine.memory.plan`) keeps the weights in VRAM when they fit and
offloads them to RAM when they do not; the worker only tells its device's free memory once the model
is loaded, too late for that choice. So the planner is handed a :class:`MachineMemory`: the RAM
available and each GPU's free VRAM, read by the core from the machine it already has (live, replayed
or injected: ``accelstack.core.machine``), never by the engine itself, so a replayed or declared
machine reaches the planner as it reaches the plan. This module picks what the runtime's backend can
use. Which of several GPUs ggml will pick is its own order (CUDA's is not the PCI order), so the least
free VRAM among them is taken: never more than the device has. Unknown (None: the old safe default,
weights offloaded) when a GPU's free VRAM cannot be read, when the backend's GPUs are not there, for
Metal (unified memory: RAM is the limit), for Vulkan on integrated GPUs only (they share RAM) and for
Vulkan outside Linux (the quick read sees NVIDIA's GPUs only there: the core reads no GPU then).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Protocol, Sequence, Tuple

__all__ = ["BACKEND_VENDORS", "GpuMemory", "MachineMemory", "reads_gpus", "vram_free_of"]

# the GPU vendors each ggml backend runs on (Vulkan: any discrete GPU)
BACKEND_VENDORS: Dict[str, Tuple[str, ...]] = {"cuda": ("nvidia",), "rocm": ("amd",), "sycl": ("intel",),
                                               "vulkan": ("nvidia", "amd", "intel")}


class _Gpu(Protocol):
    @property
    def vendor(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def vram_free(self) -> Optional[int]: ...


@dataclass(frozen=True)
class GpuMemory:
    """One GPU as the planner needs it: who made it, discrete or integrated, its free VRAM (None: unknown)."""

    vendor: str
    kind: str
    vram_free: Optional[int] = None


@dataclass(frozen=True)
class MachineMemory:
    """What the planner knows of the machine: RAM available to a new allocation and the GPUs' free VRAM
    (None and no GPUs: unknown, so nothing is refused for RAM and weights are offloaded)."""

    ram_available: Optional[int] = None
    gpus: Tuple[GpuMemory, ...] = ()

    def vram_free(self, backend: str) -> Optional[int]:
        return vram_free_of(backend, self.gpus)


def reads_gpus(backend: str, os_name: str) -> bool:
    """Whether the GPUs' free VRAM is worth reading for ``backend`` (nothing for CPU or Metal; Vulkan
    outside Linux: the quick read sees nvidia-smi's GPUs only, and Vulkan may pick another)."""
    return backend in BACKEND_VENDORS and (backend != "vulkan" or os_name == "linux")


def vram_free_of(backend: str, gpus: Sequence[_Gpu]) -> Optional[int]:
    """The least free VRAM among the GPUs ``backend`` can use, or None when it cannot be told."""
    vendors = BACKEND_VENDORS.get(backend)
    if not vendors:
        return None
    usable = [g for g in gpus if g.vendor in vendors and (backend != "vulkan" or g.kind == "discrete")]
    if not usable or any(g.vram_free is None for g in usable):
        return None
    return min(int(g.vram_free or 0) for g in usable)
