"""accelstack: find the accelerator, pick the runtime that runs on it, install it safely, prove it works.

    import accelstack
    report  = accelstack.detect()                             # or detect(ReplaySystem(dir))
    plan    = accelstack.plan(report, stack="ggml")           # or stack="torch", requirements=[...]
    receipt = accelstack.install(plan, on_progress=callback)  # stage -> engine verify -> switch
    result  = accelstack.verify(receipt)                      # VerifyReport; result.ok
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

import sys as _sys  # noqa: E402
import types as _types  # noqa: E402
from typing import TYPE_CHECKING as _TYPE_CHECKING  # noqa: E402
from typing import Any as _Any  # noqa: E402

from .lazy import lazy_exports  # noqa: E402

if _TYPE_CHECKING:
    from .core.detection import detect


class _Package(_types.ModuleType):
    """``accelstack.detect`` is the function, imported on first use (detection's modules take
    50 ms to import, which every command would pay). ``detect`` is also a subpackage: importing it
    makes the import system assign the subpackage to this name, which the setter ignores, so the
    name stays the function whatever was imported first."""

    @property
    def detect(self) -> _Any:
        from .core.detection import detect

        return detect

    @detect.setter
    def detect(self, value: object) -> None:
        pass


_sys.modules[__name__].__class__ = _Package

_EXPORTS = {
    # the core: one function per job, both stacks
    "plan": "accelstack.core.planning",
    "install": "accelstack.core.lifecycle",
    "install_runtime": "accelstack.core.lifecycle",
    "plan_and_install": "accelstack.core.lifecycle",
    "InstallSummary": "accelstack.core.lifecycle",
    "upgrade": "accelstack.core.lifecycle",
    "repair": "accelstack.core.lifecycle",
    "rollback": "accelstack.core.lifecycle",
    "uninstall": "accelstack.core.lifecycle",
    "gc": "accelstack.core.lifecycle",
    "status": "accelstack.core.lifecycle",
    "verify": "accelstack.core.running",
    "generate": "accelstack.core.running",
    "default_verifier": "accelstack.core.verifiers",
    "import_verifier": "accelstack.core.verifiers",
    # the data that crosses stages
    "Settings": "accelstack.settings",
    "HardwareReport": "accelstack.detect.report",
    "LiveSystem": "accelstack.detect.system",
    "ReplaySystem": "accelstack.detect.system",
    "CapturingSystem": "accelstack.detect.system",
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
    "resolve": "accelstack.manifests.resolve",
    "Manifests": "accelstack.manifests.resolve",
    "fetch": "accelstack.artifacts",
}

__all__ = ["__version__", "detect", *_EXPORTS]


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())
