"""One object for all OS access: the only door detection uses to look at a machine.

``LiveSystem`` looks at this machine. ``CapturingSystem`` wraps another System and records every
answer; ``save(dir)`` writes them in the capture format below. ``ReplaySystem`` answers from such a
directory, on any OS, so a Windows laptop's or an 8-GPU server's detection runs in a test here and
a user can attach their capture to a bug report.

Capture format, version 1 (a directory):

    capture.json       {"format": "accelstack-capture", "version": 1, "created": ISO time,
                        "platform": {...PlatformFacts...}, "env": {NAME: value},
                        "which": {NAME: path|null}, "access": {"PATH:MODE": bool},
                        "links": {PATH: target}, "dirs": {PATH: [names]|null},
                        "errors": {PATH: "ENOENT"|"EACCES"|...},
                        "memory": [total, available], "disk": {PATH: free},
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
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Dict, List, Optional, Protocol, Sequence, Tuple

from ..errors import CaptureFormatError

CAPTURE_FORMAT = "accelstack-capture"
CAPTURE_VERSION = 1
DEFAULT_TIMEOUT = 5.0


@dataclass
class PlatformFacts:
    system: str  # platform.system(): "Linux" | "Windows" | "Darwin"
    release: str = ""  # platform.release()
    version: str = ""  # platform.version()
    machine: str = ""  # platform.machine(): "x86_64", "AMD64", "arm64", "aarch64"
    python_version: str = ""
    libc: str = ""  # platform.libc_ver()[0]
    libc_version: str = ""
    mac_version: str = ""  # platform.mac_ver()[0]
    win_version: str = ""  # platform.win32_ver()[1]


@dataclass
class CommandResult:
    argv: List[str]
    returncode: Optional[int] = None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    missing: bool = False  # the program is not installed
    duration_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.missing


class System(Protocol):
    """What detection may ask of a machine. File reads raise OSError like ``open`` does."""

    def platform(self) -> PlatformFacts: ...

    def read_text(self, path: str) -> str: ...

    def list_dir(self, path: str) -> List[str]: ...

    def exists(self, path: str) -> bool: ...

    def readlink(self, path: str) -> Optional[str]: ...

    def access(self, path: str, mode: str) -> bool: ...

    def run(self, argv: Sequence[str], timeout: float = DEFAULT_TIMEOUT) -> CommandResult: ...

    def which(self, name: str) -> Optional[str]: ...

    def env(self, name: str) -> Optional[str]: ...

    def memory(self) -> Tuple[Optional[int], Optional[int]]: ...

    def disk_free(self, path: str) -> Optional[int]: ...

    def cpu_count(self) -> Tuple[Optional[int], Optional[int]]: ...


_ACCESS_MODES = {"r": os.R_OK, "w": os.W_OK, "rw": os.R_OK | os.W_OK, "x": os.X_OK}
_OPEN_FLAGS = {"r": os.O_RDONLY, "w": os.O_WRONLY, "rw": os.O_RDWR}


class LiveSystem:
    """This machine. Reads are capped so a runaway sysfs file cannot stall detection."""

    MAX_READ = 4 * 1024 * 1024

    def platform(self) -> PlatformFacts:
        libc, libc_version = platform.libc_ver() if sys.platform.startswith("linux") else ("", "")
        return PlatformFacts(
            system=platform.system(),
            release=platform.release(),
            version=platform.version(),
            machine=platform.machine(),
            python_version=platform.python_version(),
            libc=libc,
            libc_version=libc_version,
            mac_version=platform.mac_ver()[0] if sys.platform == "darwin" else "",
            win_version=platform.win32_ver()[1] if sys.platform == "win32" else "",
        )

    def read_text(self, path: str) -> str:
        with open(path, "rb") as fh:
            return fh.read(self.MAX_READ).decode("utf-8", errors="replace")

    def list_dir(self, path: str) -> List[str]:
        return sorted(os.listdir(path))

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def readlink(self, path: str) -> Optional[str]:
        try:
            return os.readlink(path)
        except OSError:
            return None

    def access(self, path: str, mode: str) -> bool:
        if path.startswith("/dev/") and mode in _OPEN_FLAGS:
            # os.access checks permission bits only (and says yes to root), but a device node can still
            # refuse to open: /dev/kfd in a container answers EINVAL. Open it as the runtime would.
            try:
                os.close(os.open(path, _OPEN_FLAGS[mode] | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)))
            except OSError:
                return False
            return True
        return os.access(path, _ACCESS_MODES[mode])

    def run(self, argv: Sequence[str], timeout: float = DEFAULT_TIMEOUT) -> CommandResult:
        argv = list(argv)
        start = time.perf_counter()
        exe = shutil.which(argv[0])
        if exe is None:
            return CommandResult(argv, missing=True)
        kwargs = {}
        if os.name == "nt":
            kwargs["creationflags"] = getattr(subprocess, "CREATE_NO_WINDOW", 0)
        try:
            proc = subprocess.Popen(
                [exe] + argv[1:],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**os.environ, "LC_ALL": "C"},
                **kwargs,
            )
        except OSError as exc:
            return CommandResult(argv, returncode=None, stderr=str(exc), missing=exc.errno == errno_mod.ENOENT)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            try:
                out, err = proc.communicate(timeout=1.0)
            except subprocess.TimeoutExpired:  # a child in uninterruptible sleep (wedged GPU)
                out, err = b"", b""
            return CommandResult(
                argv,
                returncode=None,
                stdout=out.decode("utf-8", "replace"),
                stderr=err.decode("utf-8", "replace"),
                timed_out=True,
                duration_ms=(time.perf_counter() - start) * 1000,
            )
        return CommandResult(
            argv,
            returncode=proc.returncode,
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            duration_ms=(time.perf_counter() - start) * 1000,
        )

    def which(self, name: str) -> Optional[str]:
        return shutil.which(name)

    def env(self, name: str) -> Optional[str]:
        return os.environ.get(name)

    def memory(self) -> Tuple[Optional[int], Optional[int]]:
        try:
            import psutil

            vm = psutil.virtual_memory()
            return int(vm.total), int(vm.available)
        except Exception:  # psutil missing or failing on an exotic platform
            return None, None

    def disk_free(self, path: str) -> Optional[int]:
        probe = Path(path)
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        try:
            return shutil.disk_usage(str(probe)).free
        except OSError:
            return None

    def cpu_count(self) -> Tuple[Optional[int], Optional[int]]:
        logical = os.cpu_count()
        try:
            import psutil

            physical = psutil.cpu_count(logical=False)
        except Exception:
            physical = None
        return physical, logical


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

    def save(self, directory: str) -> Path:
        """Write the capture directory; returns its path."""
        root = Path(directory)
        (root / "files").mkdir(parents=True, exist_ok=True)
        (root / "commands").mkdir(exist_ok=True)
        for path, text in self.files.items():
            dest = root / "files" / _rel(path)
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
            "cpu_count": list(self._cpu_count),
            "commands": commands,
        }
        (root / "capture.json").write_text(json.dumps(index, indent=2, sort_keys=True), encoding="utf-8")
        return root


def _rel(path: str) -> str:
    """Absolute path -> relative path under files/ (``C:\\x`` -> ``C/x``)."""
    p = path.replace("\\", "/")
    if len(p) > 1 and p[1] == ":":
        p = p[0] + p[2:]
    return p.lstrip("/")


_ERRNOS = {name: code for code, name in errno_mod.errorcode.items()}


class ReplaySystem:
    """Answers from a capture directory; anything not recorded does not exist."""

    def __init__(self, directory: str) -> None:
        self.root = Path(directory)
        index_path = self.root / "capture.json"
        if not index_path.is_file():
            raise CaptureFormatError(
                f"{directory} is not a capture: capture.json is missing",
                hint="create one with `accelstack detect --capture DIR`",
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
                hint="upgrade accelstack, or capture again with this version",
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
        return self.root / "files" / _rel(path)

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
