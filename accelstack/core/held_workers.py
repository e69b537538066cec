"""A service's loaded worker, made known to the commands of other processes that change runtimes (issue 46).

The rule: an install, repair, upgrade or rollback never runs beside a loaded worker of the runtime
it changes. Inside the service the job runner releases its warm model before such a job; a CLI
command in another process cannot see it, so the service's warm model registers itself while it
holds a worker: ``<state dir>/service/worker-<service pid>.json`` (pid, url, port, stack, runtime
path), removed when the worker is released. Every command that changes a runtime passes through
:func:`~.context.prepare_home` (the home's lock), which calls :func:`release_held` once it holds the
lock: a live service holding a worker of that stack is asked to release it (``DELETE
/api/v1/session`` with the token from its token file, as the page does) and the command waits for
the registration to go. A file whose service process is gone (its pid dead, or reused by a process started at another time) is ignored; a registration is trusted for
nothing but that request, and only to a loopback address (the token is read from the service's
own token file, by port, never from a path the registration names).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import psutil

from .. import fsio
from ..artifacts.loopback import delete_on_loopback
from ..errors import Action
from ..installer.errors import LockHeldError
from ..limits import read_capped

__all__ = ["HeldWorker", "WorkerHeldError", "held_dir", "register", "unregister", "held_workers", "release_held"]

MAX_FILE = 16 * 1024
LOOPBACK = ("127.0.0.1", "[::1]", "localhost")


class WorkerHeldError(LockHeldError):
    """A running service holds a loaded worker of the runtime a command would change, and did not release it."""

    default_action = Action.RETRY  # once the service is stopped or has released its model


@dataclass
class HeldWorker:
    """One registration: the service (``pid``, ``url``, ``port``) and what its worker loaded."""

    pid: int
    started: float  # the service process's start time: a pid the system gave to another process is not it
    url: str
    port: int
    stack: str
    runtime: str
    path: Path

    @property
    def alive(self) -> bool:
        return _alive(self.pid, self.started)


def held_dir(state_dir: Path) -> Path:
    return state_dir / "service"


def register(state_dir: Path, *, url: str, port: int, stack: str, runtime: str) -> Path:
    """Say that this process (a service) holds a loaded worker of ``runtime``; the file's path."""
    path = held_dir(state_dir) / f"worker-{os.getpid()}.json"
    doc = {"pid": os.getpid(), "started": _started(os.getpid()), "url": url, "port": port, "stack": stack, "runtime": runtime}
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fsio.write_bytes(path, json.dumps(doc).encode("utf-8"), mode=0o600, durable=False)
    return path


def unregister(path: Optional[Path]) -> None:
    if path is not None:
        try:
            path.unlink()
        except OSError:
            pass


def held_workers(state_dir: Path) -> List[HeldWorker]:
    """Every readable registration (live or not); a malformed one is skipped."""
    out = []
    folder = held_dir(state_dir)
    try:
        names = sorted(p for p in folder.iterdir() if p.name.startswith("worker-") and p.name.endswith(".json"))
    except OSError:
        return []
    for path in names:
        try:
            doc = json.loads(read_capped(path, MAX_FILE).decode("utf-8"))
            out.append(HeldWorker(int(doc["pid"]), float(doc["started"]), str(doc["url"]), int(doc["port"]), str(doc["stack"]),
                                  str(doc["runtime"]), path))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def _started(pid: int) -> float:
    """When process ``pid`` started (-1: no such process)."""
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return -1.0


def _alive(pid: int, started: float) -> bool:
    """Whether the registering service still runs: its pid, started when it said (a killed service's pid
    reused by another process is not it)."""
    if pid <= 0:
        return False
    now = _started(pid)
    return now >= 0 and abs(now - started) < 0.5


def release_held(state_dir: Path, stack: Optional[str], command: str, timeout: float = 120.0) -> List[HeldWorker]:
    """Ask every live service of this home that holds a loaded worker of ``stack`` (None: any) to release
    it, and wait until it has; the workers released. :class:`WorkerHeldError` when one does not."""
    done = []
    for held in held_workers(state_dir):
        if (stack is not None and held.stack != stack) or held.pid == os.getpid() or not held.alive:
            continue  # another stack's; this process's own (the service releases first); a stale file
        try:
            _ask_release(state_dir, held, timeout)
        except (OSError, ValueError) as exc:
            raise WorkerHeldError(
                f"the service {held.pid} at {held.url} holds a loaded {held.stack} worker of the runtime {held.runtime}; "
                f"{command} never runs beside it, and the service did not release it ({exc})",
                hint=f"stop that service (process {held.pid}), or release its loaded model (DELETE /api/v1/session "
                     "with the token from its token file), then run the command again; nothing was changed") from None
        done.append(held)
    return done


def _ask_release(state_dir: Path, held: HeldWorker, timeout: float) -> None:
    if not any(held.url.startswith(f"http://{h}:{held.port}/") for h in LOOPBACK):
        raise ValueError("its address is not on this machine's loopback")
    token_path = state_dir / "service" / f"token-{held.port}"
    token = read_capped(token_path, 4096).decode("ascii").strip()
    delete_on_loopback(held.port, "/api/v1/session", token, timeout)  # answers once the worker has exited
    deadline = time.monotonic() + timeout
    while held.path.exists() and held.alive:  # the registration goes with the worker
        if time.monotonic() > deadline:
            raise ValueError("its worker did not stop")
        time.sleep(0.05)
