"""The supervisor: starts the worker, waits for it, watches it, restarts it, and stops it.

Liveness is judged on more than a ping. A worker deep in a heavy step may answer a ping late
(the field's usual approach kills it then, and the user loses a healthy generation), so a job is
"stalled" only when, for ``stall_timeout`` seconds, *none* of these moved:

* the worker's progress callbacks (``ticks``: sampling steps, VAE tiles, loading), read from
  ``/status`` when it answers;
* the worker's CPU time (user + system of the process tree), read from the OS, which needs no
  answer from the worker at all.

A process that is gone is "dead" at once. Heartbeats (the worker's clock, advanced by its own
thread) tell a slow answer from a wedged interpreter in the diagnostics. Dead and stalled
workers are killed (the whole process tree) and restarted on next use with exponential
backoff, at most ``max_restarts`` times within ``restart_window`` seconds.

Library code: no prints; progress goes to the ``progress`` callback (stage ``generate``).
"""
from __future__ import annotations

import http.client
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..events import ProgressCallback, ProgressEvent, null_progress
from ..serde import from_dict, to_dict
from .config import EngineOptions
from .errors import (CancelledError, EngineError, GenerationError, ModelLoadError, WorkerCrashedError,
                     WorkerStartError)
from .protocol import EXIT_CANCELLED, GenerateRequest, GenerateResult, WorkerStatus
from .runtime import Runtime

TOKEN_ENV = "ACCELSTACK_WORKER_TOKEN"


@dataclass
class SupervisorPolicy:
    """Deadlines and limits, in seconds. The defaults suit real models on real hardware;
    tests shrink them."""

    startup_timeout: float = 60.0  # until the worker is listening (Python start + imports)
    load_timeout: float = 900.0  # until the model is loaded (big models on slow disks)
    poll_interval: float = 1.0  # long-poll window: changes (steps, the end) arrive at once anyway
    ping_timeout: float = 2.0  # one /status call; a late answer is not a verdict by itself
    stall_timeout: float = 180.0  # no progress callback and no CPU time for this long = hung
    cpu_progress: float = 0.05  # CPU seconds that count as "working"
    job_timeout: Optional[float] = None  # whole job; None = no limit (stalls are caught anyway)
    max_restarts: int = 3
    restart_window: float = 600.0
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    shutdown_grace: float = 3.0


@dataclass
class RestartRecord:
    """Why the worker was restarted, and the backoff it waited."""

    reason: str
    delay: float
    at: float


class _WorkerLost(Exception):
    """Internal: the worker died or stalled during a job (the job may be retried)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class LivenessJudge:
    """Decides "working" vs "stalled" from what can be observed from outside.

    ``observe`` takes the time, the process tree's CPU seconds (None if unknown) and the
    worker's progress ``ticks`` (None when ``/status`` did not answer in time).
    """

    def __init__(self, stall_timeout: float, cpu_progress: float = 0.05) -> None:
        self.stall_timeout = stall_timeout
        self.cpu_progress = cpu_progress
        self.last_progress = 0.0
        self.cpu_mark: Optional[float] = None
        self.ticks_mark: Optional[int] = None
        self.evidence = "started"

    def reset(self, now: float, cpu: Optional[float] = None, ticks: Optional[int] = None) -> None:
        self.last_progress, self.cpu_mark, self.ticks_mark, self.evidence = now, cpu, ticks, "started"

    def observe(self, now: float, cpu: Optional[float], ticks: Optional[int]) -> str:
        if ticks is not None:
            if self.ticks_mark is None or ticks != self.ticks_mark:
                if self.ticks_mark is not None:
                    self.last_progress, self.evidence = now, "progress callback"
                self.ticks_mark = ticks
        if cpu is not None:
            if self.cpu_mark is None:
                self.cpu_mark = cpu
            elif cpu - self.cpu_mark >= self.cpu_progress:
                self.last_progress, self.evidence, self.cpu_mark = now, "CPU time", cpu
        return "stalled" if now - self.last_progress > self.stall_timeout else "working"

    def idle_for(self, now: float) -> float:
        return now - self.last_progress


def _tree_cpu_seconds(pid: int) -> Optional[float]:
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


def kill_tree(pid: int, timeout: float = 5.0) -> None:
    """Kill ``pid`` and every descendant (children first found, then all at once)."""
    import psutil

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


class Supervisor:
    """One worker for one runtime (and optionally one loaded model).

    Use as a context manager, or call :meth:`start` and :meth:`stop`. Thread-safe for
    :meth:`cancel` from another thread while :meth:`generate` runs.
    """

    def __init__(self, runtime: Runtime, model: Optional[str] = None, options: Optional[EngineOptions] = None,
                 policy: Optional[SupervisorPolicy] = None, progress: ProgressCallback = null_progress,
                 extra_env: Optional[Dict[str, str]] = None) -> None:
        self.runtime = runtime
        self.model = str(model) if model else ""
        self.options = (options or EngineOptions()).validate()
        self.policy = policy or SupervisorPolicy()
        self.progress = progress
        self.extra_env = dict(extra_env or {})
        self.restarts: List[RestartRecord] = []
        self.launches = 0
        self.last_status: Optional[WorkerStatus] = None
        self._proc: Optional[subprocess.Popen] = None
        self._port = 0
        self._token = ""
        self._dir: Optional[Path] = None  # per-supervisor folder: ready files and worker logs
        self._log_path: Optional[Path] = None
        self._log_file = None
        self._failures: List[float] = []  # times of crashes/stalls, for backoff and the cap
        self._pending_restart: Optional[str] = None
        self._saved_tail: List[str] = []
        self._cancel = threading.Event()
        self._lock = threading.RLock()

    # -- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> "Supervisor":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc is not None else None

    @property
    def log_path(self) -> Optional[Path]:
        return self._log_path

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> WorkerStatus:
        """Launch the worker and wait until it is ready (model loaded). On failure nothing is
        left running (``log_tail()`` still has the worker's last lines)."""
        with self._lock:
            if self.alive():
                return self.status()
            try:
                self._launch()
                return self._wait_ready()
            except BaseException:
                self._saved_tail = self.log_tail(40)
                self.stop()
                raise

    def stop(self) -> None:
        """Ask the worker to shut down; kill its whole process tree if it does not go in time."""
        with self._lock:
            proc = self._proc
            if self._log_path is not None and self._log_path.is_file():
                self._saved_tail = self.log_tail(40)
            if proc is not None and proc.poll() is None:
                try:
                    self._request("POST", "/shutdown", {}, timeout=1.0)
                except (OSError, http.client.HTTPException):
                    pass
                try:
                    proc.wait(self.policy.shutdown_grace)
                except subprocess.TimeoutExpired:
                    pass
            if proc is not None:
                kill_tree(proc.pid)
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    pass
            self._proc = None
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def restart(self, reason: str = "requested") -> WorkerStatus:
        with self._lock:
            self._kill()
            self._pending_restart = reason
            return self._ensure_running()

    # -- launching ------------------------------------------------------------------------------
    def _launch(self) -> None:
        if self._dir is None or not self._dir.is_dir():
            self._dir = Path(tempfile.mkdtemp(prefix="accelstack-worker-"))
        self.launches += 1
        ready = self._dir / f"ready-{self.launches}.json"
        self._token = secrets.token_urlsafe(32)
        env = self.runtime.worker_env()
        env.update(self.extra_env)
        env[TOKEN_ENV] = self._token
        cmd = self.runtime.worker_command() + ["--ready-file", str(ready),
               "--parent-pid", str(os.getpid()), "--options", json.dumps(to_dict(self.options))]
        if self.model:
            cmd += ["--model", self.model]
        if self._log_file is not None:
            self._log_file.close()
        self._log_path = self._dir / f"worker-{self.launches}.log"
        self._log_file = open(self._log_path, "wb")
        kwargs: Dict[str, Any] = {}
        if os.name == "posix":
            kwargs["start_new_session"] = True  # its own process group: Ctrl-C goes to us, we stop it
        else:
            kwargs["creationflags"] = getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)
        try:
            self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log_file,
                                          stderr=subprocess.STDOUT, env=env, cwd=str(self._dir), **kwargs)
        except OSError as exc:
            raise WorkerStartError(f"cannot start the worker with {cmd[0]}: {exc.strerror or exc}",
                                   hint="check the runtime's Python interpreter") from None
        deadline = time.monotonic() + self.policy.startup_timeout
        while not ready.is_file():
            if self._proc.poll() is not None:
                raise self._start_failure(f"the worker exited during start (exit code {self._proc.returncode})")
            if time.monotonic() > deadline:
                self._kill()
                raise WorkerStartError(f"the worker did not start within {self.policy.startup_timeout:.0f} s",
                                       hint=f"see the worker log {self._log_path}", log_tail=self.log_tail())
            time.sleep(0.02)
        info = json.loads(ready.read_text())
        self._port = int(info["port"])

    def _wait_ready(self) -> WorkerStatus:
        deadline = time.monotonic() + self.policy.load_timeout
        assert self._proc is not None
        version = -1
        while True:
            if self._proc.poll() is not None:
                rc = self._proc.returncode
                if self.model:
                    tail = self._reason_from_log()
                    raise ModelLoadError(
                        f"cannot load model {self.model}: the runtime crashed while loading it (exit code {rc})"
                        + (f": {tail}" if tail else ""),
                        hint="the file may be damaged or not a Stable Diffusion model; "
                        f"the worker log was {self._log_path}")
                raise self._start_failure(f"the worker exited while starting (exit code {rc})")
            st = self._try_status(self.policy.ping_timeout, wait=self.policy.poll_interval, since=version)
            if st is None:
                time.sleep(0.05)
            else:
                version = st.version
                if st.phase == "ready":
                    return st
                if st.phase == "error":
                    self._kill()
                    if st.error_kind == "ModelLoadError":
                        raise ModelLoadError(st.error, hint="check that the file is a complete Stable Diffusion "
                                             "model (.safetensors, .gguf, .ckpt or a diffusers folder)")
                    raise WorkerStartError(f"the worker could not start the runtime: {st.error}",
                                           hint="the runtime is broken or does not match this machine; "
                                           "reinstall it with `accelstack install`", log_tail=self.log_tail())
            if time.monotonic() > deadline:
                self._kill()
                raise WorkerStartError(f"the worker was not ready within {self.policy.load_timeout:.0f} s",
                                       hint=f"see the worker log {self._log_path}", log_tail=self.log_tail())

    def _start_failure(self, what: str) -> WorkerStartError:
        return WorkerStartError(what + (": " + self._reason_from_log() if self._reason_from_log() else ""),
                                hint=f"see the worker log {self._log_path}", log_tail=self.log_tail())

    def log_tail(self, lines: int = 20) -> List[str]:
        """The last lines of the current worker's log (or of the last one, once stopped)."""
        if self._log_path is None or not self._log_path.is_file():
            return self._saved_tail[-lines:]
        if self._log_file is not None:
            self._log_file.flush()
        text = self._log_path.read_bytes()[-16384:].decode("utf-8", errors="replace")
        return [line for line in text.splitlines() if line.strip()][-lines:]

    def _reason_from_log(self) -> str:
        tail = self.log_tail(40)
        for tag in ("[ERROR]", "Error", "[WARN]"):
            hits = [line.strip() for line in tail if tag in line]
            if hits:
                return hits[-1]
        return tail[-1].strip() if tail else ""

    def _kill(self) -> None:
        if self._proc is not None:
            kill_tree(self._proc.pid)
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                pass

    def _ensure_running(self) -> WorkerStatus:
        """Start the worker if it is not running, after the backoff its failures earned."""
        if self.alive():
            st = self._try_status(self.policy.ping_timeout)
            if st is None or st.phase in ("ready", "generating"):
                return st or WorkerStatus(phase="ready", pid=self.pid or 0)
        now = time.monotonic()
        if self._proc is not None and self._pending_restart is None:  # it died while idle: a crash too
            rc = self._proc.poll()
            if rc not in (None, 0, EXIT_CANCELLED):
                self._failures.append(now)
                self._pending_restart = f"the worker died while idle (exit code {rc}{_signal_name(rc)})"
        recent = [t for t in self._failures if now - t <= self.policy.restart_window]
        self._failures = recent
        delay = 0.0
        if recent:
            if len(recent) > self.policy.max_restarts:
                raise WorkerCrashedError(
                    f"the worker failed {len(recent)} times in {self.policy.restart_window:.0f} s "
                    f"(last: {self._pending_restart or 'unknown'}); not restarting it again",
                    hint=f"see the worker log {self._log_path}; the runtime may not work on this machine")
            delay = min(self.policy.backoff_max, self.policy.backoff_initial * 2 ** (len(recent) - 1))
        if self._proc is not None or self._pending_restart:
            self.restarts.append(RestartRecord(reason=self._pending_restart or "worker exited", delay=delay,
                                               at=time.time()))
            self.progress(ProgressEvent("message", "generate", message=f"restarting the worker "
                                        f"({self._pending_restart or 'it exited'}) after {delay:.1f} s"))
            if delay:
                time.sleep(delay)
        self._pending_restart = None
        self._kill()
        self._launch()
        return self._wait_ready()

    # -- requests -------------------------------------------------------------------------------
    def _request(self, method: str, path: str, body: Optional[Dict[str, Any]] = None,
                 timeout: float = 10.0) -> Tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self._port, timeout=timeout)
        try:
            data = json.dumps(body).encode() if body is not None else None
            headers = {"Authorization": f"Bearer {self._token}"}
            if data is not None:
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw else {})
        finally:
            conn.close()

    def _try_status(self, timeout: float, wait: float = 0.0, since: Optional[int] = None) -> Optional[WorkerStatus]:
        """The worker's status; with ``wait`` and ``since``, a long poll that answers as soon as
        the worker's state version differs from ``since`` (a phase change, a step)."""
        path = f"/status?wait={wait}&since={since}" if wait and since is not None else "/status"
        try:
            code, data = self._request("GET", path, timeout=timeout + wait)
        except (OSError, http.client.HTTPException, ValueError):
            return None
        if code != 200:
            return None
        st = from_dict(WorkerStatus, data)
        self.last_status = st
        return st

    def ping(self, timeout: Optional[float] = None) -> bool:
        try:
            code, _ = self._request("GET", "/ping", timeout=timeout or self.policy.ping_timeout)
            return code == 200
        except (OSError, http.client.HTTPException, ValueError):
            return False

    def status(self, timeout: Optional[float] = None) -> WorkerStatus:
        st = self._try_status(timeout or self.policy.ping_timeout)
        if st is None:
            raise WorkerCrashedError("the worker did not answer a status request",
                                     hint=f"see the worker log {self._log_path}")
        return st

    def cancel(self) -> bool:
        """Cancel the running job: its :meth:`generate` raises :class:`CancelledError` and the next
        call gets a fresh worker (a running step cannot be interrupted inside the worker).
        Returns True if the worker was generating when asked."""
        self._cancel.set()
        try:
            code, data = self._request("POST", "/cancel", {}, timeout=self.policy.ping_timeout)
            return code == 200 and bool(data.get("cancelled"))
        except (OSError, http.client.HTTPException, ValueError):
            return False

    # -- generation -----------------------------------------------------------------------------
    def generate(self, request: GenerateRequest, attempts: int = 1) -> GenerateResult:
        """Run one job. A worker that dies or stalls is killed; with ``attempts`` > 1 the job is
        run again on a restarted worker (restarts are counted in the result)."""
        request.validate()
        if not self.model:
            raise GenerationError("this supervisor has no model loaded", hint="pass model= to Supervisor")
        restarts_before = len(self.restarts)
        last = ""
        for attempt in range(max(1, attempts)):
            with self._lock:
                self._ensure_running()
            self._cancel.clear()
            try:
                result = self._run_job(request)
                result.restarts = len(self.restarts) - restarts_before
                self._failures.clear()  # a success resets the backoff
                return result
            except _WorkerLost as lost:
                last = lost.reason
                self._failures.append(time.monotonic())
                self._pending_restart = lost.reason
        tail = " | ".join(self.log_tail(3))
        raise WorkerCrashedError(f"generation failed: {last}" + (f" (tried {attempts} times)" if attempts > 1 else ""),
                                 hint="the runtime may not work on this machine; try `accelstack verify`"
                                 + (f"; the worker's last log lines: {tail}" if tail else ""))

    def _run_job(self, request: GenerateRequest) -> GenerateResult:
        assert self._proc is not None
        try:
            code, data = self._request("POST", "/generate", to_dict(request), timeout=max(5.0, self.policy.ping_timeout))
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self._kill()
            raise _WorkerLost(f"the worker did not accept the job ({exc})") from None
        if code == 400:
            raise GenerationError(data.get("error", "bad request"), hint=data.get("hint") or None)
        if code != 202:
            raise GenerationError(f"the worker refused the job: {data.get('error', code)}")
        job = data["job"]
        self.last_status = None  # from now on, the statuses of this job
        cancel_sent = False
        total = request.steps * request.batch_count
        task = f"{request.width}x{request.height}, {request.steps} steps" + (
            f" x{request.batch_count}" if request.batch_count > 1 else "")
        self.progress(ProgressEvent("start", "generate", task=task, total=total, extra={"unit": "step"}))
        judge = LivenessJudge(self.policy.stall_timeout, self.policy.cpu_progress)
        started = time.monotonic()
        judge.reset(started, _tree_cpu_seconds(self._proc.pid))
        done, version = 0, -1
        try:
            while True:
                if self._proc.poll() is not None:
                    rc = self._proc.returncode
                    if self._cancel.is_set() or rc == EXIT_CANCELLED:
                        self._pending_restart = "cancelled"
                        raise CancelledError("generation cancelled")
                    raise _WorkerLost(f"the worker died during generation (exit code {rc}{_signal_name(rc)})")
                if self._cancel.is_set() and not cancel_sent:  # a cancel that raced with the job's start
                    cancel_sent = True
                    try:
                        self._request("POST", "/cancel", {}, timeout=self.policy.ping_timeout)
                    except (OSError, http.client.HTTPException, ValueError):
                        pass
                # One long poll per step (or per poll_interval): the status answers at the next change.
                st = self._try_status(self.policy.ping_timeout, wait=self.policy.poll_interval, since=version)
                if st is not None:
                    version = st.version
                    outcome = self._poll_result(job, wait=0.0) if st.job != job or st.phase != "generating" else None
                else:  # no answer in time (busy, or hung): wait on the result itself, judge below
                    outcome = self._poll_result(job, wait=self.policy.poll_interval)
                if outcome is not None:
                    if "result" in outcome:
                        result = from_dict(GenerateResult, outcome["result"])
                        self.progress(ProgressEvent("end", "generate", task=task, ok=True, done=total, total=total))
                        return result
                    raise GenerationError(outcome.get("error", "generation failed"), hint=outcome.get("hint") or None)
                now = time.monotonic()
                verdict = judge.observe(now, _tree_cpu_seconds(self._proc.pid), st.ticks if st else None)
                if st is not None and st.job == job:
                    now_done = min(total, st.images_done * request.steps + st.step)
                    if now_done != done:
                        done = now_done
                        self.progress(ProgressEvent("advance", "generate", task=task, done=done, total=total))
                if verdict == "stalled":
                    beat = ""
                    if st is not None:
                        beat = f"; its heartbeat is {max(0.0, st.now - st.heartbeat):.1f} s old"
                    self._kill()
                    raise _WorkerLost(f"the worker stopped making progress for {judge.idle_for(now):.0f} s "
                                      f"(no step, no CPU time{beat if st else '; it does not answer'})")
                if self.policy.job_timeout is not None and now - started > self.policy.job_timeout:
                    self._kill()
                    raise _WorkerLost(f"the job ran over its {self.policy.job_timeout:.0f} s limit")
        except BaseException:
            self.progress(ProgressEvent("end", "generate", task=task, ok=False, done=done, total=total))
            raise

    def _poll_result(self, job: str, wait: float) -> Optional[Dict[str, Any]]:
        """The job's outcome, or None while it runs (with ``wait``, a long poll that answers as
        soon as the job ends)."""
        try:
            code, data = self._request("GET", f"/result?job={job}&wait={wait}",
                                       timeout=wait + max(2.0, self.policy.ping_timeout))
        except (OSError, http.client.HTTPException, ValueError):
            time.sleep(0.05)  # a worker that refuses connections is about to show up as dead
            return None
        if code == 200:
            return data
        if code == 404:
            raise GenerationError(f"the worker lost job {job}")
        return None


def _signal_name(rc: Optional[int]) -> str:
    if rc is None or rc >= 0:
        return ""
    try:
        return f", killed by {signal.Signals(-rc).name}"
    except ValueError:
        return ""


__all__ = ["Supervisor", "SupervisorPolicy", "LivenessJudge", "RestartRecord", "kill_tree", "EngineError"]
