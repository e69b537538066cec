"""The checks a runtime must pass before it is activated, built from the engine for the installer.

The installer never imports the engine (it stands before it in the pipeline); the core hands it
one of these. The default is the real thing: a generation on the probe model (ggml) or torch
operations plus a diffusers step in the target interpreter (torch). ``import_verifier`` is the
cheap check (the library loads), for callers that explicitly cannot afford a generation. Each
stack's driver builds its own; these pick the driver by the staged runtime's stack.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ..events import ProgressCallback
from ..installer.transaction import StagedRuntime, Verifier
from ..settings import Settings
from ..verdict import VerifyReport
from .stacks import driver

__all__ = ["default_verifier", "import_verifier"]


def default_verifier(settings: Optional[Settings] = None, output: Optional[Path] = None, **engine: Any) -> Verifier:
    """The engine's generation check for ggml runtimes, the torch check for torch environments.

    ``engine`` goes to :func:`accelstack.engine.verify` (options, cpu_runtime, tolerance, probe_seed)."""
    s = settings or Settings.resolve()

    def check(staged: StagedRuntime, progress: ProgressCallback) -> VerifyReport:
        return driver(staged.stack).verifier(s, output, engine)(staged, progress)

    return check


def import_verifier(timeout: float = 120) -> Verifier:
    """The cheap check: the bindings import and their native library loads, in a fresh process
    (ggml), or torch imports as the planned build and sees its device (torch). No generation."""

    def check(staged: StagedRuntime, progress: ProgressCallback) -> VerifyReport:
        return driver(staged.stack).import_verifier(timeout)(staged, progress)

    return check
