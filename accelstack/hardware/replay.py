"""``ReplaySystem``: answer every System question from a capture directory, on any OS.

What the capture did not record does not exist, so a hand-made fixture needs only the files and
commands it uses, and a replay never looks at the machine it runs on.

A capture usually comes attached to a bug report, so it is checked as hostile input when it is
opened: ``capture.json`` is size-capped, depth-checked and validated field by field (the error
names the field: ``commands[3].argv[1]: expected a string``), the directory may hold only plain
files and directories (a FIFO would block the read, a symbolic link would read outside the
capture), and every replayed read is capped exactly as live reads are
(:data:`~accelstack.limits.MAX_CAPTURE_FILE_BYTES`). Once a capture has loaded, its answers are
well-typed, so detection over it reports problems instead of raising.
"""
from __future__ import annotations

import errno as errno_mod
import math
import os
import stat
from dataclasses import fields as dataclass_fields
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import Action, CaptureFormatError
from ..limits import (
    MAX_CAPTURE_FILE_BYTES,
    MAX_CAPTURE_FILES,
    MAX_DOCUMENT_INT,
    MAX_JSON_BYTES,
    MalformedInput,
    parse_json,
    read_capped,
)
from .capture import CAPTURE_FORMAT, CAPTURE_VERSION, relative_file_path
from .protocol import DEFAULT_TIMEOUT, CommandResult, FileStamp, Finished, PlatformFacts, RunningCommand

__all__ = ["ReplaySystem"]

_ERRNOS = {name: code for code, name in errno_mod.errorcode.items()}
_PLATFORM_FIELDS = {f.name for f in dataclass_fields(PlatformFacts)}
_DAMAGED = "the capture is damaged or was edited by hand; capture the machine again"


def _short(value: Any) -> str:
    """``repr`` of a value for a message, at most about 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class _Checker:
    """Field-by-field validation of a parsed ``capture.json``; errors name the field."""

    def __init__(self, index_path: Path) -> None:
        self.index_path = index_path

    def fail(self, where: str, message: str) -> CaptureFormatError:
        return CaptureFormatError(f"{self.index_path}: {where}: {message}", hint=_DAMAGED)

    @staticmethod
    def kind(value: Any) -> str:
        if value is None:
            return "null"
        return {bool: "true/false", int: "a number", float: "a number", str: "a string", list: "a list",
                dict: "an object"}.get(type(value), type(value).__name__)

    def mapping(self, index: Dict[str, Any], key: str, check: Callable[[str, Any], None]) -> None:
        """``index[key]`` (absent or null: empty) must be an object of string keys whose values pass ``check``."""
        value = index.get(key)
        if value is None:
            index[key] = {}
            return
        if not isinstance(value, dict):
            raise self.fail(key, f"expected an object, got {self.kind(value)}")
        for name, item in value.items():
            check(f"{key}[{name[:80]!r}]", item)

    def text(self, where: str, value: Any, *, optional: bool = False) -> None:
        if value is None and optional:
            return
        if not isinstance(value, str):
            raise self.fail(where, f"expected a string{' or null' if optional else ''}, got {self.kind(value)}")

    def flag(self, where: str, value: Any) -> None:
        if not isinstance(value, bool):
            raise self.fail(where, f"expected true or false, got {self.kind(value)}")

    def count(self, where: str, value: Any, *, low: int = 0, high: int = MAX_DOCUMENT_INT) -> None:
        """An integer (or null) between ``low`` and ``high``."""
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(where, f"expected a whole number or null, got {self.kind(value)}")
        if not low <= value <= high:
            raise self.fail(where, f"{value} is out of range ({low} to {high})")

    def name(self, where: str, value: Any) -> None:
        """One directory entry name."""
        self.text(where, value)
        if not value or value in (".", "..") or any(c in value for c in "/\\\x00") or len(value) > 255:
            raise self.fail(where, f"{value[:80]!r} is not a file name")

    def stamp(self, where: str, value: Any) -> None:
        """A file's ``[size, mtime_ns]``, or null (it could not be read)."""
        if value is None:
            return
        if not isinstance(value, list) or len(value) != 2:
            raise self.fail(where, f"expected [size, mtime_ns] or null, got {self.kind(value)}")
        for i, item in enumerate(value):
            if item is None:
                raise self.fail(f"{where}[{i}]", "expected a whole number, got null")
            self.count(f"{where}[{i}]", item, low=0 if i == 0 else -MAX_DOCUMENT_INT)

    def pair(self, index: Dict[str, Any], key: str) -> None:
        """``[a, b]`` of counts (memory, cpu_count); null or absent means unknown."""
        value = index.get(key)
        if value is None:
            index[key] = [None, None]
            return
        if not isinstance(value, list) or len(value) > 2:
            raise self.fail(key, f"expected a list of at most two numbers, got {self.kind(value)}")
        for i, item in enumerate(value):
            self.count(f"{key}[{i}]", item)
        index[key] = (list(value) + [None, None])[:2]

    def blob(self, root: Path, where: str, value: Any) -> None:
        """A command's stdout/stderr: a relative path inside the capture naming a regular file."""
        self.text(where, value, optional=True)
        if not value:
            return
        rel = PurePosixPath(value)
        if rel.is_absolute() or rel.parts[:1] != ("commands",) or ".." in rel.parts or "\\" in value \
                or "\x00" in value or ":" in value:
            raise self.fail(where, f"{value[:80]!r} is not a path under the capture's commands/ directory")
        try:
            st = os.lstat(root / rel)
        except OSError:
            raise CaptureFormatError(f"{root}: capture.json names {value}, which is missing", hint=_DAMAGED) from None
        if not stat.S_ISREG(st.st_mode):
            raise self.fail(where, f"{value} is not a regular file")

    def command(self, root: Path, where: str, c: Any) -> None:
        if not isinstance(c, dict):
            raise self.fail(where, f"expected an object, got {self.kind(c)}")
        argv = c.get("argv")
        if not isinstance(argv, list) or not argv:
            raise self.fail(f"{where}.argv", f"expected a non-empty list of strings, got {self.kind(argv)}")
        for j, arg in enumerate(argv):
            self.text(f"{where}.argv[{j}]", arg)
        self.count(f"{where}.returncode", c.get("returncode"), low=-(2 ** 31), high=2 ** 32)
        for key in ("stdout", "stderr"):
            self.blob(root, f"{where}.{key}", c.get(key))
        for key in ("timed_out", "missing"):
            if key in c:
                self.flag(f"{where}.{key}", c[key])
        duration = c.get("duration_ms", 0.0)
        if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not math.isfinite(duration) \
                or not 0 <= duration <= 1e12:
            raise self.fail(f"{where}.duration_ms", f"expected a number of milliseconds, got {self.kind(duration)}")

    def check(self, root: Path, index: Dict[str, Any]) -> None:
        """Validate every section of ``index`` in place (absent sections become empty)."""
        platform = index.get("platform")
        if not isinstance(platform, dict):
            raise self.fail("platform", f"bad platform section: expected an object, got {self.kind(platform)}")
        for key, value in platform.items():
            if key not in _PLATFORM_FIELDS:
                raise self.fail(f"platform.{key[:80]}", f"bad platform section: unknown field {key[:80]!r}")
            self.text(f"platform.{key}", value)
        if "system" not in platform:
            raise self.fail("platform.system", "bad platform section: missing")
        if "created" in index:
            self.text("created", index["created"], optional=True)
        for key in ("env", "which", "links"):
            self.mapping(index, key, lambda where, v: self.text(where, v, optional=True))
        for key in ("access", "exists"):
            self.mapping(index, key, self.flag)
        self.mapping(index, "errors", self.text)
        self.mapping(index, "disk", self.count)
        self.mapping(index, "stat", self.stamp)

        def listing(where: str, names: Any) -> None:
            if names is None:
                return
            if not isinstance(names, list):
                raise self.fail(where, f"expected a list of names or null, got {self.kind(names)}")
            for i, n in enumerate(names):
                self.name(f"{where}[{i}]", n)

        self.mapping(index, "dirs", listing)
        self.pair(index, "memory")
        self.pair(index, "cpu_count")
        commands = index.get("commands")
        if commands is None:
            commands = index["commands"] = []
        if not isinstance(commands, list):
            raise self.fail("commands", f"expected a list, got {self.kind(commands)}")
        if len(commands) > MAX_CAPTURE_FILES:
            raise self.fail("commands", f"{len(commands)} commands, more than the {MAX_CAPTURE_FILES} accepted")
        for i, c in enumerate(commands):
            self.command(root, f"commands[{i}]", c)

    def tree(self, root: Path) -> None:
        """Only directories and regular files under ``files/`` and ``commands/``, and not too many."""
        seen = 0
        stack = [root / "files", root / "commands"]
        while stack:
            directory = stack.pop()
            try:
                st = os.lstat(directory)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise CaptureFormatError(f"{directory}: cannot read ({exc.strerror or exc})", hint=_DAMAGED) from None
            if not stat.S_ISDIR(st.st_mode):
                raise self.bad_entry(root, directory, "a directory")
            with os.scandir(directory) as entries:
                for entry in entries:
                    seen += 1
                    if seen > MAX_CAPTURE_FILES:
                        raise CaptureFormatError(f"{root}: more than {MAX_CAPTURE_FILES} files; not a capture "
                                                 "accelstack writes", hint=_DAMAGED)
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(Path(entry.path))
                    elif not entry.is_file(follow_symlinks=False):
                        raise self.bad_entry(root, Path(entry.path), "a regular file")

    @staticmethod
    def bad_entry(root: Path, path: Path, expected: str) -> CaptureFormatError:
        rel = path.relative_to(root).as_posix()
        return CaptureFormatError(
            f"{root}: {rel} is not {expected} (a symbolic link, FIFO, socket or device); a capture holds only "
            "plain files and directories, so it is not replayed",
            hint="capture the machine again, or remove that entry",
        )


class ReplaySystem:
    """Answers from a capture directory; anything not recorded does not exist."""

    MAX_READ = MAX_CAPTURE_FILE_BYTES  # the same cap as LiveSystem.MAX_READ

    def __init__(self, directory: str) -> None:
        self.root = Path(directory)
        index_path = self.root / "capture.json"
        if not index_path.is_file():
            missing = not self.root.is_dir()  # a missing input (exit 2); a folder without its index is damaged (1)
            raise CaptureFormatError(f"{directory} is not a capture: {'no such folder' if missing else 'capture.json is missing'}",
                                     hint="name a directory written by capturing detection on the machine to replay "
                                     "(it holds capture.json)", exit_code=2 if missing else None)
        try:
            data = read_capped(index_path, MAX_JSON_BYTES + 1)
            index = parse_json(data, what=str(index_path), max_bytes=MAX_JSON_BYTES)
        except OSError as exc:
            raise CaptureFormatError(f"{index_path}: cannot read ({exc.strerror or exc})", hint=_DAMAGED) from None
        except MalformedInput as exc:
            raise CaptureFormatError(exc.message, hint=_DAMAGED) from None
        if not isinstance(index, dict) or index.get("format") != CAPTURE_FORMAT:
            raise CaptureFormatError(f"{index_path}: not an accelstack capture (format field)")
        if index.get("version") != CAPTURE_VERSION or isinstance(index.get("version"), bool):
            raise CaptureFormatError(
                f"{index_path}: capture format version {_short(index.get('version'))} is not supported "
                f"(this accelstack reads version {CAPTURE_VERSION})",
                hint="update accelstack, or capture the machine again with this version",
                action=Action.UPDATE_ACCELSTACK,
            )
        checker = _Checker(index_path)
        checker.check(self.root, index)
        checker.tree(self.root)
        self.index = index
        self._platform = PlatformFacts(**index["platform"])
        self._commands: List[Dict[str, Any]] = list(index["commands"])
        self._used = [False] * len(self._commands)

    # -- files -------------------------------------------------------------------------------
    def _file(self, path: str) -> Optional[Path]:
        """Where ``path`` is kept under files/, or None when it could only be outside (``..``)."""
        rel = PurePosixPath(relative_file_path(path))
        if ".." in rel.parts or "\x00" in path:
            return None
        return self.root / "files" / rel

    def _raise(self, path: str, default: str = "ENOENT") -> None:
        name = self.index["errors"].get(path, default)
        code = _ERRNOS.get(name, errno_mod.EIO)
        raise OSError(code, os.strerror(code), path)

    def platform(self) -> PlatformFacts:
        return self._platform

    def read_text(self, path: str) -> str:
        if path in self.index["errors"]:
            self._raise(path)
        f = self._file(path)
        if f is None or not f.is_file():
            self._raise(path)
        assert f is not None
        return read_capped(f, self.MAX_READ).decode("utf-8", errors="replace")

    def list_dir(self, path: str) -> List[str]:
        dirs = self.index["dirs"]
        if path in dirs:
            if dirs[path] is None:
                self._raise(path)
            return list(dirs[path])
        if path in self.index["errors"]:
            self._raise(path)
        d = self._file(path)
        if d is None or not d.is_dir():
            self._raise(path)
        assert d is not None
        return sorted(p.name for p in d.iterdir())

    def exists(self, path: str) -> bool:
        logged = self.index["exists"]
        if path in logged:
            return bool(logged[path])
        if path in self.index["dirs"] or path in self.index["links"]:
            return True
        if path in self.index["errors"]:
            return self.index["errors"][path] != "ENOENT"
        f = self._file(path)
        return f is not None and f.exists()

    def readlink(self, path: str) -> Optional[str]:
        target: Optional[str] = self.index["links"].get(path)
        return target

    def access(self, path: str, mode: str) -> bool:
        logged = self.index["access"]
        key = f"{path}:{mode}"
        if key in logged:
            return bool(logged[key])
        return self.exists(path)

    # -- commands ----------------------------------------------------------------------------
    def run(self, argv: Sequence[str], timeout: float = DEFAULT_TIMEOUT) -> CommandResult:
        """The first unused recorded command with the same argv (then any with that argv)."""
        argv = list(argv)
        candidates = [i for i, c in enumerate(self._commands) if c["argv"] == argv]
        if not candidates:
            return CommandResult(argv, missing=True)
        fresh = [i for i in candidates if not self._used[i]]
        i = fresh[0] if fresh else candidates[-1]
        self._used[i] = True
        c = self._commands[i]
        return CommandResult(
            argv,
            returncode=c.get("returncode"),
            stdout=self._blob(c.get("stdout")),
            stderr=self._blob(c.get("stderr")),
            timed_out=bool(c.get("timed_out", False)),
            missing=bool(c.get("missing", False)),
            duration_ms=float(c.get("duration_ms", 0.0)),
        )

    def start(self, argv: Sequence[str], timeout: float = DEFAULT_TIMEOUT) -> RunningCommand:
        """A replayed command is answered at once (through ``run``, so a subclass's ``run`` is used)."""
        return Finished(self.run(argv, timeout))

    def stat(self, path: str) -> Optional[FileStamp]:
        stamp = self.index["stat"].get(path)
        return (stamp[0], stamp[1]) if stamp is not None else None

    def _blob(self, rel: Optional[str]) -> str:
        """A recorded output (checked to exist when the capture was opened), capped like a live read."""
        if not rel:
            return ""
        try:
            return read_capped(self.root / PurePosixPath(rel), self.MAX_READ).decode("utf-8", errors="replace")
        except OSError:  # removed since the capture was opened
            return ""

    def which(self, name: str) -> Optional[str]:
        logged = self.index["which"]
        if name in logged:
            found: Optional[str] = logged[name]
            return found
        for c in self._commands:  # a recorded command that ran implies the program exists
            if c["argv"][0] == name and not c.get("missing"):
                return name
        return None

    def env(self, name: str) -> Optional[str]:
        value: Optional[str] = self.index["env"].get(name)
        return value

    def memory(self) -> Tuple[Optional[int], Optional[int]]:
        total, available = self.index["memory"]
        return total, available

    def disk_free(self, path: str) -> Optional[int]:
        disk: Dict[str, Optional[int]] = self.index["disk"]
        if path in disk:
            return disk[path]
        return next(iter(disk.values()), None)

    def cpu_count(self) -> Tuple[Optional[int], Optional[int]]:
        physical, logical = self.index["cpu_count"]
        return physical, logical
