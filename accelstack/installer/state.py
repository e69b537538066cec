"""State on disk: the runtime home, receipts, the ``active`` pointer and the install lock.

Invariants, enforced here:
- a directory under ``runtimes/<stack>/`` is complete and never modified once renamed into place
  (it is staged under ``staging/`` first, and its receipt is written before the rename);
- ``active.json`` is only ever replaced whole (write a temp file, fsync, ``os.replace``), so a crash
  leaves either the old or the new pointer, never a mix;
- one process at a time changes the home (``install.lock``); a lock left by a killed process is
  taken over, and a live holder is named in the error.
"""
from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..errors import AccelstackError
from ..serde import from_dict, to_dict

RECEIPT_FORMAT = 1


class StateError(AccelstackError):
    """The runtime home is unusable (read-only, corrupt receipt, held lock)."""


class LockHeldError(StateError):
    """Another accelstack process is changing the runtime home."""


def default_home() -> Path:
    env = os.environ.get("ACCELSTACK_HOME")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_data_dir("accelstack", appauthor=False))


@dataclass
class InstalledFile:
    path: str  # relative to the runtime directory, '/'-separated
    sha256: str
    size: int


@dataclass
class Receipt:
    """Everything needed to check, repair and explain one installed runtime."""

    id: str
    stack: str  # "ggml" | "torch"
    backend: str
    path: str  # the runtime directory (ggml) or the target interpreter (torch)
    plan: Dict[str, Any] = field(default_factory=dict)
    manifest_source: str = ""
    manifest_version: int = 0
    artifacts: List[Dict[str, Any]] = field(default_factory=list)  # ArtifactRef dicts it came from
    files: List[InstalledFile] = field(default_factory=list)
    hardware_fingerprint: str = ""
    env: Dict[str, str] = field(default_factory=dict)  # to set when launching it
    installed_at: str = ""
    verified_at: str = ""
    verification: Dict[str, Any] = field(default_factory=dict)
    format_version: int = RECEIPT_FORMAT


@dataclass
class Active:
    """What is active per stack, and what was before (for rollback)."""

    active: Dict[str, str] = field(default_factory=dict)  # stack -> runtime id
    previous: Dict[str, str] = field(default_factory=dict)
    changed_at: str = ""


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    try:  # make the rename itself durable
        dfd = os.open(str(path.parent), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


class Home:
    """The runtime home directory and the operations on its state files."""

    def __init__(self, root: Optional[Path] = None) -> None:
        self.root = Path(root) if root else default_home()

    # layout
    def runtimes(self, stack: str) -> Path:
        return self.root / "runtimes" / stack

    def runtime_dir(self, stack: str, rid: str) -> Path:
        return self.runtimes(stack) / rid

    @property
    def staging(self) -> Path:
        return self.root / "staging"

    @property
    def receipts(self) -> Path:
        return self.root / "receipts"

    @property
    def active_path(self) -> Path:
        return self.root / "active.json"

    def ensure(self) -> None:
        try:
            for d in (self.root, self.staging, self.receipts, self.root / "runtimes"):
                d.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".write-test-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise StateError(
                f"the runtime home {self.root} is not writable ({exc.strerror or exc})",
                hint="set ACCELSTACK_HOME to a writable directory, or fix its permissions",
            ) from None

    # receipts
    def receipt_path(self, rid: str) -> Path:
        return self.receipts / f"{rid}.json"

    def write_receipt(self, receipt: Receipt) -> None:
        atomic_write(self.receipt_path(receipt.id), json.dumps(to_dict(receipt), indent=2))

    def read_receipt(self, rid: str) -> Receipt:
        path = self.receipt_path(rid)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return from_dict(Receipt, data)
        except FileNotFoundError:
            raise StateError(f"no receipt for runtime {rid} ({path})", hint="run `accelstack repair` or reinstall with `accelstack install`") from None
        except (ValueError, AccelstackError) as exc:
            raise StateError(
                f"the receipt {path} is corrupt ({exc})",
                hint="run `accelstack install --force` to reinstall; the runtime files themselves are untouched",
            ) from None

    def receipt_ids(self) -> List[str]:
        if not self.receipts.is_dir():
            return []
        return sorted(p.stem for p in self.receipts.glob("*.json"))

    # active pointer
    def read_active(self) -> Active:
        try:
            data = json.loads(self.active_path.read_text(encoding="utf-8"))
            return from_dict(Active, data)
        except FileNotFoundError:
            return Active()
        except (ValueError, AccelstackError) as exc:
            raise StateError(f"{self.active_path} is corrupt ({exc})", hint="run `accelstack repair`: it rebuilds the pointer from the receipts") from None

    def set_active(self, stack: str, rid: str) -> Active:
        state = self.read_active()
        old = state.active.get(stack)
        if old and old != rid:
            state.previous[stack] = old
        state.active[stack] = rid
        state.changed_at = now_iso()
        atomic_write(self.active_path, json.dumps(to_dict(state), indent=2))
        return state

    def write_active(self, state: Active) -> None:
        state.changed_at = now_iso()
        atomic_write(self.active_path, json.dumps(to_dict(state), indent=2))

    # lock
    def lock(self, command: str, wait: float = 0.0) -> "InstallLock":
        return InstallLock(self.root / "install.lock", command, wait)


class InstallLock:
    """An exclusive lock on the home, naming its holder; stale locks (dead pid) are taken over.

    Uses an OS file lock (released by the kernel when the holder dies, so a SIGKILL never
    wedges the home) plus an info file that says who holds it.
    """

    def __init__(self, path: Path, command: str, wait: float) -> None:
        self.path = path
        self.command = command
        self.wait = wait
        self._lock = None

    def __enter__(self) -> "InstallLock":
        from filelock import FileLock, Timeout

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(str(self.path))
        try:
            self._lock.acquire(timeout=self.wait)
        except Timeout:
            holder = self.holder()
            who = f"process {holder.get('pid')} ({holder.get('command')}, since {holder.get('since')})" if holder else "another process"
            raise LockHeldError(
                f"the runtime home {self.path.parent} is being changed by {who}",
                hint="wait for it to finish, or pass --wait SECONDS",
            ) from None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "command": self.command, "since": now_iso()}
        atomic_write(self.info_path, json.dumps(info))
        return self

    @property
    def info_path(self) -> Path:
        return self.path.with_suffix(".owner")

    def holder(self) -> Dict[str, Any]:
        try:
            return json.loads(self.info_path.read_text())
        except (OSError, ValueError):
            return {}

    def __exit__(self, *exc: object) -> None:
        try:
            self.info_path.unlink()
        except OSError:
            pass
        if self._lock is not None:
            self._lock.release()
