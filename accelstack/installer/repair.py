"""Re-hash an installed runtime against its receipt and restore what is missing or corrupt.

The wheel is installed again into a fresh staging directory (the install is deterministic, so
every file, package metadata included, comes back byte-identical) and only the damaged files are
copied over, each atomically. One file that cannot be restored does not stop the others.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

from .. import fsio
from ..artifacts.cache import hash_file
from ..errors import Action
from ..events import ProgressCallback, ProgressEvent, null_progress
from ..refs import ArtifactRef
from ..verdict import VerifyReport
from .errors import StateError
from .home import Home
from .records import Receipt, now_iso
from .transaction import StagedRuntime, Verifier
from .wheel import install_wheel

__all__ = ["RepairReport", "Fetcher", "audit", "missing_files", "repair_ggml", "unrepairable_error"]

log = logging.getLogger(__name__)


@dataclass
class RepairReport:
    runtime: str
    checked: int = 0
    missing: List[str] = field(default_factory=list)
    corrupt: List[str] = field(default_factory=list)
    fixed: List[str] = field(default_factory=list)
    unrepairable: Dict[str, str] = field(default_factory=dict)  # file -> why it could not be restored
    pointer_rebuilt: bool = False  # active.json was damaged and rebuilt from the receipts
    verification: Optional[VerifyReport] = None

    __derived__ = ("healthy",)

    @property
    def healthy(self) -> bool:
        return not self.missing and not self.corrupt


def audit(home: Home, rid: str, progress: ProgressCallback = null_progress) -> RepairReport:
    """Re-hash every installed file against the receipt."""
    receipt = home.read_receipt(rid)
    root = home.runtime_path(receipt)
    report = RepairReport(runtime=rid)
    progress(ProgressEvent("start", "repair", task=rid, total=len(receipt.files), message="checking installed files"))
    for i, f in enumerate(receipt.files):
        p = root / f.path
        report.checked += 1
        if not p.is_file() or p.is_symlink():
            report.missing.append(f.path)
        elif p.stat().st_size != f.size or hash_file(p).hexdigest() != f.sha256:
            report.corrupt.append(f.path)
        progress(ProgressEvent("advance", "repair", task=rid, done=i + 1, total=len(receipt.files)))
    progress(ProgressEvent("end", "repair", task=rid, ok=report.healthy))
    return report


def missing_files(home: Home, receipt: Receipt) -> List[str]:
    """The cheap check for ``status``: which recorded files do not exist (no hashing)."""
    root = home.runtime_path(receipt)
    return [f.path for f in receipt.files if not (root / f.path).is_file()]


Fetcher = Callable[[ArtifactRef], Path]  # returns the verified wheel file (from the cache, or downloaded)


def repair_ggml(home: Home, rid: str, fetch_wheel: Fetcher, verifier: Verifier,
                progress: ProgressCallback = null_progress) -> RepairReport:
    """Restore the missing and corrupt files of runtime ``rid`` and verify it again."""
    report = audit(home, rid, progress)
    receipt = home.read_receipt(rid)
    root = home.runtime_path(receipt)
    if not report.healthy:
        wheel = next((a for a in receipt.artifacts if a.name.endswith(".whl")), None)
        damaged = report.missing + report.corrupt
        if wheel is None:
            report.unrepairable = {p: "the receipt names no wheel to restore it from" for p in damaged}
        else:
            progress(ProgressEvent("message", "repair", task=rid, message=f"restoring {len(damaged)} damaged file(s) from {wheel.name}"))
            _restore(home, rid, root, wheel, fetch_wheel, {f.path: f.sha256 for f in receipt.files}, damaged, report)
    staged = StagedRuntime(stack=receipt.stack, backend=receipt.backend, path=root, env=dict(receipt.env))
    progress(ProgressEvent("message", "repair", task=rid, message="checking that the runtime still works (probe generation)"))
    report.verification = verifier(staged, progress)
    receipt.verified_at = now_iso()
    receipt.verification = report.verification
    home.write_receipt(receipt)
    return report


def _restore(home: Home, rid: str, root: Path, wheel: ArtifactRef, fetch_wheel: Fetcher, expected: Dict[str, str],
             damaged: List[str], report: RepairReport) -> None:
    try:
        path = fetch_wheel(wheel)
    except Exception as exc:  # offline, gone from every mirror: say so per file, keep going
        msg = getattr(exc, "message", str(exc))
        report.unrepairable = {p: f"the wheel could not be fetched: {msg}" for p in damaged}
        return
    stage = home.make_owned_dir(home.staging, f"repair-{rid}.{os.getpid()}")
    try:
        install_wheel(path, stage, wheel.name)
        for rel in damaged:
            src = stage / rel
            try:
                if not src.is_file() or hash_file(src).hexdigest() != expected[rel]:
                    report.unrepairable[rel] = "the wheel no longer produces this file"
                    continue
                fsio.copy_file(src, root / rel, make_parents=True)  # streamed: a CUDA library is hundreds of MB
                report.fixed.append(rel)
            except OSError as exc:
                report.unrepairable[rel] = exc.strerror or str(exc)
    finally:
        home.remove_owned(stage)
    if report.unrepairable:
        log.warning("repair of %s: %d file(s) could not be restored", rid, len(report.unrepairable))


def unrepairable_error(report: RepairReport) -> StateError:
    first = next(iter(report.unrepairable.items()))
    return StateError(f"{len(report.unrepairable)} file(s) of runtime {report.runtime} could not be restored "
                      f"(first: {first[0]}: {first[1]})", hint="reinstall the runtime", action=Action.REINSTALL)
