"""``CapturingSystem``: record every answer a System gives, and write them as a capture directory.

A capture lets detection run again later on any OS (``replay.py``): a user attaches theirs to a bug
report, and a Windows laptop's or an 8-GPU server's detection becomes a test here. The format is
documented in docs/capture-format.md.

Capture format, version 1 (a directory):

    capture.json       {"format": "accelstack-capture", "version": 1, "created": ISO time,
                        "platform": {...PlatformFacts...}, "env": {NAME: value},
                        "which": {NAME: path|null}, "access": {"PATH:MODE": bool},
                        "exists": {PATH: bool}, "links": {PATH: target},
                        "dirs": {PATH: [names]|null},
                        "errors": {PATH: "ENOENT"|"EACCES"|...},
                        "memory": [total, available], "disk": {PATH: free},
                        "stat": {PATH: [size, mtime_ns]|null},
                        "cpu_count": [physical, logical],
                        "commands": [{"argv": [...], "returncode": int, "stdout": "commands/N.out",
                                      "stderr": "commands/N.err", "timed_out": bool,
                                      "missing": bool, "duration_ms": float}]}
    files/<abs path>   the bytes of every file read, at its absolute path under files/
                       (Windows has no file reads; drive letters would become files/C/...)
    commands/N.out     stdout of command N; commands/N.err its stderr

Directory listings not recorded under "dirs" are derived from the files/ tree, and a path not
recorded anywhere does not exist: hand-made fixtures need only the files and commands they use.
"""
from __future__ import annotations

import datetime
import errno as errno_mod
import json
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import AccelstackError, Action, UsageError
from .protocol import DEFAULT_TIMEOUT, CommandResult, FileStamp, PlatformFacts, RunningCommand, System

__all__ = ["CAPTURE_FORMAT", "CAPTURE_VERSION", "CapturingSystem", "relative_file_path"]

CAPTURE_FORMAT = "accelstack-capture"
CAPTURE_VERSION = 1


def _errname(exc: OSError) -> str:
    return errno_mod.errorcode.get(exc.errno or 0, "EIO")


class CapturingSystem:
    """Wraps a System, answers from it, and remembers every answer for ``save``."""

    def __init__(self, inner: System) -> None:
        self.inner = inner
        self._platform: Optional[PlatformFacts] = None
        self.files: Dict[str, str] = {}
        self.errors: Dict[str, str] = {}
        self.dirs: Dict[str, Optional[List[str]]] = {}
        self.links: Dict[str, Optional[str]] = {}
        self.access_log: Dict[str, bool] = {}
        self.commands: List[CommandResult] = []
        self.which_log: Dict[str, Optional[str]] = {}
        self.env_log: Dict[str, Optional[str]] = {}
        self.exists_log: Dict[str, bool] = {}
        self._memory: Tuple[Optional[int], Optional[int]] = (None, None)
        self.disk: Dict[str, Optional[int]] = {}
        self.stats: Dict[str, Optional[List[int]]] = {}
        self._cpu_count: Tuple[Optional[int], Optional[int]] = (None, None)

    def platform(self) -> PlatformFacts:
        if self._platform is None:
            self._platform = self.inner.platform()
        return self._platform

    def read_text(self, path: str) -> str:
        try:
            text = self.inner.read_text(path)
        except OSError as exc:
            self.errors[path] = _errname(exc)
            raise
        self.files[path] = text
        return text

    def list_dir(self, path: str) -> List[str]:
        try:
            names = self.inner.list_dir(path)
        except OSError as exc:
            self.errors[path] = _errname(exc)
            raise
        self.dirs[path] = names
        return names

    def exists(self, path: str) -> bool:
        result = self.inner.exists(path)
        self.exists_log[path] = result
        return result

    def readlink(self, path: str) -> Optional[str]:
        target = self.inner.readlink(path)
        self.links[path] = target
        return target

    def access(self, path: str, mode: str) -> bool:
        result = self.inner.access(path, mode)
        self.access_log[f"{path}:{mode}"] = result
        return result

    def run(self, argv: Sequence[str], timeout: float = DEFAULT_TIMEOUT) -> CommandResult:
        result = self.inner.run(argv, timeout)
        self.commands.append(result)
        return result

    def start(self, argv: Sequence[str], timeout: float = DEFAULT_TIMEOUT) -> RunningCommand:
        return _Recorded(self.inner.start(argv, timeout), self.commands)

    def stat(self, path: str) -> Optional[FileStamp]:
        stamp = self.inner.stat(path)
        self.stats[path] = list(stamp) if stamp is not None else None
        return stamp

    def which(self, name: str) -> Optional[str]:
        path = self.inner.which(name)
        self.which_log[name] = path
        return path

    def env(self, name: str) -> Optional[str]:
        value = self.inner.env(name)
        self.env_log[name] = value
        return value

    def memory(self) -> Tuple[Optional[int], Optional[int]]:
        self._memory = self.inner.memory()
        return self._memory

    def disk_free(self, path: str) -> Optional[int]:
        free = self.inner.disk_free(path)
        self.disk[path] = free
        return free

    def cpu_count(self) -> Tuple[Optional[int], Optional[int]]:
        self._cpu_count = self.inner.cpu_count()
        return self._cpu_count

    @staticmethod
    def check_target(directory: str) -> Path:
        """``directory`` as a capture's folder: a usage error unless it is new or an empty folder.

        A directory with anything in it is refused: replay treats every file under ``files/`` as
        part of the machine, so an older capture's files would mix into this one, and files that
        are not accelstack's must not be overwritten. Cheap: said before detection runs."""
        root = Path(directory)
        try:
            taken = root.exists() and (not root.is_dir() or any(root.iterdir()))
        except OSError as exc:  # a folder that cannot be listed
            raise _write_error(root, exc) from None
        if taken:
            raise UsageError(f"{root} is not an empty directory; a capture is written into a new or empty one",
                             hint="choose a new directory for the capture, or remove the old capture first")
        return root

    def save(self, directory: str) -> Path:
        """Write the capture into ``directory`` (new or empty, :meth:`check_target`); returns its
        path. A folder that cannot be made or written is a typed error naming it, never an OSError."""
        root = self.check_target(directory)
        try:
            self._write(root)
        except OSError as exc:
            raise _write_error(root, exc) from None
        return root

    def _write(self, root: Path) -> None:
        (root / "files").mkdir(parents=True, exist_ok=True)
        (root / "commands").mkdir(exist_ok=True)
        for path, text in self.files.items():
            dest = root / "files" / relative_file_path(path)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text, encoding="utf-8", newline="")
        commands = []
        for i, cmd in enumerate(self.commands):
            (root / "commands" / f"{i}.out").write_text(cmd.stdout, encoding="utf-8", newline="")
            (root / "commands" / f"{i}.err").write_text(cmd.stderr, encoding="utf-8", newline="")
            commands.append(
                {
                    "argv": cmd.argv,
                    "returncode": cmd.returncode,
                    "stdout": f"commands/{i}.out",
                    "stderr": f"commands/{i}.err",
                    "timed_out": cmd.timed_out,
                    "missing": cmd.missing,
                    "duration_ms": round(cmd.duration_ms, 3),
                }
            )
        index = {
            "format": CAPTURE_FORMAT,
            "version": CAPTURE_VERSION,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "platform": asdict(self.platform()),
            "env": self.env_log,
            "which": self.which_log,
            "access": self.access_log,
            "exists": self.exists_log,
            "links": self.links,
            "dirs": self.dirs,
            "errors": self.errors,
            "memory": list(self._memory),
            "disk": self.disk,
            "stat": self.stats,
            "cpu_count": list(self._cpu_count),
            "commands": commands,
        }
        (root / "capture.json").write_text(json.dumps(index, indent=2, sort_keys=True), encoding="utf-8")


def _write_error(root: Path, exc: OSError) -> AccelstackError:
    """An OSError writing the capture ``root``: a full disk is a failure (exit 1), any other a
    folder the capture cannot go in, a usage error (exit 2) as for every output path."""
    reason = exc.strerror or str(exc)
    if exc.filename and str(exc.filename) != str(root):
        reason += f" ({exc.filename})"
    if exc.errno in (errno_mod.ENOSPC, getattr(errno_mod, "EDQUOT", errno_mod.ENOSPC)):
        return AccelstackError(f"cannot write the capture to {root}: {reason}", "free some disk space, or write the "
                               "capture to another disk", action=Action.FREE_DISK, code="disk-full")
    return UsageError(f"cannot write the capture to {root}: {reason}",
                      "choose a new folder in a place you can write to", code="output-path")


class _Recorded:
    """A started command of the wrapped System, recorded when it is collected."""

    def __init__(self, running: RunningCommand, log: List[CommandResult]) -> None:
        self.running, self.log = running, log
        self._result: Optional[CommandResult] = None

    def result(self) -> CommandResult:
        if self._result is None:
            self._result = self.running.result()
            self.log.append(self._result)
        return self._result


def relative_file_path(path: str) -> str:
    """Absolute path -> relative path under files/ (``C:\\x`` -> ``C/x``)."""
    p = path.replace("\\", "/")
    if len(p) > 1 and p[1] == ":":
        p = p[0] + p[2:]
    return p.lstrip("/")
