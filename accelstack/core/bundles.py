"""Offline bundles: one file that installs a ggml runtime (or a torch build) on a machine with no network.

``create_bundle`` (on a machine with network access) and ``install_bundle`` (on the offline one)
dispatch to the bundle's stack driver; the file itself, what it holds and how it is read as
hostile input, is :mod:`accelstack.core.bundle_file`. The bundle carries no trust of its own:
its manifest is checked with the configured channel's keys (or ``--trusted-key``), as online.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, List, Optional, Sequence

from .. import fsio
from ..artifacts.errors import HashMismatchError
from ..errors import Action, UsageError
from ..events import ProgressCallback, ProgressEvent, null_progress
from ..hardware.report import HardwareReport
from ..installer.transaction import Verifier
from ..settings import Settings
from .bundle_file import (
    BundleError,
    BundleSummary,
    OpenedBundle,
    cannot_write,
    check_bundle_path,
    read_bundle,
    write_bundle,
)
from .context import InstallJob, home_of
from .detection import detect
from .installing import install
from .options import InstallOptions, Services
from .results import InstallSummary
from .stacks import driver_of_bundle, stack_names

__all__ = ["create_bundle", "check_bundle_output", "write_bundle", "install_bundle", "read_bundle", "BundleError", "BundleSummary", "OpenedBundle"]


def create_bundle(out: Path, *, settings: Optional[Settings] = None, stack: str = "ggml", backends: Sequence[str] = (),
                  targets: Sequence[str] = (), all_targets: bool = False, report: Optional[HardwareReport] = None,
                  requirements: Sequence[str] = (), python_version: str = "", platforms: Sequence[str] = (),
                  on_progress: Optional[ProgressCallback] = None) -> BundleSummary:
    """Write the bundle ``out`` for ``stack``. ggml, from the active channel: the targets named by
    id, every target of ``backends``, every target (``all_targets``), or else the one this machine
    (``report``) would install. torch: the wheels of the torch plan for ``report`` (``requirements``,
    at most one of ``backends``) for the target's Python (``python_version``, default: the torch
    target's) and ``platforms`` (pip platform tags, default: this machine's)."""
    s = settings or Settings.resolve()
    found = driver_of_bundle(stack)
    if found is None:
        raise UsageError(f"unknown stack {str(stack)[:40]!r}", f"make a bundle of one of {', '.join(stack_names())}")
    check_bundle_output(Path(out))  # before any download: a directory or a device is refused, never replaced
    return found.create_bundle(Path(out), s, report, backends=backends, targets=targets, all_targets=all_targets,
                               requirements=requirements, python_version=python_version, platforms=platforms,
                               progress=on_progress or null_progress)


def check_bundle_output(out: Path) -> None:
    """``out`` must be absent or a regular file (replaced whole at the end) in a folder that takes
    a new file (:func:`fsio.output_problem`): anything else is a usage error, said before the work."""
    problem = fsio.output_problem(out)
    if problem is not None:
        reason, hint = problem
        if reason.startswith("it "):  # the path itself: say what to name instead
            hint = "name the bundle file to write, for example -o runtime.tar; an existing regular file is replaced, nothing else is"
        raise cannot_write(out, reason, hint)


def install_bundle(path: Path, *, settings: Optional[Settings] = None, report: Optional[HardwareReport] = None,
                   backend: Optional[str] = None, verifier: Optional[Verifier] = None, force: bool = False,
                   services: Optional[Services] = None, on_progress: Optional[ProgressCallback] = None) -> InstallSummary:
    """Install from the bundle ``path``, with no network: its stack's driver checks what it holds
    as an online install would (signature, envelope, expiry, rollback; every artifact hashed), its
    artifacts written only once its documents are trusted, then installs it with the usual
    transaction (verify before activate)."""
    s = settings or Settings.resolve()
    progress = on_progress or null_progress
    svc = services or Services()
    check_bundle_path(Path(path))  # a directory or a FIFO is said before a home is made or hardware probed
    report = report if report is not None else detect(svc.system, settings=s)
    home_of(s).ensure()
    s.cache.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=".bundle-", dir=str(s.cache)))
    closing: List[OpenedBundle] = []
    try:
        progress(ProgressEvent("message", "bundle", message=f"reading bundle {path}"))
        t0 = time.perf_counter()
        opened = read_bundle(Path(path), root)  # its documents; the driver extracts the artifacts it trusts
        closing.append(opened)
        stack: Any = opened.index.get("stack", "ggml")
        found = driver_of_bundle(stack)
        if found is None:
            raise BundleError(f"{path} is a bundle of the {str(stack)[:40]!r} stack, which this accelstack does not install",
                              "update accelstack", action=Action.UPDATE_ACCELSTACK)
        job = InstallJob(report, s, InstallOptions(force=force, verifier=verifier), svc, progress)
        try:
            return found.install_bundle(opened, str(path), job, backend, time.perf_counter() - t0, install)
        except HashMismatchError as exc:  # the bundle's own bytes: another try reads the same file
            err = HashMismatchError(exc.message, expected=exc.expected, actual=exc.actual, hint=(
                f"the bundle {path} was changed or damaged after it was made: copy it again from where it was made "
                "(the sha256 `bundle create` printed tells a good copy), or make it again"))
            err.action = Action.FIX_INPUT
            raise err from None
    finally:
        for each in closing:
            each.close()
        shutil.rmtree(root, ignore_errors=True)
