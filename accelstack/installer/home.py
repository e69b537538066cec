"""The runtime home: its layout, its state files, what it owns, and the lock that guards it.

Invariants, enforced here:
- a directory under ``runtimes/<stack>/`` is complete and never modified once renamed into place
  (it is built under ``staging/`` first); a forced reinstall builds a *new* directory and retires
  the old one only after the receipt points at the new one, so no instant has a half runtime;
- ``active.json`` and receipts are only ever replaced whole (:func:`accelstack.fsio.write_text`);
- accelstack deletes only directories it created and marked as its own (a marker file inside),
  that are real directories (never through a symlink) and that lie inside the home;
- one process at a time changes the home (``install.lock``, an OS lock a killed holder cannot wedge).
"""
from __future__ import annotations

import errno
import json
import logging
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional

from .. import fsio
from ..errors import Action, UsageError
from ..events import ProgressCallback, ProgressEvent, null_progress
from ..limits import read_capped
from ..serde import from_dict, size_text, to_dict
from ..settings import check_directory
from .errors import DiskFullError, LockHeldError, StateError
from .records import Active, Receipt, dump_receipt, load_receipt, now_iso

__all__ = ["OWNER_MARK", "MAX_STATE_BYTES", "Home", "InstallLock", "read_state", "state_write_error"]

log = logging.getLogger(__name__)

OWNER_MARK = ".accelstack-owned"  # in every directory accelstack creates and may delete
MAX_STATE_BYTES = 64 << 20  # receipts and active.json are small; refuse to read absurd files
WRITE_TEST_BYTES = 64 << 10  # more than a receipt, the rollback watermarks or a saved manifest take


class Home:
    """The runtime home directory and the operations on its state files."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    # -- layout ------------------------------------------------------------------------------
    def runtimes(self, stack: str) -> Path:
        return self.root / "runtimes" / stack

    @property
    def staging(self) -> Path:
        return self.root / "staging"

    @property
    def receipts(self) -> Path:
        return self.root / "receipts"

    @property
    def active_path(self) -> Path:
        return self.root / "active.json"

    @property
    def last_good_active_path(self) -> Path:
        """A copy of ``active.json`` written with it on every change: what repair rebuilds a damaged one from."""
        return self.root / "active.last-good.json"

    def runtime_path(self, receipt: Receipt) -> Path:
        """Where a receipt's runtime lives (ggml: under the home; torch: the interpreter)."""
        return self.root / receipt.path  # an absolute path (torch, format-1 receipts) stays as it is

    def relative(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def ensure(self) -> None:
        """Create the layout and prove the home is writable; raises before any other work."""
        try:
            check_directory(self.root, "the runtime home", action=Action.CHOOSE_HOME)
        except UsageError as exc:  # a file where the home should be: nothing is created
            raise StateError(exc.message, hint=exc.hint, action=Action.CHOOSE_HOME) from None
        for d in (self.staging, self.receipts):
            if d.is_symlink():
                raise StateError(f"{d} is a symbolic link; accelstack keeps its staging and receipts inside the home and "
                                 "never works through a link out of it", hint="remove the link, or choose another home",
                                 action=Action.CHOOSE_HOME)
        try:
            for d in (self.root, self.staging, self.receipts, self.root / "runtimes"):
                d.mkdir(parents=True, exist_ok=True)
            # with the room a state file takes: a full disk is said here, before any state is written
            fsio.write_bytes(self.root / f".write-test-{os.getpid()}", bytes(WRITE_TEST_BYTES), durable=False).unlink()
        except OSError as exc:
            if exc.errno in _NO_ROOM:
                raise state_write_error(exc, "a file", self.root) from None
            raise StateError(f"the runtime home {self.root} is not writable ({exc.strerror or exc})",
                             hint="choose a writable directory as the runtime home, or fix its permissions",
                             action=Action.CHOOSE_HOME) from None

    def check_same_filesystem(self, stack: str) -> None:
        """Staging and runtimes must share a filesystem, or the final rename cannot be atomic."""
        target = self.runtimes(stack)
        target.mkdir(parents=True, exist_ok=True)
        if os.stat(self.staging).st_dev != os.stat(target).st_dev:
            raise StateError(f"{self.staging} and {target} are on different filesystems, so a runtime cannot be "
                             "switched in atomically", hint="keep the whole runtime home on one disk: to use another "
                             "disk, choose a home directory on that disk instead of linking part of it there",
                             action=Action.CHOOSE_HOME)

    # -- owned directories ---------------------------------------------------------------------
    def make_owned_dir(self, parent: Path, name: str) -> Path:
        """A new, marked directory ``parent/name`` (``name.N`` if taken): ours to delete later."""
        parent.mkdir(parents=True, exist_ok=True)
        path = parent / name
        while True:
            try:
                path.mkdir()
                break
            except FileExistsError:
                path = parent / f"{name}.{uuid.uuid4().hex[:8]}"
        fsio.write_text(path / OWNER_MARK, json.dumps({"pid": os.getpid(), "created": now_iso()}))
        return path

    def owns(self, path: Path) -> bool:
        """True for a real directory inside the home, not reached through a symlink, with our mark."""
        try:
            if path.is_symlink() or not path.is_dir():
                return False
            mark = path / OWNER_MARK
            if mark.is_symlink() or not mark.is_file():
                return False
            root = self.root.resolve()
            real = path.resolve()
            return real != root and root in real.parents and real.parent == path.parent.resolve()
        except OSError:
            return False

    def remove_owned(self, path: Path) -> bool:
        """Delete ``path`` only if accelstack owns it (see :meth:`owns`); False when it was left alone."""
        if not self.owns(path):
            if path.exists() or path.is_symlink():
                log.warning("left %s alone: not a directory accelstack created", path)
            return False
        fsio.discard_tree(path)  # renamed to a trash name first: a kill mid-way leaves garbage recover removes
        return True

    def owned_children(self, parent: Path) -> List[Path]:
        """Marked directories directly in ``parent``; a symlinked ``parent`` is never entered."""
        if parent.is_symlink() or not parent.is_dir():
            return []
        return sorted(p for p in parent.iterdir() if self.owns(p))

    # -- receipts ------------------------------------------------------------------------------
    def receipt_path(self, rid: str) -> Path:
        return self.receipts / f"{rid}.json"

    def write_receipt(self, receipt: Receipt) -> None:
        fsio.write_text(self.receipt_path(receipt.id), dump_receipt(receipt))

    def read_receipt(self, rid: str) -> Receipt:
        path = self.receipt_path(rid)
        try:
            text = read_state(path)
            return load_receipt(text, f"receipt {rid}")
        except FileNotFoundError:
            raise StateError(f"no receipt for runtime {rid} ({path})", hint="reinstall the runtime", action=Action.REINSTALL) from None
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise StateError(f"the receipt {path} is corrupt ({str(exc)[:200]})",
                             hint="reinstall the runtime; its files themselves are untouched", action=Action.REINSTALL) from None
        except StateError:
            raise
        except Exception as exc:  # SerializationError and friends: wrong types inside
            raise StateError(f"the receipt {path} is corrupt ({str(exc)[:200]})",
                             hint="reinstall the runtime; its files themselves are untouched", action=Action.REINSTALL) from None

    def receipt_ids(self) -> List[str]:
        if not self.receipts.is_dir():
            return []
        return sorted(p.stem for p in self.receipts.glob("*.json") if not p.name.startswith("."))

    def intact_receipt(self, stack: str, rid: str) -> Optional[Receipt]:
        """Cheap: the receipt, if it reads, is of ``stack`` and its runtime exists (torch: the
        interpreter does); else None. Raises StateError for a receipt that exists but is damaged."""
        if not self.receipt_path(rid).is_file():
            return None
        receipt = self.read_receipt(rid)
        return receipt if receipt.stack == stack and self.runtime_path(receipt).exists() else None

    def runtime_intact(self, stack: str, rid: str) -> bool:
        try:
            return self.intact_receipt(stack, rid) is not None
        except StateError:
            return False

    # -- active pointer ------------------------------------------------------------------------
    def read_active(self) -> Active:
        try:
            data = json.loads(read_state(self.active_path))
            return from_dict(Active, data, "active.json")
        except FileNotFoundError:
            return Active()
        except Exception as exc:  # garbage, truncated, wrong types, not UTF-8
            raise StateError(f"{self.active_path} is damaged ({str(exc)[:200]})",
                             hint="repair rebuilds it from its last good copy (else the receipts)", action=Action.REPAIR) from None

    def write_active(self, state: Active) -> None:
        state.changed_at = now_iso()
        text = json.dumps(to_dict(state), indent=2)
        fsio.write_text(self.active_path, text)
        fsio.write_text(self.last_good_active_path, text)

    def set_active(self, stack: str, rid: str) -> Active:
        state = self.read_active()
        old = state.active.get(stack)
        if old and old != rid:
            state.previous[stack] = old
        state.active[stack] = rid
        self.write_active(state)
        return state

    # -- lock ----------------------------------------------------------------------------------
    def lock(self, command: str, wait: float = 0.0, progress: ProgressCallback = null_progress) -> InstallLock:
        """The home's lock for ``command``; while another process holds it, wait up to ``wait``
        seconds, saying so through ``progress`` (a wait never looks like a hang)."""
        return InstallLock(self.root / "install.lock", command, wait, progress)


_NO_ROOM = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG)  # full disk, quota, file size limit


def state_write_error(exc: OSError, what: str, root: Path) -> StateError:
    """The typed error for ``what`` (a state file's name) that could not be written in the home ``root``
    before any change: :class:`DiskFullError` when there is no room (a full disk, a quota, a file size limit)."""
    why = exc.strerror or str(exc)
    if exc.errno in _NO_ROOM:
        return DiskFullError(f"the disk of the runtime home {root} is full: cannot write {what} there ({why})",
                             hint="free some space on that disk, then run the command again; nothing was changed "
                             "and the active runtime is as it was")
    return StateError(f"cannot write {what} in the runtime home {root} ({why})", hint="choose a writable directory as the "
                      "runtime home, or fix its permissions; nothing was changed", action=Action.CHOOSE_HOME)


def read_state(path: Path, limit: int = MAX_STATE_BYTES) -> str:
    """The text of a state file of the home, which anyone who can write there may have replaced:
    a FIFO or a device is refused without blocking (``ValueError``), as is a file over ``limit``;
    ``FileNotFoundError`` (an ``OSError``) when there is none."""
    try:
        data = read_capped(path, limit + 1)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ELOOP, errno.ENXIO):  # a FIFO, a device, a symbolic link
            raise ValueError("not a regular file") from None
        raise
    if len(data) > limit:
        raise ValueError(f"larger than {size_text(limit)}")
    return data.decode("utf-8")


class InstallLock:
    """An exclusive lock on the home, naming its holder (OS file lock + an info file)."""

    def __init__(self, path: Path, command: str, wait: float, progress: ProgressCallback = null_progress) -> None:
        self.path = path
        self.command = command
        self.wait = wait
        self.progress = progress
        self._lock: Optional[Any] = None

    def __enter__(self) -> InstallLock:
        from filelock import FileLock, Timeout  # here: reading a receipt (every `generate`) takes no lock (12 ms)

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(str(self.path))
        try:
            self._acquire(self._lock)
        except Timeout:
            raise LockHeldError(f"the runtime home {self.path.parent} is being changed by {self._who()}",
                                hint="wait for it to finish, or allow a waiting time") from None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "command": self.command, "since": now_iso()}
        try:
            fsio.write_text(self.info_path, json.dumps(info))
        except OSError as exc:  # nothing is changed yet: say why and let go of the lock
            self._lock.release()
            self._lock = None
            raise state_write_error(exc, self.info_path.name, self.path.parent) from None
        return self

    def _who(self, holder: Optional[Dict[str, Any]] = None) -> str:
        holder = self.holder() if holder is None else holder
        since = str(holder.get("since") or "")
        since = since[:19] + "Z" if len(since) > 20 and since.endswith("Z") else since  # whole seconds: a person reads it
        return f"process {holder.get('pid')} ({holder.get('command')}, since {since})" if holder else "another process"

    def _acquire(self, lock: Any) -> None:
        """Take ``lock`` at once if free; else wait up to ``self.wait`` seconds with a tick each second."""
        from filelock import Timeout

        try:
            lock.acquire(timeout=0)
            return
        except Timeout:
            if self.wait <= 0:
                raise
        holder, start, ok = self.holder(), time.monotonic(), False
        who = self._who(holder)
        task = f"runtime home {self.path.parent}"
        said = {k: holder[k] for k in ("pid", "host", "command", "since") if k in holder}  # for an app to show
        self.progress(ProgressEvent("start", "lock", task=task, message=f"waiting up to {self.wait:.0f} s for {who} to finish",
                                    extra={"unit": "s", "holder": said, "wait": self.wait}))
        try:
            while True:
                left = self.wait - (time.monotonic() - start)
                if left <= 0:
                    raise Timeout(str(self.path))
                try:
                    lock.acquire(timeout=min(1.0, left))
                    ok = True
                    return
                except Timeout:
                    waited = int(time.monotonic() - start)
                    self.progress(ProgressEvent("advance", "lock", task=task, done=waited,
                                                message=f"waiting up to {self.wait:.0f} s for {who}",
                                                extra={"unit": "s", "holder": said}))
        finally:
            self.progress(ProgressEvent("end", "lock", task=task, ok=ok,
                                        message="the other process finished" if ok else "gave up waiting"))

    @property
    def info_path(self) -> Path:
        return self.path.with_suffix(".owner")

    def holder(self) -> Dict[str, Any]:
        try:
            data = json.loads(read_state(self.info_path, 64 << 10))
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def __exit__(self, *exc: object) -> None:
        try:
            self.info_path.unlink()
        except OSError:
            pass
        if self._lock is not None:
            self._lock.release()
