"""A runtime's files against its receipt: present, unchanged (size, mtime, inode) or re-hashed.

Apart from :mod:`.repair` (which restores what is damaged, with the wheel installer) so that
`accelstack status`, which only checks, loads no install code.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import List

from ..artifacts.cache import hash_file
from ..events import ProgressCallback, ProgressEvent, null_progress
from ..serde import plural
from .home import Home
from .records import InstalledFile, Receipt
from .shared_libs import CONTENTS, shared_files, shared_refs, shared_root

__all__ = ["FileCheck", "check_files", "check_shared"]


@dataclass
class FileCheck:
    """What one check of a runtime's files against its receipt found."""

    checked: str  # "hashes" (every file re-hashed), "metadata" (size, mtime, inode), "presence" (no stat recorded)
    files: int = 0
    missing: List[str] = field(default_factory=list)
    changed: List[str] = field(default_factory=list)  # metadata: size, mtime or inode differ from the receipt
    corrupt: List[str] = field(default_factory=list)  # hashes: the content differs
    intact: List[str] = field(default_factory=list)  # hashes: re-hashed and matching

    @property
    def damaged(self) -> List[str]:
        return self.missing + self.changed + self.corrupt


def check_files(home: Home, receipt: Receipt, *, deep: bool, stage: str = "status",
                progress: ProgressCallback = null_progress) -> FileCheck:
    """Compare the runtime's files with the receipt: every file re-hashed with ``deep`` (progress
    in bytes, since a CUDA library takes seconds), else only their size, mtime and inode."""
    root = home.runtime_path(receipt)
    out = FileCheck("hashes" if deep else "metadata", files=len(receipt.files))
    total = sum(f.size for f in receipt.files)
    task = receipt.id
    say = deep and bool(receipt.files)  # a torch receipt lists no files: nothing to hash, nothing to show
    if say:
        progress(ProgressEvent("start", stage, task=task, total=total, message="re-hashing the installed files",
                               extra={"unit": "B"}))
    done = 0
    for f in receipt.files:
        _check_one(root / f.path, f, f.path, deep, out)
        if say:
            done += f.size
            progress(ProgressEvent("advance", stage, task=task, done=done, total=total, extra={"unit": "B"}))
    if say:
        found = len(out.missing) + len(out.corrupt)
        progress(ProgressEvent("end", stage, task=task, ok=True,  # the check ran to the end: damage is its finding
                               message=f"found {found} damaged of {plural(out.files, 'file')}" if found else f"all {plural(out.files, 'file')} match"))
    return out


def _check_one(p: Path, f: InstalledFile, name: str, deep: bool, out: FileCheck) -> None:
    """One file against its record, its finding added to ``out`` under ``name``."""
    try:
        st = os.lstat(p)
    except OSError:
        st = None
    if st is None or not stat.S_ISREG(st.st_mode):
        out.missing.append(name)
    elif deep and f.sha256:
        try:
            same = st.st_size == f.size and hash_file(p).hexdigest() == f.sha256
        except OSError:
            same = False
        (out.intact if same else out.corrupt).append(name)
    else:
        matches = f.stat_matches(st)
        if matches is False:
            (out.corrupt if deep else out.changed).append(name)
        elif matches is None and not deep:
            out.checked = "presence"  # an older record: present is all that can be said without hashing


def check_shared(home: Home, receipt: Receipt, *, deep: bool, stage: str = "status",
                 progress: ProgressCallback = null_progress) -> FileCheck:
    """The shared CUDA library files the receipt's wheels were unpacked into (``shared/cuda``),
    checked like the runtime's own (names relative to the home); a folder whose contents record is
    gone or unreadable counts as that record missing."""
    out = FileCheck("hashes" if deep else "metadata")
    for ref in shared_refs(receipt):
        d = shared_root(home) / ref.sha256
        prefix = home.relative(d)
        files = shared_files(d, ref)
        if files is None:
            out.files += 1
            out.missing.append(f"{prefix}/{CONTENTS}")
            continue
        out.files += len(files)
        if deep:
            progress(ProgressEvent("message", stage, task=receipt.id, message=f"re-hashing the shared CUDA libraries of {ref.name}"))
        for f in files:
            _check_one(d / f.path, f, f"{prefix}/{f.path}", deep, out)
    return out
