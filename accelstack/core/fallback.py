"""Install with fallback: a build that fails the engine's verify here gives way to the next candidate.

A GPU build can install cleanly and still not work on a machine: its driver is missing or broken,
its runtime silently falls back to the CPU, it crashes in the first graph. ``verify`` catches that
before activation (the transaction undoes the staged runtime); this module then tries the plan's
next accepted candidate, in the plan's own order (CUDA, ROCm, then Vulkan, then the CPU builds),
until one passes. Why each build was abandoned goes into the notes of the plan that was finally
installed, so the receipt (which keeps that plan) and the result both say it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence

from ..hardware.report import HardwareReport
from ..events import ProgressCallback, ProgressEvent, null_progress
from ..installer.transaction import Verifier, VerifyFailed
from ..manifests.plan import Plan
from ..settings import Settings
from .planning import TrustedSet, plan

if TYPE_CHECKING:
    from .lifecycle import InstallSummary

MAX_TRIES = 4  # each try stages a runtime and verifies it (a generation): bound the time a bad machine costs


@dataclass
class Abandoned:
    """A build that was installed, failed its check here, and was undone."""

    variant: str
    backend: str
    reason: str

    def note(self) -> str:
        return f"{self.variant} ({self.backend}) was abandoned: it failed verify on this machine: {self.reason}"


def fallback_order(chosen: Plan) -> List[str]:
    """The variants to try after the chosen one: the plan's other accepted candidates, in its order."""
    out: List[str] = []
    for c in chosen.candidates:
        if c.accepted and not c.chosen and c.name != chosen.variant and c.name not in out:
            out.append(c.name)
    return out


def install_plan_with_fallback(first: Plan, install_runtime: Callable[..., InstallSummary], *, report: HardwareReport,
                               settings: Settings, verifier: Optional[Verifier] = None, force: bool = False,
                               trusted: Optional[TrustedSet] = None, requirements: Sequence[str] = (),
                               on_progress: Optional[ProgressCallback] = None) -> InstallSummary:
    """Install ``first`` (a plan made with ``trusted``'s manifests) with ``install_runtime`` (the
    lifecycle's, passed in by :func:`~accelstack.core.lifecycle.plan_and_install`, which is how
    ``accelstack install`` and ``upgrade`` get here); when it is a ready ggml plan whose build fails
    verify, install its next accepted candidates in order (see the module docstring)."""
    s, progress = settings, on_progress or null_progress
    if first.stack != "ggml" or not first.ok:
        return install_runtime(first, report=report, settings=s, verifier=verifier, force=force, trusted=trusted,
                               on_progress=progress)
    manifests = trusted.manifests if trusted is not None else None
    order = [first.variant] + fallback_order(first)
    abandoned: List[Abandoned] = []
    last: Optional[VerifyFailed] = None
    for i, variant in enumerate(order[:MAX_TRIES]):
        p = first if i == 0 else plan(report, "ggml", requirements=requirements, backend=variant, settings=s,
                                      manifests=manifests, on_progress=progress)
        if not p.ok or p.variant != variant:
            continue
        p.notes = [a.note() for a in abandoned] + p.notes
        try:
            summary = install_runtime(p, report=report, settings=s, verifier=verifier, force=force, trusted=trusted,
                                      on_progress=progress)
        except VerifyFailed as exc:
            last = exc
            gone = Abandoned(variant, p.backend, exc.report.reason or exc.message)
            abandoned.append(gone)
            progress(ProgressEvent("message", "install", task=variant, message=gone.note()))
            continue
        summary.notes = [a.note() for a in abandoned] + summary.notes
        return summary
    assert last is not None  # the first plan is ready, so its try ran
    if len(abandoned) == 1:
        raise last
    raise VerifyFailed("no build of the plan works on this machine: " + "; ".join(a.note() for a in abandoned), last.report,
                       hint=last.hint)
