"""``LiveSystem``: this machine, read through the ``System`` protocol.

Reads are capped and every command has a timeout, because a runaway sysfs file or a wedged GPU
(``nvidia-smi`` hanging in the kernel) must not stall detection.

On Linux the platform facts, memory, core counts, PATH lookups and free disk come from ``os``
(``uname``, ``confstr``, ``statvfs``) and procfs/sysfs directly: ``platform`` compiles nine
regular expressions, ``psutil`` takes ~10 ms to import and ``shutil`` ~1.5 ms (it loads bz2 and
lzma), on every ``accelstack detect``. Other systems ask them.
"""
from __future__ import annotations

import errno as errno_mod
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..limits import MAX_CAPTURE_FILE_BYTES
from .protocol import DEFAULT_TIMEOUT, CommandResult, FileStamp, Finished, PlatformFacts, RunningCommand

if not sys.platform.startswith("linux"):  # Linux reads procfs, sysfs and uname itself (see above)
    import platform
    import shutil

    import psutil

__all__ = ["LiveSystem"]

log = logging.getLogger(__name__)
CPU_ROOT = "/sys/devices/system/cpu"

_ACCESS_MODES = {"r": os.R_OK, "w": os.W_OK, "rw": os.R_OK | os.W_OK, "x": os.X_OK}
_OPEN_FLAGS = {"r": os.O_RDONLY, "w": os.O_WRONLY, "rw": os.O_RDWR}


class LiveSystem:
    """This machine. Reads are capped so a runaway sysfs file cannot stall detection."""

    MAX_READ = MAX_CAPTURE_FILE_BYTES  # ReplaySystem caps replayed reads the same way

    def platform(self) -> PlatformFacts:
        return _platform_facts()

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
        return self.start(argv, timeout).result()

    def start(self, argv: Sequence[str], timeout: float = DEFAULT_TIMEOUT) -> RunningCommand:
        argv = list(argv)
        start = time.perf_counter()
        exe = _which(argv[0])
        if exe is None:
            return Finished(CommandResult(argv, missing=True))
        try:
            proc = subprocess.Popen(
                [exe] + argv[1:],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**os.environ, "LC_ALL": "C"},
                creationflags=getattr(subprocess, "CREATE_NO_WINDOW", 0) if os.name == "nt" else 0,
            )
        except OSError as exc:
            return Finished(CommandResult(argv, returncode=None, stderr=str(exc), missing=exc.errno == errno_mod.ENOENT))
        return _Child(argv, proc, start, timeout)

    def stat(self, path: str) -> Optional[FileStamp]:
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            return None
        return st.st_size, st.st_mtime_ns

    def which(self, name: str) -> Optional[str]:
        return _which(name)

    def env(self, name: str) -> Optional[str]:
        return os.environ.get(name)

    def memory(self) -> Tuple[Optional[int], Optional[int]]:
        return _memory()

    def disk_free(self, path: str) -> Optional[int]:
        probe = Path(path)
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        try:
            return _disk_free(str(probe))
        except OSError:
            return None

    def cpu_count(self) -> Tuple[Optional[int], Optional[int]]:
        return _physical_cores(), os.cpu_count()


class _Child:
    """A started command; ``result`` waits for it until ``timeout`` after its start, then kills it."""

    def __init__(self, argv: List[str], proc: subprocess.Popen[bytes], start: float, timeout: float) -> None:
        self.argv, self.proc, self.start, self.timeout = argv, proc, start, timeout
        self._result: Optional[CommandResult] = None

    def result(self) -> CommandResult:
        if self._result is None:
            self._result = self._collect()
        return self._result

    def _collect(self) -> CommandResult:
        proc, argv = self.proc, self.argv
        # a child that finished while detection read other things still gets a moment to hand over
        # its output, however late it is collected
        left = max(self.timeout - (time.perf_counter() - self.start), 0.05)
        try:
            out, err = proc.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            log.warning("%s did not answer within %g s; killed", argv[0], self.timeout)
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
                duration_ms=(time.perf_counter() - self.start) * 1000,
            )
        return CommandResult(
            argv,
            returncode=proc.returncode,
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            duration_ms=(time.perf_counter() - self.start) * 1000,
        )


def _read(path: str) -> str:
    with open(path, "rb") as fh:
        return fh.read(MAX_CAPTURE_FILE_BYTES).decode("utf-8", errors="replace")


if sys.platform.startswith("linux"):
    def _platform_facts() -> PlatformFacts:
        """What ``platform`` answers on Linux, without importing it: ``uname``, and glibc's version
        from ``confstr`` (another C library reports none, as ``platform.libc_ver`` finds none)."""
        uname = os.uname()
        try:
            libc, _, libc_version = (os.confstr("CS_GNU_LIBC_VERSION") or "").partition(" ")
        except (ValueError, OSError):
            libc, libc_version = "", ""
        return PlatformFacts(system=uname.sysname, release=uname.release, version=uname.version, machine=uname.machine,
                             python_version=sys.version.split()[0], libc=libc if libc_version else "",
                             libc_version=libc_version.strip())

    def _memory() -> Tuple[Optional[int], Optional[int]]:
        """(total, available) bytes from /proc/meminfo (``MemAvailable``: the kernel's own estimate)."""
        try:
            text = _read("/proc/meminfo")
        except OSError:
            return None, None
        kib: Dict[str, int] = {}
        for line in text.splitlines():
            name, _, rest = line.partition(":")
            value = rest.split()
            if value and value[0].isascii() and value[0].isdigit():
                kib[name.strip()] = int(value[0]) * 1024
        total = kib.get("MemTotal")
        available = kib.get("MemAvailable")
        if available is None and total is not None:  # kernels before 3.14
            available = sum(kib.get(k, 0) for k in ("MemFree", "Buffers", "Cached"))
        return total, available

    def _which(name: str) -> Optional[str]:
        """``shutil.which`` on POSIX: ``name`` as given when it has a folder, else the first
        executable regular file of that name in the folders of PATH."""
        if os.sep in name:
            return name if _executable(name) else None
        for folder in dict.fromkeys(os.get_exec_path()):
            path = os.path.join(folder, name)
            if _executable(path):
                return path
        return None

    def _executable(path: str) -> bool:
        return os.path.exists(path) and os.access(path, os.X_OK) and not os.path.isdir(path)

    def _disk_free(path: str) -> int:
        st = os.statvfs(path)  # what shutil.disk_usage(path).free is on POSIX
        return st.f_bavail * st.f_frsize

    def _physical_cores() -> Optional[int]:
        """Cores, counted as distinct sets of sibling threads (what psutil counts on Linux)."""
        try:
            names = os.listdir(CPU_ROOT)
        except OSError:
            return None
        cores = set()
        for name in names:
            if not (name.startswith("cpu") and name[3:].isascii() and name[3:].isdigit()):
                continue
            for leaf in ("core_cpus_list", "thread_siblings_list"):
                try:
                    cores.add(_read(f"{CPU_ROOT}/{name}/topology/{leaf}").strip())
                    break
                except OSError:
                    continue
        return len(cores) or None
else:
    def _which(name: str) -> Optional[str]:
        return shutil.which(name)

    def _disk_free(path: str) -> int:
        return shutil.disk_usage(path).free

    def _platform_facts() -> PlatformFacts:
        return PlatformFacts(
            system=platform.system(),
            release=platform.release(),
            version=platform.version(),
            machine=platform.machine(),
            python_version=platform.python_version(),
            mac_version=platform.mac_ver()[0] if sys.platform == "darwin" else "",
            win_version=platform.win32_ver()[1] if sys.platform == "win32" else "",
        )

    def _memory() -> Tuple[Optional[int], Optional[int]]:
        try:
            vm = psutil.virtual_memory()
            return int(vm.total), int(vm.available)
        except Exception:  # psutil failing on an exotic platform
            return None, None

    def _physical_cores() -> Optional[int]:
        try:
            physical: Optional[int] = psutil.cpu_count(logical=False)
        except Exception:
            physical = None
        return physical
