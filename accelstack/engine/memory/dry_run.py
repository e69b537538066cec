"""What the memory planner would decide for a checked generate request, without loading anything.

``generate --dry-run`` (and the core's and the service's dry run) ask "what would you do with these
files at this size on this machine?": the same check as a real run (headers read, values checked),
the same planner with the same machine (live, replayed or declared, handed in by the core), and no
worker started. A request that would be refused is an answer here, not an error: ``fits`` is False
and ``refusal``/``hint`` say why and what would fit (a smaller size, a quantized file, more RAM).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Dict, Optional

from ..errors import InsufficientMemoryError
from ..request.check import CheckedGeneration
from .device import MachineMemory
from .plan import MemoryPlan, plan_for_files

__all__ = ["MemoryDecision", "decide"]


@dataclass
class MemoryDecision:
    """The planner's decision for one request on one machine (``plan`` None when nothing fits)."""

    backend: str
    device: str  # gpu | cpu
    machine: str  # where the memory figures come from: live | replay:DIR | declared
    family: str
    width: int
    height: int
    batch: int
    ram_available: Optional[int]
    vram_free: Optional[int]
    fits: bool
    files: Dict[str, str] = dataclasses.field(default_factory=dict)  # field -> file name (never a path)
    plan: Optional[MemoryPlan] = None
    refusal: str = ""  # why nothing fits (the error a real run would raise)
    hint: str = ""  # what would fit


def decide(checked: CheckedGeneration, *, backend: str, gpu: bool, machine: MachineMemory,
           source: str = "live") -> MemoryDecision:
    """The planner's decision for ``checked`` (its files' headers are read; nothing is loaded)."""
    files = checked.files()
    request = checked.request
    options = dataclasses.replace(checked.options, vae_encode=bool(files.init_rgb))  # img2img loads the encoder
    vram = machine.vram_free(backend) if gpu else None
    names = {"model": os.path.basename(files.model.path), **files.names()}
    out = MemoryDecision(backend=backend, device="gpu" if gpu else "cpu", machine=source, family=files.family,
                         width=request.width, height=request.height, batch=request.batch_count,
                         ram_available=machine.ram_available, vram_free=vram, fits=True, files=names)
    try:
        out.plan = plan_for_files([files.model.path, *files.paths.values()], request.width, request.height,
                                  request.batch_count, options, gpu=gpu, ram_free=machine.ram_available,
                                  vram_free=vram)
        out.fits = out.plan.fits
    except InsufficientMemoryError as exc:
        out.fits, out.refusal, out.hint = False, exc.message, exc.hint or ""
    return out
