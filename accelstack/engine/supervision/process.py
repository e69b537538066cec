"""The worker as an OS process: launch it, wait for its ready file, read its log, kill its tree.

One :class:`WorkerProcess` is one launch. It runs in its own process group (Ctrl-C reaches the
caller, which stops it), writes its output to a log file in the supervisor's folder, and reports
its port in a ready file written atomically. Killing takes the whole process tree, so a runtime's
helper processes never outlive it. Policy (when to kill or restart) is the supervisor's.
"""
from __future__ import annotations

import base64
import json
import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Any, Dict, List, Optional, Tuple

from ... import fsio
from ...errors import Action
from ...serde import to_dict
from ..config import EngineOptions
from ..errors import ModelLoadError, WorkerStartError
from ..runtime import Runtime
from ..worker.protocol import TOKEN_FILE

__all__ = ["WorkerProcess", "kill_tree", "tree_cpu_seconds", "signal_name"]

log = logging.getLogger(__name__)


def kill_tree(pid: int, timeout: float = 5.0) -> None:
    """Kill ``pid`` and every descendant (children first found, then all at once)."""
    import psutil  # here, not before the worker's spawn (~9 ms)

    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    try:
        procs = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        procs = [root]
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=timeout)


def tree_cpu_seconds(pid: int) -> Optional[float]:
    """User + system CPU seconds of ``pid`` and its descendants (None when it is gone)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        total = 0.0
        for p in [proc] + proc.children(recursive=True):
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return total
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def signal_name(rc: Optional[int]) -> str:
    """``", killed by SIGKILL"`` for a negative exit code, else ``""``."""
    if rc is None or rc >= 0:
        return ""
    try:
        return f", killed by {signal.Signals(-rc).name}"
    except ValueError:
        return ""


class WorkerProcess:
    """One launch of the worker (``cmd`` with ``env``) whose files live in ``folder``."""

    @classmethod
    def for_runtime(cls, runtime: Runtime, options: EngineOptions, model: str, extra_env: Dict[str, str],
                    folder: Path, number: int, await_model: float = 0.0,
                    deferred: bool = False) -> Tuple[WorkerProcess, str]:
        """Launch ``number`` of the worker on ``runtime`` (not started yet), and its random token
        (in a file of ``folder``, a private folder, that the worker removes; never on its command line).
        ``deferred``: the model and options are not known yet; :meth:`send_load` gives them later."""
        # secrets.token_urlsafe(32) is this; the secrets module would import hmac and OpenSSL (~4 ms) first
        token = base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode("ascii")
        env = runtime.worker_env()
        env.update(extra_env)
        token_file = fsio.write_bytes(folder / TOKEN_FILE.format(number=number), token.encode(), mode=0o600, durable=False)
        cmd = runtime.worker_command() + ["--ready-file", str(folder / f"ready-{number}.json"),
                                          "--parent-pid", str(os.getpid()), "--token-file", str(token_file)]
        if deferred:
            cmd += ["--load-file", str(folder / f"load-{number}.json"), "--await-model", f"{await_model:g}"]
        else:
            cmd += ["--options", json.dumps(to_dict(options))]
            if model:
                cmd += ["--model", model] + (["--await-model", f"{await_model:g}"] if await_model > 0 else [])
        return cls(cmd, env, folder, number), token

    def __init__(self, cmd: List[str], env: Dict[str, str], folder: Path, number: int) -> None:
        self.cmd = list(cmd)
        self.env = env
        self.folder = folder
        self.ready_path = folder / f"ready-{number}.json"
        self.load_path = folder / f"load-{number}.json"  # a deferred launch's model and options (send_load)
        self.log_path = folder / f"worker-{number}.log"
        self.port = 0
        self._proc: Optional[subprocess.Popen] = None
        self._log_file: Optional[IO[bytes]] = None

    # -- state ----------------------------------------------------------------------------------
    @property
    def pid(self) -> int:
        return self._proc.pid if self._proc is not None else 0

    def poll(self) -> Optional[int]:
        """The exit code, or None while it runs (or before it started)."""
        return self._proc.poll() if self._proc is not None else None

    @property
    def returncode(self) -> Optional[int]:
        return self._proc.returncode if self._proc is not None else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the process to end; True if it did."""
        if self._proc is None:
            return True
        try:
            self._proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    # -- start and end --------------------------------------------------------------------------
    def spawn(self) -> None:
        """Start the process (:meth:`wait_listening` then waits for its ready file)."""
        self._log_file = open(self.log_path, "wb")
        kwargs: Dict[str, Any] = {}
        if os.name == "posix":
            kwargs["start_new_session"] = True  # its own process group: Ctrl-C goes to us, we stop it
        else:
            kwargs["creationflags"] = getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)
        try:
            self._proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=self._log_file,
                                          stderr=subprocess.STDOUT, env=self.env, cwd=str(self.folder), **kwargs)
        except OSError as exc:
            raise WorkerStartError(f"cannot start the worker with {self.cmd[0]}: {exc.strerror or exc}",
                                   hint="check the runtime's Python interpreter") from None
        log.info("worker %d started: %s", self._proc.pid, " ".join(self.cmd[:3]))

    def wait_listening(self, startup_timeout: float) -> int:
        """Wait until the started process wrote its ready file; return its port."""
        assert self._proc is not None, "spawn() first"
        deadline = time.monotonic() + startup_timeout
        while not self.ready_path.is_file():
            rc = self._proc.poll()
            if rc is not None:
                log.warning("worker %d exited during start (exit code %d)", self._proc.pid, rc)
                raise self.start_failure(f"the worker exited during start (exit code {rc})")
            if time.monotonic() > deadline:
                self.kill("it did not start in time")
                raise WorkerStartError(f"the worker did not start within {startup_timeout:.0f} s",
                                       hint=f"see the worker log {self.log_path}", action=Action.RETRY,
                                       log_tail=self.log_tail())
            time.sleep(0.02)
        info = json.loads(self.ready_path.read_text())
        self.port = int(info["port"])
        log.debug("worker %d listens on 127.0.0.1:%d", self._proc.pid, self.port)
        return self.port

    def send_load(self, model: str, options: EngineOptions) -> None:
        """Give a deferred launch its model and options: a file that appears whole in the private
        folder, which the worker reads once it has imported the runtime."""
        fsio.write_bytes(self.load_path, json.dumps({"model": model, "options": to_dict(options)}).encode(),
                         mode=0o600, durable=False)

    def kill(self, reason: str) -> None:
        """Kill the whole process tree (if it still runs) and reap it."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            log.warning("killing worker %d and its children: %s", self._proc.pid, reason)
        kill_tree(self._proc.pid)
        if not self.wait(5):
            log.error("worker %d did not end after being killed", self._proc.pid)

    def reap_in_background(self, grace: float) -> None:
        """Wait for a process that is exiting on a helper thread (kill its tree if it has not ended
        after ``grace`` seconds), then close its log."""
        def reap() -> None:
            if not self.wait(grace):
                self.kill("it did not exit after saying it would")
            self.close()

        threading.Thread(target=reap, name="reap-worker", daemon=True).start()

    def close(self) -> None:
        """Close the log file (the process must have ended)."""
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    # -- diagnostics ----------------------------------------------------------------------------
    def start_failure(self, what: str) -> WorkerStartError:
        reason = self.reason_from_log()
        return WorkerStartError(what + (": " + reason if reason else ""), hint=f"see the worker log {self.log_path}",
                                log_tail=self.log_tail())

    def load_failure(self, model: str, rc: int, kept_log: str) -> ModelLoadError:
        """The error for a worker that died while loading ``model`` (its log is kept at ``kept_log``)."""
        tail = self.reason_from_log()
        return ModelLoadError(f"cannot load model {model}: the runtime crashed while loading it (exit code {rc}"
                              f"{signal_name(rc)})" + (f": {tail}" if tail else ""),
                              hint="the file may be damaged or not a Stable Diffusion model; "
                              f"the worker's log is kept at {kept_log}")

    def log_tail(self, lines: int = 20) -> List[str]:
        """The last non-empty lines of this launch's log ([] once the folder is gone)."""
        if self._log_file is not None:
            self._log_file.flush()
        try:
            text = self.log_path.read_bytes()[-16384:].decode("utf-8", errors="replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if line.strip()][-lines:]

    def reason_from_log(self) -> str:
        """The runtime's own explanation: its last error line, else warning, else last line."""
        tail = self.log_tail(40)
        for tag in ("[ERROR]", "Error", "[WARN]"):
            hits = [line.strip() for line in tail if tag in line]
            if hits:
                return hits[-1]
        return tail[-1].strip() if tail else ""
