"""The supervisor's folders in the temp dir (ready files and worker logs), and their cleanup.

Each folder is named ``accelstack-worker-*`` and holds a marker, ``accelstack-worker.json``, with
the pid (and start time) of the process that made it. A folder is normally removed when its
supervisor stops; two cases leave one behind:

- the worker crashed: the folder is kept on purpose, because the error message names the
  worker's log in it (the marker says ``crashed``);
- the process running the supervisor was killed (no ``finally`` runs).

:func:`clean_stale` removes, at the next start, only folders that are provably ours and
abandoned: a real directory (not a link) of this user, with a readable marker, whose maker is
dead (its pid is gone or now belongs to a process started at another time), and older than
``WORKER_DIR_STALE_SECONDS`` (``CRASH_LOG_KEEP_SECONDS`` for a crashed worker's log). Anything
else in the temp dir is never touched.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import List, Optional, Union

from ... import fsio
from ...limits import CRASH_LOG_KEEP_SECONDS, WORKER_DIR_STALE_SECONDS, MalformedInput, parse_json

__all__ = ["PREFIX", "MARKER", "make", "stamp", "mark_crashed", "clean_stale", "WORKER_DIR_STALE_SECONDS", "CRASH_LOG_KEEP_SECONDS"]

PREFIX = "accelstack-worker-"
MARKER = "accelstack-worker.json"
MAX_MARKER_BYTES = 4096

log = logging.getLogger(__name__)


def _started(pid: int) -> Optional[float]:
    """When process ``pid`` started (None if there is none, or it cannot be told)."""
    import psutil  # here: a launch makes its folder before the worker's spawn, stamps it after (~9 ms)

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError, ValueError):
        return None


def _write_marker(folder: Path, crashed: bool, stamped: bool = True) -> None:
    started = _started(os.getpid()) if stamped else None
    data = {"pid": os.getpid(), "started": started, "created": time.time(), "crashed": crashed}
    fsio.write_text(folder / MARKER, json.dumps(data), durable=False)


def make(root: Optional[Union[str, Path]] = None, stamped: bool = True) -> Path:
    """A new marked folder for one supervisor (in ``root``, default the temp dir). Not ``stamped``,
    its marker lacks this process's start time until :func:`stamp`: meanwhile the folder is kept
    while any process has our pid (never removed too early, at worst too late)."""
    folder = Path(tempfile.mkdtemp(prefix=PREFIX, dir=str(root) if root is not None else None))
    _write_marker(folder, crashed=False, stamped=stamped)
    return folder


def stamp(folder: Path) -> None:
    """Add this process's start time to the marker of a folder :func:`make` left unstamped; a marker
    that cannot be rewritten stays as it is (its folder is kept while our pid lives, no harm)."""
    try:
        _write_marker(folder, crashed=False)
    except OSError as exc:
        log.debug("could not stamp %s: %s", folder, exc)


def mark_crashed(folder: Path) -> None:
    """Keep ``folder``: a worker crashed and a message points at its log."""
    try:
        _write_marker(folder, crashed=True)
    except OSError:
        pass


def _abandoned(entry: os.DirEntry, now: float) -> bool:
    if not entry.name.startswith(PREFIX) or not entry.is_dir(follow_symlinks=False):
        return False
    if hasattr(os, "getuid") and entry.stat(follow_symlinks=False).st_uid != os.getuid():
        return False
    marker = Path(entry.path) / MARKER
    try:
        mst = os.lstat(marker)
        if not stat.S_ISREG(mst.st_mode) or mst.st_size > MAX_MARKER_BYTES:
            return False
        data = parse_json(marker.read_bytes(), what=str(marker), max_bytes=MAX_MARKER_BYTES)
    except (OSError, MalformedInput):
        return False
    if not isinstance(data, dict) or not isinstance(data.get("pid"), int) or isinstance(data.get("pid"), bool):
        return False
    pid, started = data["pid"], data.get("started")
    alive_since = _started(pid) if pid > 0 else None
    if alive_since is not None and (not isinstance(started, (int, float)) or abs(alive_since - started) < 1.0):
        return False  # its maker still runs
    keep = CRASH_LOG_KEEP_SECONDS if data.get("crashed") is True else WORKER_DIR_STALE_SECONDS
    return now - mst.st_mtime > keep


def clean_stale(root: Optional[Union[str, Path]] = None, now: Optional[float] = None) -> List[Path]:
    """Remove abandoned worker folders in ``root`` (default the temp dir); the removed ones."""
    where = Path(root) if root is not None else Path(tempfile.gettempdir())
    now = time.time() if now is None else now
    removed: List[Path] = []
    try:
        entries = list(os.scandir(where))
    except OSError:
        return removed
    for entry in entries:
        try:
            if _abandoned(entry, now):
                shutil.rmtree(entry.path)
                removed.append(Path(entry.path))
                log.info("removed the abandoned worker folder %s", entry.path)
        except OSError as exc:
            log.debug("could not remove %s: %s", entry.path, exc)
    return removed
