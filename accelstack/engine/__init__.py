"""The generation engine: a supervised worker process, the probe model, ``verify`` and ``generate``.

    from accelstack.engine import Runtime, verify, generate, GenerateRequest
    # the engine is given every path (here the caller's Settings' ones); it resolves none itself
    report = verify(Runtime(Path("~/.local/share/accelstack/runtimes/cpu")), settings.verify_dir / "verify-cpu.png",
                    probe_cache=settings.probe_cache, records=settings.verify_dir)
    print(report.verdict, report.reason)

The worker (``python -m accelstack.engine.worker``) runs in the runtime's environment and imports
the stack there; everything else runs in the caller's process. Names are imported lazily so
that the worker, which imports this package, starts without loading the supervisor's deps. No
submodule shares a name with an exported function (``verification`` holds ``verify``,
``generation`` holds ``generate``), so importing a submodule never shadows one.
"""
from __future__ import annotations

from ..lazy import lazy_exports

_EXPORTS = {
    "Runtime": ".runtime",
    "EngineOptions": ".config",
    "load_config": ".config",
    "apply_overrides": ".config",
    "GenerateRequest": ".protocol",
    "GenerateResult": ".protocol",
    "WorkerStatus": ".protocol",
    "DeviceInfo": ".protocol",
    "Supervisor": ".supervisor",
    "SupervisorPolicy": ".policy",
    "LivenessJudge": ".policy",
    "RestartRecord": ".policy",
    "WorkerClient": ".client",
    "WorkerProcess": ".process",
    "kill_tree": ".process",
    "ensure_probe_model": ".probe_model",
    "ProbeModel": ".probe_model",
    "verify": ".verification",
    "VerifyReport": "..verdict",
    "VerifyCheck": "..verdict",
    "PixelStats": "..verdict",
    "generate": ".generation",
    "GenerateReport": ".generation",
    "check_model": ".modelfile",
    "verify_torch": ".torch_verification",
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
