"""``ReplaySystem``: answer every System question from a capture directory, on any OS.

What the capture did not record does not exist, so a hand-made fixture needs only the files and
commands it uses, and a replay never looks at the machine it runs on.
"""
from __future__ import annotations

import errno as errno_mod
import json
import os
from pathlib import Path, PurePosixPath
from typing import List, Optional, Sequence, Tuple

from ..errors import Action, CaptureFormatError
from .capture import CAPTURE_FORMAT, CAPTURE_VERSION, relative_file_path
from .protocol import DEFAULT_TIMEOUT, CommandResult, PlatformFacts

_ERRNOS = {name: code for code, name in errno_mod.errorcode.items()}


class ReplaySystem:
    """Answers from a capture directory; anything not recorded does not exist."""

    def __init__(self, directory: str) -> None:
        self.root = Path(directory)
        index_path = self.root / "capture.json"
        if not index_path.is_file():
            raise CaptureFormatError(
                f"{directory} is not a capture: capture.json is missing",
                hint="name a directory written by capturing detection on the machine to replay (it holds capture.json)",
            )
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CaptureFormatError(f"{index_path}: not valid JSON ({exc})") from None
        if not isinstance(index, dict) or index.get("format") != CAPTURE_FORMAT:
            raise CaptureFormatError(f"{index_path}: not an accelstack capture (format field)")
        if index.get("version") != CAPTURE_VERSION:
            raise CaptureFormatError(
                f"{index_path}: capture format version {index.get('version')!r} is not supported "
                f"(this accelstack reads version {CAPTURE_VERSION})",
                hint="update accelstack, or capture the machine again with this version",
                action=Action.UPDATE_ACCELSTACK,
            )
        self.index = index
        try:
            self._platform = PlatformFacts(**index["platform"])
        except (KeyError, TypeError) as exc:
            raise CaptureFormatError(f"{index_path}: bad platform section ({exc})") from None
        self._commands = list(index.get("commands", []))
        self._used = [False] * len(self._commands)

    # -- files -------------------------------------------------------------------------------
    def _file(self, path: str) -> Path:
        return self.root / "files" / relative_file_path(path)

    def _raise(self, path: str, default: str = "ENOENT") -> None:
        name = self.index.get("errors", {}).get(path, default)
        code = _ERRNOS.get(name, errno_mod.EIO)
        raise OSError(code, os.strerror(code), path)

    def platform(self) -> PlatformFacts:
        return self._platform

    def read_text(self, path: str) -> str:
        if path in self.index.get("errors", {}):
            self._raise(path)
        f = self._file(path)
        if not f.is_file():
            self._raise(path)
        return f.read_bytes().decode("utf-8", errors="replace")

    def list_dir(self, path: str) -> List[str]:
        dirs = self.index.get("dirs", {})
        if path in dirs:
            if dirs[path] is None:
                self._raise(path)
            return list(dirs[path])
        if path in self.index.get("errors", {}):
            self._raise(path)
        d = self._file(path)
        if not d.is_dir():
            self._raise(path)
        return sorted(p.name for p in d.iterdir())

    def exists(self, path: str) -> bool:
        logged = self.index.get("exists", {})
        if path in logged:
            return bool(logged[path])
        if path in self.index.get("dirs", {}) or path in self.index.get("links", {}):
            return True
        if path in self.index.get("errors", {}):
            return self.index["errors"][path] != "ENOENT"
        return self._file(path).exists()

    def readlink(self, path: str) -> Optional[str]:
        return self.index.get("links", {}).get(path)

    def access(self, path: str, mode: str) -> bool:
        logged = self.index.get("access", {})
        key = f"{path}:{mode}"
        if key in logged:
            return bool(logged[key])
        return self.exists(path)

    # -- commands ----------------------------------------------------------------------------
    def run(self, argv: Sequence[str], timeout: float = DEFAULT_TIMEOUT) -> CommandResult:
        """The first unused recorded command with the same argv (then any with that argv)."""
        argv = list(argv)
        candidates = [i for i, c in enumerate(self._commands) if c.get("argv") == argv]
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

    def _blob(self, rel: Optional[str]) -> str:
        if not rel:
            return ""
        p = self.root / PurePosixPath(rel)
        if not p.is_file():
            raise CaptureFormatError(f"{self.root}: capture.json names {rel}, which is missing")
        return p.read_bytes().decode("utf-8", errors="replace")

    def which(self, name: str) -> Optional[str]:
        logged = self.index.get("which", {})
        if name in logged:
            return logged[name]
        for c in self._commands:  # a recorded command that ran implies the program exists
            if c.get("argv", [None])[0] == name and not c.get("missing"):
                return name
        return None

    def env(self, name: str) -> Optional[str]:
        return self.index.get("env", {}).get(name)

    def memory(self) -> Tuple[Optional[int], Optional[int]]:
        mem = self.index.get("memory") or [None, None]
        return (mem + [None, None])[0], (mem + [None, None])[1]

    def disk_free(self, path: str) -> Optional[int]:
        disk = self.index.get("disk", {})
        if path in disk:
            return disk[path]
        return next(iter(disk.values()), None)

    def cpu_count(self) -> Tuple[Optional[int], Optional[int]]:
        cc = self.index.get("cpu_count") or [None, None]
        return (cc + [None, None])[0], (cc + [None, None])[1]
