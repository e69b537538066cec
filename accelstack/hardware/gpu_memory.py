"""The GPUs' memory now, read quickly for the engine's memory planner (not a whole ``detect``).

A generation on a GPU decides, before its worker loads anything, whether the weights stay in VRAM or
are offloaded to RAM (:mod:`accelstack.engine.memory.plan`); that needs the free VRAM now. ``detect``
knows it (nvidia-smi's ``memory.free``; amdgpu's sysfs ``mem_info_vram_total`` minus ``_used``) but
also enumerates Vulkan in a child process, which a generation should not pay for. This reads only the
GPUs: on Linux the PCI devices with their sysfs VRAM and nvidia-smi (:func:`.linux.gpus`), elsewhere
nvidia-smi's GPUs (Windows' and macOS' other GPUs report no free VRAM to read). Never raises: a GPU
whose free memory cannot be read has ``vram_free`` None, and nothing read is an empty list.
"""
from __future__ import annotations

import logging
from typing import List, Optional

from . import linux
from .common import Probe, query_nvidia_smi
from .live import LiveSystem
from .protocol import DEFAULT_TIMEOUT, System
from .report import GPU

__all__ = ["gpu_memory"]

log = logging.getLogger(__name__)


def gpu_memory(system: Optional[System] = None, timeout: float = DEFAULT_TIMEOUT) -> List[GPU]:
    """The GPUs ``system`` (default: this machine) has, with their total and free VRAM where known."""
    system = LiveSystem() if system is None else system
    probe = Probe(system, timeout=timeout)
    try:
        if system.platform().os_name == "linux":
            wsl = "microsoft" in probe.read_line("/proc/version").lower() or system.exists("/dev/dxg")
            return linux.gpus(probe, "linux", wsl)
        exe = "nvidia-smi"
        if system.platform().os_name == "windows":  # the driver's own, where it installs it, even when not on PATH
            from .windows import NVIDIA_SMI_EXES

            exe = next((x for x in NVIDIA_SMI_EXES if system.exists(x)), exe)
        return [GPU(index=s.index, vendor="nvidia", name=s.name, bus_id=s.bus_id, kind="discrete",
                    vram_total=s.vram_total, vram_free=s.vram_free) for s in query_nvidia_smi(probe, exe) or []]
    except Exception as exc:  # an odd machine: the planner then treats the free VRAM as unknown
        log.info("could not read the GPUs' memory: %s", exc)
        return []
