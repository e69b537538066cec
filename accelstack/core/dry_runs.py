"""The core's dry run of a generate request: the memory planner's decision on a live, replayed or
declared machine, without loading anything (``generate --dry-run``, ``accelstack.generate(dry_run=True)``,
a service job's ``dry_run``)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from ..engine.config import EngineOptions
from ..engine.errors import InvalidRequestError
from ..engine.memory.device import MachineMemory
from ..engine.memory.dry_run import MemoryDecision, decide
from ..engine.request.check import check_generation
from ..engine.runtime import GGML, Runtime
from ..engine.worker.protocol import GenerateRequest
from ..hardware.protocol import System
from .machine import machine_memory
from .stacks import stack_for_backend

__all__ = ["dry_run"]


def dry_run(request: GenerateRequest, model: Optional[Union[str, Path]], output: Union[str, Path],
            options: Optional[EngineOptions] = None, *, runtime: Optional[Runtime] = None, backend: Optional[str] = None,
            system: Optional[System] = None, machine: Optional[MachineMemory] = None, source: str = "") -> MemoryDecision:
    """What generate would decide for ``request`` (a ``MemoryDecision``): the one check (headers read), then
    the memory planner on ``machine`` (default: ``system``'s, this machine's when None); nothing is loaded,
    no worker starts. ``runtime`` None: planned for ``backend`` (default: a GPU's when one is declared, else cpu)."""
    if runtime is not None and not runtime.traits.memory_estimate:
        raise InvalidRequestError(f"--dry-run plans stable-diffusion.cpp's memory; the {runtime.traits.library} stack "
                                  "manages its own", hint="dry-run with a ggml runtime (--backend cpu, cuda, vulkan...)")
    if runtime is not None:
        backend, gpu = runtime.backend, runtime.is_gpu
    else:
        backend = backend or ("cuda" if machine is not None and machine.gpus else "cpu")
        gpu = backend != "cpu" and stack_for_backend(backend) is None  # a GPU build of the default stack
    checked = check_generation(request, model, output, options, traits=runtime.traits if runtime is not None else GGML)
    if machine is None:
        machine = machine_memory(backend, system)
        source = source or ("live" if system is None else "replay")
    return decide(checked, backend=backend, gpu=gpu, machine=machine, source=source or "declared")
