"""The generation engine: a supervised worker process, the probe model, ``verify`` and ``generate``.

    from accelstack.engine import Runtime, verify, generate, GenerateRequest
    # the engine is given every path (here the caller's Settings' ones); it resolves none itself
    report = verify(Runtime(Path("~/.local/share/accelstack/runtimes/cpu")), settings.verify_dir / "verify-cpu.png",
                    probe_cache=settings.probe_cache, records=settings.verify_dir)
    print(report.verdict, report.reason)

The engine's rooms, each a subpackage named for what lives there:

- ``worker/``: the child process that loads a stack and generates (``python -m
  accelstack.engine.worker.main``, in the runtime's environment) and the protocol both sides speak;
- ``supervision/``: the parent's side of that worker: launch, wait, talk, watch, restart, stop;
- ``models/``: model files read safely (safetensors, GGUF, checkpoints) and the family rules;
- ``loras/``: LoRA names as stable-diffusion.cpp converts them, and whether it can apply them;
- ``request/``: a generate request's inputs and outputs, checked before any worker starts;
- ``probes/``: the synthesized probe models ``verify`` generates with;
- ``memory/``: what a generation needs, what the device has, and the ``auto`` settings that fit;
- ``verification/``: ``verify`` for both stacks.

Beside them: ``generation`` (``generate``: a request from check to PNG), ``config`` (the engine's
options), ``runtime`` (a runtime as the engine sees it), ``png`` and ``errors``. Names are imported
lazily so that the worker, which imports this package, starts without loading the supervisor's
deps. No room or module shares a name with an exported function (``verification`` holds
``verify``, ``generation`` holds ``generate``), so importing one never shadows it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:  # the lazy names below, for type checkers: at run time each loads on first use
    from ..verdict import PixelStats as PixelStats
    from ..verdict import VerifyCheck as VerifyCheck
    from ..verdict import VerifyReport as VerifyReport
    from .config import EngineOptions as EngineOptions
    from .config import apply_overrides as apply_overrides
    from .config import load_config as load_config
    from .errors import CancelledError as CancelledError
    from .errors import ConfigError as ConfigError
    from .errors import EngineError as EngineError
    from .errors import GenerationError as GenerationError
    from .errors import InvalidRequestError as InvalidRequestError
    from .errors import ModelLoadError as ModelLoadError
    from .errors import ProbeModelError as ProbeModelError
    from .errors import RuntimeNotFoundError as RuntimeNotFoundError
    from .errors import WorkerCrashedError as WorkerCrashedError
    from .errors import WorkerStartError as WorkerStartError
    from .generation import GenerateReport as GenerateReport
    from .generation import generate as generate
    from .models.check import check_model as check_model
    from .probes.model import ProbeModel as ProbeModel
    from .probes.model import ensure_probe_model as ensure_probe_model
    from .runtime import Runtime as Runtime
    from .supervision.client import WorkerClient as WorkerClient
    from .supervision.policy import LivenessJudge as LivenessJudge
    from .supervision.policy import RestartRecord as RestartRecord
    from .supervision.policy import SupervisorPolicy as SupervisorPolicy
    from .supervision.process import WorkerProcess as WorkerProcess
    from .supervision.process import kill_tree as kill_tree
    from .supervision.supervisor import Supervisor as Supervisor
    from .verification.probe_verify import verify as verify
    from .verification.torch_verify import verify_torch as verify_torch
    from .worker.protocol import DeviceInfo as DeviceInfo
    from .worker.protocol import GenerateRequest as GenerateRequest
    from .worker.protocol import GenerateResult as GenerateResult
    from .worker.protocol import WorkerStatus as WorkerStatus


_EXPORTS = {
    "Runtime": ".runtime",
    "EngineOptions": ".config",
    "load_config": ".config",
    "apply_overrides": ".config",
    "GenerateRequest": ".worker.protocol",
    "GenerateResult": ".worker.protocol",
    "WorkerStatus": ".worker.protocol",
    "DeviceInfo": ".worker.protocol",
    "Supervisor": ".supervision.supervisor",
    "SupervisorPolicy": ".supervision.policy",
    "LivenessJudge": ".supervision.policy",
    "RestartRecord": ".supervision.policy",
    "WorkerClient": ".supervision.client",
    "WorkerProcess": ".supervision.process",
    "kill_tree": ".supervision.process",
    "ensure_probe_model": ".probes.model",
    "ProbeModel": ".probes.model",
    "verify": ".verification.probe_verify",
    "VerifyReport": "..verdict",
    "VerifyCheck": "..verdict",
    "PixelStats": "..verdict",
    "generate": ".generation",
    "GenerateReport": ".generation",
    "check_model": ".models.check",
    "verify_torch": ".verification.torch_verify",
    "EngineError": ".errors",
    "ConfigError": ".errors",
    "ProbeModelError": ".errors",
    "RuntimeNotFoundError": ".errors",
    "WorkerStartError": ".errors",
    "WorkerCrashedError": ".errors",
    "ModelLoadError": ".errors",
    "GenerationError": ".errors",
    "InvalidRequestError": ".errors",
    "CancelledError": ".errors",
}

__all__ = sorted(_EXPORTS)


if not TYPE_CHECKING:  # a type checker sees the names above, and no others
    __getattr__ = lazy_exports(__name__, _EXPORTS, globals())
