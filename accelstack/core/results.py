"""What the core's jobs return, shared by the install flow and the stack drivers."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from ..installer.records import Receipt
from ..manifests.plan import Plan

__all__ = ["InstallSummary"]


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
