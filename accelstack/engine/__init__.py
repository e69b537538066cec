"""The generation engine: a supervised worker process, the probe model, ``verify`` and ``generate``.

    from accelstack.engine import Runtime, verify, generate, GenerateRequest
    report = verify(Runtime(Path("~/.local/share/accelstack/runtimes/cpu")))
    print(report.verdict, report.reason)

The worker (``python -m accelstack.engine.worker``) runs in the runtime's environment and imports
the stack there; everything else runs in the caller's process. Names are imported lazily so
that the worker, which imports this package, starts without loading the supervisor's deps.
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
    "SupervisorPolicy": ".supervisor",
    "ensure_probe_model": ".probe_model",
    "ProbeModel": ".probe_model",
    "verify": ".verify",
    "VerifyReport": ".verify",
    "generate": ".generate",
    "GenerateReport": ".generate",
    "check_model": ".modelfile",
    "verify_torch": ".torch_check",
    "TorchVerifyReport": ".torch_check",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'accelstack.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
