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
from typing import Callable, List, Optional

from ..events import ProgressCallback, ProgressEvent, null_progress
from ..installer.errors import VerifyFailed
from ..manifests.plan import Plan
from .results import InstallSummary

__all__ = ["MAX_TRIES", "Abandoned", "fallback_order", "install_with_fallback"]

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


def install_with_fallback(first: Plan, attempt: Callable[[Plan], InstallSummary], replan: Callable[[str], Plan],
                          progress: ProgressCallback = null_progress) -> InstallSummary:
    """Install ``first`` (a ready plan) with ``attempt``; when its build fails verify, plan each of
    its next accepted candidates with ``replan(variant)`` and install them in order (see the module
    docstring). The install flow (:func:`accelstack.core.installing.install`) passes both in."""
    order = [first.variant] + fallback_order(first)
    abandoned: List[Abandoned] = []
    last: Optional[VerifyFailed] = None
    for i, variant in enumerate(order[:MAX_TRIES]):
        p = first if i == 0 else replan(variant)
        if not p.ok or p.variant != variant:
            continue
        p.notes = [a.note() for a in abandoned] + p.notes
        try:
            summary = attempt(p)
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
