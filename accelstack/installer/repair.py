"""Check an installed runtime against its receipt and restore what is missing or corrupt.

``check_files`` is the one check: cheap (size, mtime and inode against what the receipt recorded
when each file was hashed, as the verified-blob cache does) for ``status``, or deep (every file
re-hashed) for ``status --deep`` and ``repair``. To restore, the wheel is installed again into a
fresh staging directory (the install is deterministic, so every file, package metadata included,
comes back byte-identical) and only the damaged files are copied over, each atomically. One file
that cannot be restored does not stop the others.
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
from ..serde import plural
from ..verdict import VerifyReport
from . import cuda_libs
from .errors import StateError
from .file_checks import FileCheck, check_files, check_shared
from .home import Home
from .records import Receipt, now_iso
from .transaction import StagedRuntime, Verifier
from .wheel import install_wheel

__all__ = ["RepairReport", "FileCheck", "Fetcher", "check_files", "check_shared", "audit", "missing_files", "repair_ggml",
           "unrepairable_error"]

log = logging.getLogger(__name__)


@dataclass
class RepairReport:
    runtime: str
    checked: int = 0
    missing: List[str] = field(default_factory=list)
    corrupt: List[str] = field(default_factory=list)
    fixed: List[str] = field(default_factory=list)
    unrepairable: Dict[str, str] = field(default_factory=dict)  # file -> why it could not be restored
    pointer_rebuilt: bool = False  # active.json was damaged and rebuilt (from its last good copy, else the receipts)
    verification: Optional[VerifyReport] = None
    active: str = ""  # the runtime active after the repair (the one repaired)
    active_reason: str = ""  # why that one, in words: repair never switches runtimes without saying so

    __derived__ = ("healthy",)

    @property
    def healthy(self) -> bool:
        return not self.missing and not self.corrupt


def audit(home: Home, rid: str, progress: ProgressCallback = null_progress) -> RepairReport:
    """Re-hash every installed file against the receipt."""
    receipt = home.read_receipt(rid)
    found = check_files(home, receipt, deep=True, stage="repair", progress=progress)
    return RepairReport(runtime=rid, checked=found.files, missing=found.missing, corrupt=found.corrupt)


def missing_files(home: Home, receipt: Receipt) -> List[str]:
    """Which recorded files do not exist (no hashing)."""
    return check_files(home, receipt, deep=False).missing


Fetcher = Callable[[ArtifactRef], Path]  # returns the verified wheel file (from the cache, or downloaded)


def repair_ggml(home: Home, rid: str, fetch_wheel: Fetcher, verifier: Verifier,
                progress: ProgressCallback = null_progress) -> RepairReport:
    """Restore the missing and corrupt files of runtime ``rid`` and verify it again; the receipt
    records the stat of every file found intact or restored, so ``status`` can trust it again."""
    report = audit(home, rid, progress)
    receipt = home.read_receipt(rid)
    root = home.runtime_path(receipt)
    shared = check_shared(home, receipt, deep=True, stage="repair", progress=progress)
    if not report.healthy:
        libs = {a.sha256 for a in cuda_libs.shared_refs(receipt)}
        wheel = next((a for a in receipt.artifacts if a.name.endswith(".whl") and a.sha256 not in libs), None)
        damaged = report.missing + report.corrupt
        if wheel is None:
            report.unrepairable = {p: "the receipt names no wheel to restore it from" for p in damaged}
        else:
            progress(ProgressEvent("message", "repair", task=rid, message=f"restoring {_files(len(damaged))} from {wheel.name}"))
            _restore(home, rid, root, wheel, fetch_wheel, {f.path: f.sha256 for f in receipt.files}, damaged, report)
    _restore_shared(home, receipt, shared, fetch_wheel, report, progress)
    damaged_now = (set(report.missing) | set(report.corrupt)) - set(report.fixed)
    for f in receipt.files:
        if f.path not in damaged_now:
            try:
                f.stamp(os.stat(root / f.path))
            except OSError:
                pass
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
        log.warning("repair of %s: %s could not be restored", rid, plural(len(report.unrepairable), "file"))


def _restore_shared(home: Home, receipt: Receipt, found: FileCheck, fetch_wheel: Fetcher, report: RepairReport,
                    progress: ProgressCallback) -> None:
    """Unpack again, from the download cache or downloaded, each shared library wheel with a
    damaged file (the whole folder is replaced, staged and renamed like at install)."""
    report.checked += found.files
    report.missing += found.missing
    report.corrupt += found.corrupt
    for ref in cuda_libs.shared_refs(receipt):
        prefix = home.relative(cuda_libs.shared_root(home) / ref.sha256) + "/"
        damaged = [p for p in found.missing + found.corrupt if p.startswith(prefix)]
        if not damaged:
            continue
        progress(ProgressEvent("message", "repair", task=receipt.id,
                               message=f"restoring {_files(len(damaged))} of the shared CUDA libraries from {ref.name}"))
        try:
            cuda_libs.restore(home, ref, fetch_wheel(ref))
        except Exception as exc:  # offline, gone from every mirror, a folder not ours: per file, keep going
            msg = getattr(exc, "message", str(exc))
            report.unrepairable.update({p: f"the library wheel {ref.name} could not be restored: {msg}" for p in damaged})
            continue
        report.fixed += damaged


def _files(n: int) -> str:
    return f"{n} damaged file" + ("" if n == 1 else "s")


def unrepairable_error(report: RepairReport) -> StateError:
    first = next(iter(report.unrepairable.items()))
    return StateError(f"{plural(len(report.unrepairable), 'file')} of runtime {report.runtime} could not be restored "
                      f"(first: {first[0]}: {first[1]})", hint="reinstall the runtime", action=Action.REINSTALL)
