"""The one install transaction, for every stack: stage -> verify -> commit -> switch.

Shaped like PyPA's ``installer``: ``install(plan, source, destination, verifier)``. A *source*
says what to install (a fetched wheel, a list of pip commands); a *destination* knows how to
stage it without touching what is live, how to commit it and how to undo it (a ggml runtime
directory under the home, a torch Python environment); the *verifier* is handed in by the caller
(the core passes the engine's real generation check), so the installer never imports the engine.

A crash or an error at any point leaves the previous runtime active: nothing live changes before
the verifier has said PASS, the receipt is replaced atomically, and ``active.json`` is switched
last, atomically.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Protocol

from ..events import ProgressCallback, ProgressEvent, null_progress
from ..manifests.plan import Plan
from ..verdict import VerifyReport
from .errors import VerifyFailed
from .home import Home
from .records import InstalledFile, Receipt, now_iso, stamp_files

__all__ = ["StagedRuntime", "Verifier", "Destination", "Provenance", "InstallOutcome", "install"]

log = logging.getLogger(__name__)


@dataclass
class StagedRuntime:
    """A runtime that is installed but not live yet: what a verifier checks."""

    stack: str
    backend: str
    path: Path  # ggml: the staging directory (an import root); torch: the target interpreter
    env: Dict[str, str] = field(default_factory=dict)
    python: str = ""  # the interpreter that runs it ("" = this one)
    handle: Any = None  # the destination's own bookkeeping (an undo log)


Verifier = Callable[[StagedRuntime, ProgressCallback], VerifyReport]


class Destination(Protocol):
    """Where a runtime goes; see the module docstring."""

    stack: str

    def stage(self, plan: Plan, source: Any, progress: ProgressCallback) -> StagedRuntime: ...

    def files(self, staged: StagedRuntime) -> List[InstalledFile]: ...

    def commit(self, staged: StagedRuntime, receipt: Receipt) -> Optional[Path]:
        """Make the staged runtime permanent and write its receipt (``receipt.path`` is set here).
        Returns a superseded directory to retire after the switch, if any."""

    def abort(self, staged: StagedRuntime) -> None: ...

    def retire(self, old: Path) -> None: ...


@dataclass
class Provenance:
    """Where the plan came from, for the receipt."""

    manifest_source: str = ""
    manifest_version: int = 0
    hardware_fingerprint: str = ""
    channel: str = ""  # the configured channel the manifest was read from ("" for --manifest URLs and local builds)
    manifest_url: str = ""  # where that manifest was read
    package: str = ""  # the distribution installed ("stable-diffusion-cpp-python", "torch")
    package_version: str = ""


@dataclass
class InstallOutcome:
    receipt: Receipt
    changed: bool  # False: it was already installed and active (a no-op)
    previous: str = ""
    timings: Dict[str, float] = field(default_factory=dict)  # seconds per step, each named for what it measured


def install(plan: Plan, source: Any, destination: Destination, verifier: Verifier, *, home: Home, runtime_id: str,
            provenance: Optional[Provenance] = None, activate: bool = True,
            progress: ProgressCallback = null_progress) -> InstallOutcome:
    """Install ``source`` for ``plan`` into ``destination``; the caller holds the home's lock."""
    prov = provenance or Provenance()
    timings: Dict[str, float] = {}
    t = time.perf_counter()
    staged = destination.stage(plan, source, progress)
    timings["stage"] = time.perf_counter() - t
    retired: Optional[Path] = None
    try:
        t = time.perf_counter()
        files = destination.files(staged)
        if staged.path.is_dir():  # a runtime directory (ggml): a rename into place keeps these, so status can compare them
            stamp_files(staged.path, files)
        timings["hash"] = time.perf_counter() - t
        t = time.perf_counter()
        progress(ProgressEvent("message", "install", task=runtime_id, message="checking that the runtime works before activating it"))
        report = verifier(staged, progress)
        timings["verify"] = time.perf_counter() - t
        if not report.ok:
            raise VerifyFailed(f"the new runtime does not work on this machine: {report.reason}", report,
                               hint="nothing was changed; the chosen build may not fit this machine")
        receipt = Receipt(id=runtime_id, stack=plan.stack, backend=plan.backend, path="", plan=plan,
                          manifest_source=prov.manifest_source, manifest_version=prov.manifest_version,
                          channel=prov.channel, manifest_url=prov.manifest_url, package=prov.package,
                          package_version=prov.package_version,
                          artifacts=list(plan.artifacts), files=files, hardware_fingerprint=prov.hardware_fingerprint,
                          env=dict(plan.env), installed_at=now_iso(), verified_at=now_iso(), verification=report)
        retired = destination.commit(staged, receipt)
    except BaseException:
        log.info("install of %s failed; undoing the staged runtime", runtime_id)
        destination.abort(staged)
        raise
    previous = home.read_active().active.get(plan.stack, "")
    if activate:
        home.set_active(plan.stack, runtime_id)
    if retired is not None:
        destination.retire(retired)
    progress(ProgressEvent("end", "install", task=runtime_id, ok=True, message=f"runtime {runtime_id} installed"))
    return InstallOutcome(receipt, changed=True, previous=previous if previous != runtime_id else "", timings=timings)
