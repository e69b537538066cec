"""What the core's jobs return, shared by the install flow and the stack drivers: the summary of
an install, or the error that says why nothing here can make it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from ..errors import Action, NotPossibleHere
from ..installer.records import Receipt
from ..manifests.plan import Plan

__all__ = ["InstallSummary", "not_possible"]


@dataclass
class InstallSummary:
    """What ``install`` did; ``receipt`` is None only for a dry run."""

    stack: str
    runtime: str
    changed: bool
    plan: Plan
    receipt: Optional[Receipt] = None
    previous: str = ""
    timings: dict = field(default_factory=dict)  # seconds, each named for what it measured
    recovered: List[str] = field(default_factory=list)
    built_locally: bool = False
    dry_run: bool = False
    would_build: str = ""  # dry run: the variant that would be compiled first
    notes: List[str] = field(default_factory=list)  # said once to the user ("no channel is configured ...")
    would: List[str] = field(default_factory=list)  # dry run: each step it would take, in order, in words
    reinstalled: bool = False  # --force over the active runtime: the same id again, so there is no "previous"


def not_possible(plan: Plan) -> NotPossibleHere:
    """The error for a plan that nothing here can satisfy (a forced backend with no device for it)."""
    why = [c.reason for c in plan.candidates if not c.accepted and c.code != "forced-backend"][:3]
    runs = sorted({c.backend for c in plan.candidates if c.code == "forced-backend"})
    hint = "; ".join(why) or "no device of this machine runs it"
    if plan.request.backend:
        hint += (f"; this machine runs: {', '.join(runs)}" if runs else "") + \
            "; leave the backend unset (no --backend, no ACCELSTACK_BACKEND) to let the plan choose"
    return NotPossibleHere(f"cannot install here: {plan.summary}", hint, action=Action.EXPLAIN_PLAN)
