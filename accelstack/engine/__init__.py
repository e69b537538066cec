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

from ..lazy import lazy_exports

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


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())
