"""Run one long external step (pip, a CMake/ninja compile) with a time limit that stops the whole
process tree — a compile runs many compiler processes below pip, pip its build backends — passing
each output line on as it comes and, when asked, keeping the output in a log file.

Shared by the installer (torch's pip commands) and the publisher (sdist download, compile); the
limit is kept by a watchdog thread, so a step that hangs without printing is stopped too."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional

__all__ = ["TASKKILL_TIMEOUT", "TAIL_LINES", "Outcome", "run_logged", "kill_tree"]

log = logging.getLogger(__name__)

TASKKILL_TIMEOUT = 30.0  # seconds for `taskkill /T` on Windows
TAIL_LINES = 200


@dataclass
class Outcome:
    """How a step ended: its exit status, or ``timed_out`` when the time limit stopped it."""

    returncode: int
    timed_out: bool
    seconds: float
    log: Optional[Path]
    last_lines: List[str] = field(default_factory=list)  # the end of the output, kept in memory

    def tail(self, lines: int = 15) -> str:
        """The last ``lines`` of the step's output."""
        return "\n".join(self.last_lines[-lines:])


def run_logged(cmd: List[str], *, timeout: float, log_path: Optional[Path] = None, env: Optional[Mapping[str, str]] = None,
               on_line: Optional[Callable[[str], None]] = None) -> Outcome:
    """Run ``cmd``, passing each output line to ``on_line`` (and writing it to ``log_path``).

    Past ``timeout`` seconds the process and everything it started are killed and the outcome
    says ``timed_out``. ``on_line`` runs on the calling thread; a watchdog thread only kills.
    """
    start = time.monotonic()
    expired = threading.Event()
    last: Deque[str] = deque(maxlen=TAIL_LINES)
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
    with (open(log_path, "w", encoding="utf-8", errors="replace") if log_path is not None else nullcontext()) as out:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                                env=dict(env) if env is not None else None, **_own_group())

        def expire() -> None:
            expired.set()
            log.info("%s ran past %.0f s; stopping it and its children", cmd[0], timeout)
            kill_tree(proc)

        watchdog = threading.Timer(timeout, expire)
        watchdog.daemon = True
        watchdog.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                last.append(line.rstrip("\n"))
                if out is not None:
                    out.write(line)
                if on_line is not None:
                    on_line(line)
            rc = proc.wait()
        except BaseException:  # an interrupt or a failing callback: leave no compiler running
            kill_tree(proc)
            proc.wait()
            raise
        finally:
            watchdog.cancel()
    return Outcome(rc, expired.is_set(), time.monotonic() - start, log_path, list(last))


def _own_group() -> Dict[str, Any]:
    """Popen arguments that make the child the head of a process group ``kill_tree`` can end."""
    if os.name == "nt":
        return {"creationflags": getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)}
    return {"start_new_session": True}


def kill_tree(proc: subprocess.Popen[str]) -> None:
    """Kill ``proc`` and the processes it started (its process group / job tree)."""
    if os.name == "nt":
        try:
            subprocess.run(["taskkill", "/F", "/T", "/PID", str(proc.pid)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=TASKKILL_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired):
            pass
        _kill(proc)
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the group outlives its head while children run
    except OSError:
        _kill(proc)


def _kill(proc: subprocess.Popen[str]) -> None:
    try:
        proc.kill()
    except OSError:
        pass
