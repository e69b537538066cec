"""Who owns a temporary probe folder: its ``.owner`` file names the process (pid, host, time), and a
folder whose process is gone is swept by the next synthesis (:mod:`accelstack.engine.probes.model`)
and purged by ``accelstack cache`` (:mod:`accelstack.core.caches`)."""
from __future__ import annotations

import ctypes
import json
import os
import socket
import time
from pathlib import Path

from ...limits import read_capped

__all__ = ["OWNER", "STALE_UNOWNED_SECONDS", "owner_text", "pid_alive", "temporary_probe_in_use", "temporary_probe_holder", "has_owner", "is_probe_folder"]

OWNER = ".owner"  # in a temporary probe folder: the process that uses it
STALE_UNOWNED_SECONDS = 24 * 3600  # a temporary folder with no readable owner (a crash mid-mkdtemp)


def owner_text() -> str:
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "created": time.time()})


def _json(path: Path) -> object:
    try:
        return json.loads(read_capped(path, 64 << 10))  # a FIFO is refused, never waited on
    except (OSError, ValueError):
        return None


def has_owner(folder: Path) -> bool:
    """Whether ``folder`` holds an owner record: what makes a ``.tmp-…`` folder a probe's, ours to sweep
    (issue 47: a person's folder of that name, with no record, is never removed)."""
    owner = _json(Path(folder) / OWNER)
    return isinstance(owner, dict) and isinstance(owner.get("pid"), int) and "host" in owner


# The module a probe's marker names in its ``method``: probes written before the engine's rooms name
# it by its old place, and stay recognised as accelstack's own.
PROBE_METHOD_MARKS = ("accelstack.engine.probes.model", "accelstack.engine.probe_model")


def is_probe_folder(folder: Path, marker: str = "probe.json") -> bool:
    """Whether ``folder`` holds a probe marker written by :mod:`.model` (its ``method`` names it):
    only such a folder is replaced by a new probe or purged."""
    doc = _json(Path(folder) / marker)
    return isinstance(doc, dict) and isinstance(doc.get("method"), str) and any(m in doc["method"] for m in PROBE_METHOD_MARKS)


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    if os.name == "nt":
        handle = ctypes.windll.kernel32.OpenProcess(0x1000, False, pid)  # type: ignore[attr-defined]
        if handle:
            ctypes.windll.kernel32.CloseHandle(handle)  # type: ignore[attr-defined]
            return True
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, someone else's
        return True
    return True


def temporary_probe_in_use(folder: Path) -> bool:
    """True while the process that made temporary probe ``folder`` runs (or may: another host,
    or no owner file yet and the folder is recent)."""
    return bool(temporary_probe_holder(folder))


def temporary_probe_holder(folder: Path) -> str:
    """Why temporary probe ``folder`` is left alone ("" when nothing holds it): a verify still
    running here, one on another host sharing the cache (whether it still runs cannot be told from
    here), or a folder too recent to have its owner file yet."""
    try:
        owner = json.loads(read_capped(Path(folder) / OWNER, 64 << 10))  # a FIFO is refused, never waited on
        host = owner.get("host")
        if host != socket.gethostname():
            return f"made by a verify on another host ({str(host)[:64]}), which may still run"
        pid = int(owner["pid"])
        return f"in use by a running verify (pid {pid})" if pid_alive(pid) else ""
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        try:
            recent = time.time() - Path(folder).lstat().st_mtime < STALE_UNOWNED_SECONDS
        except OSError:
            return ""
        return "being made by a verify (no owner record yet)" if recent else ""
