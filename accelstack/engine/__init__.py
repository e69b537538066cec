"""The generation engine: a supervised worker process, the probe model, ``verify`` and ``generate``.

    from accelstack.engine import Runtime, verify, generate, GenerateRequest
    report = verify(Runtime(Path("~/.local/share/accelstack/runtimes/cpu")))
    print(report.verdict, report.reason)

The worker (``python -m accelstack.engine.worker``) runs in the runtime's environment and imports
the stack there; everything else runs in the caller's process. Names are imported lazily so
that the worker, which imports this package, starts without loading the supervisor's deps. No
submodule shares a name with an exported function (``verification`` holds ``verify``,
``generation`` holds ``generate``), so importing a submodule never shadows one.
"""
from __future__ import annotations

import importlib
from typing import Any

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
    "runtime_check": ".verification",
    "VerifyReport": ".verification",
    "VerifyCheck": ".verification",
    "PixelStats": ".verification",
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
    "VerifyFailedError": ".errors",
    "CancelledError": ".errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'accelstack.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
