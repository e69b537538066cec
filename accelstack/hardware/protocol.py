"""The ``System`` protocol: what detection may ask of a machine, and the plain facts it gets back.

Detection touches the OS only through a ``System`` (``LiveSystem`` in ``live.py``, the recorder in
``capture.py``, the player in ``replay.py``), so the same probes run on this machine, on a capture
of a Windows laptop, and in tests, and no module keeps platform globals.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, List, Mapping, Optional, Protocol, Sequence, Tuple

from ..settings import Timeouts
from .report import Record

__all__ = ["DEFAULT_TIMEOUT", "CommandResult", "FileStamp", "Finished", "PlatformFacts", "RunningCommand", "System",
           "SystemEnviron"]

DEFAULT_TIMEOUT = Timeouts.detect  # seconds for one probe command; the one default is Settings'


@dataclass(eq=False, repr=False)  # Record's == and repr
class PlatformFacts(Record):
    """What ``platform`` says about a machine (the strings it returns, as captures record them)."""

    system: str  # platform.system(): "Linux" | "Windows" | "Darwin"
    release: str = ""  # platform.release()
    version: str = ""  # platform.version()
    machine: str = ""  # platform.machine(): "x86_64", "AMD64", "arm64", "aarch64"
    python_version: str = ""
    libc: str = ""  # platform.libc_ver()[0]
    libc_version: str = ""
    mac_version: str = ""  # platform.mac_ver()[0]
    win_version: str = ""  # platform.win32_ver()[1]

    @property
    def os_name(self) -> str:
        """``linux`` | ``windows`` | ``macos`` (the names ``Settings`` uses), else the lowercase system."""
        system = self.system.lower()
        return {"darwin": "macos"}.get(system, system)


@dataclass(eq=False, repr=False)  # Record's == and repr
class CommandResult(Record):
    """How one external command ended: its output, exit code, or that it hung or is not installed."""

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


#: (size in bytes, modification time in ns) of a file, as ``os.stat`` (following links) gives them.
FileStamp = Tuple[int, int]


class RunningCommand(Protocol):
    """A command that was started and is collected later (``System.start``), so detection can read
    sysfs while a slow child (the Vulkan enumeration) loads its drivers."""

    def result(self) -> CommandResult: ...


class Finished:
    """A command already answered: what ``start`` gives where nothing runs in the background (a replay)."""

    def __init__(self, result: CommandResult) -> None:
        self._result = result

    def result(self) -> CommandResult:
        return self._result


class System(Protocol):
    """What detection may ask of a machine. File reads raise OSError like ``open`` does."""

    def platform(self) -> PlatformFacts: ...

    def read_text(self, path: str) -> str: ...

    def list_dir(self, path: str) -> List[str]: ...

    def exists(self, path: str) -> bool: ...

    def readlink(self, path: str) -> Optional[str]: ...

    def access(self, path: str, mode: str) -> bool: ...

    def run(self, argv: Sequence[str], timeout: float = DEFAULT_TIMEOUT) -> CommandResult: ...

    def start(self, argv: Sequence[str], timeout: float = DEFAULT_TIMEOUT) -> RunningCommand:
        """``run``, collected later: ``timeout`` counts from the start."""
        ...

    def stat(self, path: str) -> Optional[FileStamp]:
        """(size, mtime in ns) of ``path`` (links followed), None when it cannot be read: what a
        cached probe result is keyed by."""
        ...

    def which(self, name: str) -> Optional[str]: ...

    def env(self, name: str) -> Optional[str]: ...

    def memory(self) -> Tuple[Optional[int], Optional[int]]: ...

    def disk_free(self, path: str) -> Optional[int]: ...

    def cpu_count(self) -> Tuple[Optional[int], Optional[int]]: ...


class SystemEnviron(Mapping[str, str]):
    """A System's environment as a read-only mapping, for rules written against ``os.environ``
    (``Settings.resolve``). Each lookup goes through ``System.env``, so a capture records it and a
    replay answers it; the variables cannot be listed, so it iterates as empty."""

    def __init__(self, system: System) -> None:
        self.system = system

    def __getitem__(self, name: str) -> str:
        value = self.system.env(name)
        if value is None:
            raise KeyError(name)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0
