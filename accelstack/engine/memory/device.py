"""The free VRAM of the GPU a runtime will generate on, known before its worker starts.

The memory planner (:mod:`accelstack.engine.memory.plan`) keeps the weights in VRAM when they fit and
offloads them to RAM when they do not; the worker only tells its device's free memory once the model
is loaded, too late for that choice. So the planner gets the GPUs' free VRAM from the machine
(:func:`accelstack.hardware.gpu_memory.gpu_memory`: nvidia-smi, amdgpu's sysfs) and this module
picks what the runtime's backend can use. Which of several GPUs ggml will pick is its own order
(CUDA's is not the PCI order), so the least free VRAM among them is taken: never more than the device
has. Unknown (None: the old safe default, weights offloaded) when a GPU's free VRAM cannot be read,
when the backend's GPUs are not there, for Metal (unified memory: RAM is the limit), for Vulkan on
integrated GPUs only (they share RAM) and for Vulkan outside Linux (the quick read sees NVIDIA's GPUs
only there).
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

from ...hardware.protocol import System
from ...hardware.report import GPU

__all__ = ["BACKEND_VENDORS", "vram_free_of", "gpu_vram_free"]

# the GPU vendors each ggml backend runs on (Vulkan: any discrete GPU)
BACKEND_VENDORS: Dict[str, Tuple[str, ...]] = {"cuda": ("nvidia",), "rocm": ("amd",), "sycl": ("intel",),
                                               "vulkan": ("nvidia", "amd", "intel")}


def vram_free_of(backend: str, gpus: Sequence[GPU]) -> Optional[int]:
    """The least free VRAM among the GPUs ``backend`` can use, or None when it cannot be told."""
    vendors = BACKEND_VENDORS.get(backend)
    if not vendors:
        return None
    usable = [g for g in gpus if g.vendor in vendors and (backend != "vulkan" or g.kind == "discrete")]
    if not usable or any(g.vram_free is None for g in usable):
        return None
    return min(int(g.vram_free or 0) for g in usable)


def gpu_vram_free(backend: str, system: Optional[System] = None) -> Optional[int]:
    """:func:`vram_free_of` for this machine's GPUs now (``system``: another machine, for tests)."""
    if backend not in BACKEND_VENDORS:
        return None  # CPU, Metal: nothing to read
    from ...hardware.gpu_memory import gpu_memory  # only for a GPU backend: a CPU generation reads nothing
    from ...hardware.live import LiveSystem

    system = LiveSystem() if system is None else system
    if backend == "vulkan" and system.platform().os_name != "linux":
        return None  # there the quick read sees nvidia-smi's GPUs only, and Vulkan may pick another
    return vram_free_of(backend, gpu_memory(system))
