"""The service's job folders (``<state>/service/jobs/<job id>/``): marked as accelstack's, removed
when their job is forgotten, and swept once their service has stopped.

A job folder is made by :func:`claim`, which writes ``.accelstack-owned`` (the mark every folder
accelstack may delete carries, :data:`accelstack.installer.home.OWNER_MARK`) naming the service
process (pid, host, the process's start time). Only a real folder (never a link) named like a job
id whose mark says so is ever removed; a folder whose service is still running (its pid alive on
this host and started no later than the mark says: a reused pid is not mistaken for it), or whose
host is another machine, is left alone. Removal deletes the mark last, so a kill at any point leaves
either a marked folder (removed next time) or an empty one (nothing to lose).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import psutil

from ..fsio import write_text
from ..installer.home import OWNER_MARK
from ..limits import read_capped

__all__ = ["WHAT", "jobs_root", "claim", "owner", "in_use", "real_dir", "left", "remove", "sweep"]

WHAT = "accelstack service job"
_JOB_ID = re.compile(r"^[0-9a-f]{16}\Z")  # service.jobs: secrets.token_hex(8)


def jobs_root(state_dir: Path) -> Path:
    return Path(state_dir) / "service" / "jobs"


def _started(pid: int) -> float:
    """When process ``pid`` started (0: no such process, or one killed and not yet reaped)."""
    try:
        proc = psutil.Process(pid)
        return 0.0 if proc.status() == psutil.STATUS_ZOMBIE else proc.create_time()
    except (psutil.Error, OSError):
        return 0.0


def claim(folder: Path) -> Path:
    """Make a job's folder and mark it as this process's (before anything is written in it)."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    mark = {"what": WHAT, "pid": os.getpid(), "host": socket.gethostname(), "started": _started(os.getpid()),
            "created": time.time()}
    write_text(folder / OWNER_MARK, json.dumps(mark))
    return folder


def real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def owner(folder: Path) -> Optional[Dict[str, Any]]:
    """The mark of a job folder accelstack made (None: not one, or not a real folder)."""
    if not real_dir(folder) or not _JOB_ID.match(folder.name):
        return None
    try:
        doc = json.loads(read_capped(folder / OWNER_MARK, 64 << 10))  # a link or a FIFO is refused
    except (OSError, ValueError):
        return None
    if isinstance(doc, dict) and doc.get("what") == WHAT and isinstance(doc.get("pid"), int):
        return doc
    return None


def in_use(mark: Dict[str, Any]) -> bool:
    """Whether the service that wrote ``mark`` may still run (another host: assumed so)."""
    if mark.get("host") != socket.gethostname():
        return True
    started = _started(mark["pid"])
    if not started:
        return False
    recorded = mark.get("started")
    return not (isinstance(recorded, (int, float)) and recorded > 0 and started > recorded + 1)  # a later process, same pid


def left(root: Path) -> List[Tuple[Path, bool]]:
    """(folder, its service still runs) for each marked job folder under ``root``."""
    try:
        names = sorted(os.listdir(root)) if real_dir(root) else []
    except OSError:  # unreadable: nothing is removed
        return []
    out = []
    for name in names:
        mark = owner(root / name)
        if mark is not None:
            out.append((root / name, in_use(mark)))
    return out


def remove(folder: Path) -> bool:
    """Delete a marked job folder, its mark last (links inside are removed, never followed)."""
    if owner(folder) is None:
        return False
    for entry in os.scandir(folder):
        if entry.name == OWNER_MARK:
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)
    os.unlink(folder / OWNER_MARK)
    os.rmdir(folder)
    return True


def _size(folder: Path) -> int:
    sizes = (os.lstat(os.path.join(r, f)) for r, _d, files in os.walk(folder) for f in files)
    return sum(st.st_size for st in sizes if stat.S_ISREG(st.st_mode))


def sweep(root: Path) -> Tuple[List[str], int]:
    """Remove the job folders of services that no longer run: (their paths, bytes freed)."""
    removed: List[str] = []
    freed = 0
    for folder, running in left(root):
        if running:
            continue
        try:
            size = _size(folder)
            remove(folder)
        except OSError:
            continue
        removed.append(str(folder))
        freed += size
    return removed, freed
