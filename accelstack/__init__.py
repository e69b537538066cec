"""accelstack: find the accelerator, pick the runtime that runs on it, install it safely, prove it works.

    import accelstack
    report  = accelstack.detect()                             # or detect(ReplaySystem(dir))
    plan    = accelstack.plan(report, stack="ggml")           # or stack="torch", requirements=[...]
    summary = accelstack.install(plan, on_progress=callback)  # stage -> engine verify -> switch
    result  = accelstack.verify(summary.receipt)              # VerifyReport; result.ok
    accelstack.status(), accelstack.repair(), accelstack.upgrade(), accelstack.rollback()
    accelstack.generate(model, prompt, "out.png")

Every function takes ``settings=Settings.resolve(...)`` and ``on_progress=callback``; errors are
``AccelstackError`` subclasses with a ``code`` and a structured hint (``action``, ``hint``).
Names are imported on first use, so the CLI pays only for the command it runs.
"""
from __future__ import annotations

__version__ = "0.1.0"

import logging as _logging

# The library logs diagnostics and never prints: without a handler of the app's own, nothing shows.
_logging.getLogger("accelstack").addHandler(_logging.NullHandler())

from .lazy import lazy_exports  # noqa: E402

_EXPORTS = {
    # the core: one function per job, both stacks
    "detect": "accelstack.core.detection",
    "plan": "accelstack.core.planning",
    "install": "accelstack.core.installing",
    "InstallSummary": "accelstack.core.results",
    "InstallOptions": "accelstack.core.options",
    "Services": "accelstack.core.options",
    "upgrade": "accelstack.core.maintenance",
    "repair": "accelstack.core.maintenance",
    "rollback": "accelstack.core.maintenance",
    "uninstall": "accelstack.core.maintenance",
    "gc": "accelstack.core.maintenance",
    "status": "accelstack.core.maintenance",
    "verify": "accelstack.core.running",
    "generate": "accelstack.core.running",
    "inspect_model": "accelstack.core.models",
    "inspect_models": "accelstack.core.models",
    "ModelInspection": "accelstack.core.models",
    "default_verifier": "accelstack.core.verifiers",
    "import_verifier": "accelstack.core.verifiers",
    # the data that crosses stages
    "Settings": "accelstack.settings",
    "HardwareReport": "accelstack.hardware.report",
    "LiveSystem": "accelstack.hardware.system",
    "ReplaySystem": "accelstack.hardware.system",
    "CapturingSystem": "accelstack.hardware.system",
    "Request": "accelstack.manifests.plan",
    "Plan": "accelstack.manifests.plan",
    "Receipt": "accelstack.installer.records",
    "VerifyReport": "accelstack.verdict",
    "ProgressEvent": "accelstack.events",
    "ArtifactRef": "accelstack.refs",
    # errors
    "AccelstackError": "accelstack.errors",
    "Action": "accelstack.errors",
    # lower-level stage functions
    "resolve": "accelstack.manifests.resolver",
    "Manifests": "accelstack.manifests.resolver",
    "fetch": "accelstack.artifacts",
}

__all__ = ["__version__", *_EXPORTS]


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())
