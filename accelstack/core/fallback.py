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
from typing import List, Optional, Sequence

from ..detect.report import HardwareReport
from ..events import ProgressCallback, ProgressEvent, null_progress
from ..installer.transaction import Verifier, VerifyFailed
from ..manifests.plan import Plan
from ..settings import Settings
from .detection import detect
from .lifecycle import InstallSummary, install_runtime
from .planning import TrustedSet, load_manifests, plan

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


def install_with_fallback(report: Optional[HardwareReport] = None, stack: str = "ggml", *, requirements: Sequence[str] = (),
                          backend: Optional[str] = None, settings: Optional[Settings] = None,
                          verifier: Optional[Verifier] = None, force: bool = False, trusted: Optional[TrustedSet] = None,
                          on_progress: Optional[ProgressCallback] = None) -> InstallSummary:
    """Plan and install ``stack``; when the chosen ggml build fails verify, install the next candidate.

    Raises the last :class:`VerifyFailed` (its message naming every abandoned build) when none passes.
    The torch stack and plans that need a local build install as :func:`install_runtime` does.
    ``accelstack install`` goes through :func:`install_plan_with_fallback` with its own plan."""
    s = settings or Settings.resolve()
    progress = on_progress or null_progress
    report = report if report is not None else detect(settings=s)
    if trusted is None and stack == "ggml":
        trusted = load_manifests(s, record=True, progress=progress)
    manifests = trusted.manifests if trusted is not None else None
    first = plan(report, stack, requirements=requirements, backend=backend, settings=s, manifests=manifests, on_progress=progress)
    return install_plan_with_fallback(first, report=report, settings=s, verifier=verifier, force=force, trusted=trusted,
                                      requirements=requirements, on_progress=progress)


def install_plan_with_fallback(first: Plan, *, report: HardwareReport, settings: Settings, verifier: Optional[Verifier] = None,
                               force: bool = False, trusted: Optional[TrustedSet] = None, requirements: Sequence[str] = (),
                               on_progress: Optional[ProgressCallback] = None) -> InstallSummary:
    """Install ``first`` (a plan made with ``trusted``'s manifests); when it is a ready ggml plan whose
    build fails verify, install its next accepted candidates in order (see the module docstring)."""
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
