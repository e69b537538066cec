"""``LiveSystem``: this machine, read through the ``System`` protocol.

Reads are capped and every command has a timeout, because a runaway sysfs file or a wedged GPU
(``nvidia-smi`` hanging in the kernel) must not stall detection.
"""
from __future__ import annotations

import errno as errno_mod
import logging
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from ..limits import MAX_CAPTURE_FILE_BYTES
from .protocol import DEFAULT_TIMEOUT, CommandResult, PlatformFacts

log = logging.getLogger(__name__)

_ACCESS_MODES = {"r": os.R_OK, "w": os.W_OK, "rw": os.R_OK | os.W_OK, "x": os.X_OK}
_OPEN_FLAGS = {"r": os.O_RDONLY, "w": os.O_WRONLY, "rw": os.O_RDWR}


class LiveSystem:
    """This machine. Reads are capped so a runaway sysfs file cannot stall detection."""

    MAX_READ = MAX_CAPTURE_FILE_BYTES  # ReplaySystem caps replayed reads the same way

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
            return CommandResult(argv, returncode=None, stderr=str(exc), missing=exc.errno == errno_mod.ENOENT)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            log.warning("%s did not answer within %g s; killed", argv[0], timeout)
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

            physical: Optional[int] = psutil.cpu_count(logical=False)
        except Exception:
            physical = None
        return physical, logical
