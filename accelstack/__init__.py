"""accelstack: find the accelerator, pick the runtime that runs on it, install it safely, prove it works.

    import accelstack
    report  = accelstack.detect()                             # or detect(ReplaySystem(dir))
    plan    = accelstack.plan(report, stack="ggml")           # or stack="torch", requirements=[...]
    summary = accelstack.install(plan, on_progress=callback)  # stage -> engine verify -> switch
    result  = accelstack.verify(summary.receipt)              # VerifyReport; result.ok
    accelstack.status(), accelstack.repair(), accelstack.upgrade(), accelstack.rollback()
    accelstack.generate(model, prompt, "out.png")
    with accelstack.open_session(model) as s: s.generate(prompt, "a.png", seed=1); s.generate(prompt, "b.png", seed=2)

Every function takes ``settings=Settings.resolve(...)`` and ``on_progress=callback``; errors are
``AccelstackError`` subclasses with a ``code`` and a structured hint (``action``, ``hint``).
Names are imported on first use, so the CLI pays only for the command it runs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"

import logging as _logging

# The library logs diagnostics and never prints: without a handler of the app's own, nothing shows.
_logging.getLogger("accelstack").addHandler(_logging.NullHandler())

from .lazy import lazy_exports  # noqa: E402

if TYPE_CHECKING:  # the lazy names below, for type checkers: at run time each loads on first use
    from accelstack.artifacts import fetch as fetch
    from accelstack.core.detection import detect as detect
    from accelstack.core.installing import install as install
    from accelstack.core.maintenance import gc as gc
    from accelstack.core.maintenance import repair as repair
    from accelstack.core.maintenance import rollback as rollback
    from accelstack.core.maintenance import uninstall as uninstall
    from accelstack.core.maintenance import upgrade as upgrade
    from accelstack.core.models import ModelInspection as ModelInspection
    from accelstack.core.models import inspect_model as inspect_model
    from accelstack.core.models import inspect_models as inspect_models
    from accelstack.core.options import InstallOptions as InstallOptions
    from accelstack.core.options import Services as Services
    from accelstack.core.planning import plan as plan
    from accelstack.core.results import InstallSummary as InstallSummary
    from accelstack.core.running import generate as generate
    from accelstack.core.running import verify as verify
    from accelstack.core.session import GenerationSession as GenerationSession
    from accelstack.core.session import open_session as open_session
    from accelstack.core.status_check import status as status
    from accelstack.core.verifiers import default_verifier as default_verifier
    from accelstack.core.verifiers import import_verifier as import_verifier
    from accelstack.errors import AccelstackError as AccelstackError
    from accelstack.errors import Action as Action
    from accelstack.events import ProgressEvent as ProgressEvent
    from accelstack.hardware.report import HardwareReport as HardwareReport
    from accelstack.hardware.system import CapturingSystem as CapturingSystem
    from accelstack.hardware.system import LiveSystem as LiveSystem
    from accelstack.hardware.system import ReplaySystem as ReplaySystem
    from accelstack.installer.records import Receipt as Receipt
    from accelstack.manifests.plan import Plan as Plan
    from accelstack.manifests.plan import Request as Request
    from accelstack.manifests.resolver import Manifests as Manifests
    from accelstack.manifests.resolver import resolve as resolve
    from accelstack.refs import ArtifactRef as ArtifactRef
    from accelstack.settings import Settings as Settings
    from accelstack.verdict import VerifyReport as VerifyReport


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
    "status": "accelstack.core.status_check",
    "verify": "accelstack.core.running",
    "generate": "accelstack.core.running",
    "open_session": "accelstack.core.session",
    "GenerationSession": "accelstack.core.session",
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


if not TYPE_CHECKING:  # a type checker sees the names above, and no others
    __getattr__ = lazy_exports(__name__, _EXPORTS, globals())
