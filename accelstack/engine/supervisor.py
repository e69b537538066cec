"""The supervisor: starts the worker, waits for it, watches it, restarts it, and stops it.

It combines three parts: :mod:`~accelstack.engine.process` (the OS process, its log, killing its
tree), :mod:`~accelstack.engine.client` (the worker's HTTP API) and
:mod:`~accelstack.engine.policy` (deadlines, the liveness judge, restart backoff). A process
that is gone is "dead" at once; a job is "stalled" only when neither progress callbacks nor CPU
time moved for ``stall_timeout`` seconds. Heartbeats (the worker's clock, advanced by its own
thread) tell a slow answer from a wedged interpreter in the diagnostics. Dead and stalled
workers are killed and restarted on next use, with backoff.

Library code: no prints; progress goes to the ``progress`` callback (stage ``stage``, by default
``generate``): the model's loading (its own progress when the runtime reports it, else a sign of
life every second), then each job's sampling steps, with a note of what the worker is doing
between them (encoding the prompt, decoding the image); diagnostics go to ``logging``.
"""
from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..errors import Action
from ..events import ProgressCallback, ProgressEvent, null_progress
from ..serde import from_dict
from .client import TRANSPORT_ERRORS, WorkerClient
from .config import EngineOptions
from .errors import CancelledError, GenerationError, ModelLoadError, WorkerCrashedError, WorkerStartError
from .policy import LivenessJudge, RestartBudget, RestartRecord, SupervisorPolicy, job_note, load_note
from .process import WorkerProcess, signal_name, tree_cpu_seconds
from .protocol import EXIT_CANCELLED, GenerateRequest, GenerateResult, WorkerStatus
from .runtime import Runtime
from .workdirs import clean_stale, make, mark_crashed

__all__ = ["Supervisor", "SupervisorPolicy"]

log = logging.getLogger(__name__)


class _WorkerLost(Exception):
    """Internal: the worker died or stalled during a job (the job may be retried); str() says why."""


class Supervisor:
    """One worker for one runtime (and optionally one loaded model).

    Use as a context manager, or call :meth:`start` and :meth:`stop`. Thread-safe for
    :meth:`cancel` from another thread while :meth:`generate` runs.
    """

    def __init__(self, runtime: Runtime, model: Optional[str] = None, options: Optional[EngineOptions] = None,
                 policy: Optional[SupervisorPolicy] = None, progress: ProgressCallback = null_progress,
                 extra_env: Optional[Dict[str, str]] = None, stage: str = "generate", model_label: str = "") -> None:
        self.runtime = runtime
        self.model = os.path.abspath(model) if model else ""  # the worker runs in its own folder
        self.stage = stage
        self.model_label = model_label or (Path(self.model).name if self.model else "")
        self.options = (options or EngineOptions()).validate()
        self.policy = policy or SupervisorPolicy()
        self.progress = progress
        self.extra_env = dict(extra_env or {})
        self.restarts: List[RestartRecord] = []
        self.launches = 0
        self.last_status: Optional[WorkerStatus] = None
        self.client = WorkerClient(0, "")
        self._proc: Optional[WorkerProcess] = None  # the latest launch (it may have died)
        self._dir: Optional[Path] = None  # per-supervisor folder: ready files and worker logs
        self._log_path: Optional[Path] = None
        self._budget = RestartBudget(self.policy)
        self._pending_restart: Optional[str] = None
        self._saved_tail: List[str] = []
        self._crashed = False  # a worker crashed: its folder (the log a message names) is kept
        self._stopping = self._exiting = False  # the worker was asked to exit; it answered that it does
        self._prestarted, self._token = False, ""  # prestart launched the current worker; start connects to it
        self._cancel = threading.Event()
        self._lock = threading.RLock()

    # -- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> Supervisor:
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
        return self._proc is not None and self._proc.alive()

    def start(self) -> WorkerStatus:
        """Launch the worker and wait until it is ready (model loaded). On failure nothing is
        left running (``log_tail()`` still has the worker's last lines)."""
        with self._lock:
            if self.alive() and not self._prestarted:
                return self.status()
            try:
                return self._launch_and_wait()
            except BaseException as exc:
                if isinstance(exc, WorkerStartError):  # its message or hint names the worker's log
                    self._keep_log()
                self._saved_tail = self.log_tail(40)
                self.stop()
                raise

    def stop(self, wait: bool = True) -> None:
        """Ask the worker to shut down; kill its whole process tree if it does not go in time. ``wait=False``
        only asks: its exit overlaps the caller's next work; a later stop() (or let_go()) ends it."""
        with self._lock:
            proc = self._proc
            if proc is not None:
                self._saved_tail = proc.log_tail(40) or self._saved_tail
                if proc.alive() and not self._stopping and not self._prestarted:  # prestarted: not connected yet
                    self._exiting = self.client.shutdown(timeout=1.0)
                    self._stopping = True
                if not wait:
                    return
                if proc.alive() and self._stopping:
                    proc.wait(self.policy.shutdown_grace)
                proc.kill("stopping the supervisor")
                log.info("worker %d stopped (exit code %s)", proc.pid, proc.returncode)
                proc.close()
            self._proc = None
            self._prestarted = False
        if self._dir is not None:
            if self._crashed:
                log.info("kept the crashed worker's folder %s (its log)", self._dir)
            else:
                shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
            self._crashed = False

    def let_go(self) -> None:
        """:meth:`stop` without waiting for a certain exit: a worker that answered ``stop(wait=False)`` is
        ending (the kernel frees its memory: 0.2 s for the probe), so on POSIX its folder goes now and a
        helper thread reaps it. Anything else is a stop()."""
        with self._lock:
            proc, folder = self._proc, self._dir
            if os.name != "posix" or proc is None or not self._exiting or self._crashed or folder is None:
                return self.stop()
            self._proc, self._dir, self._prestarted = None, None, False
        proc.reap_in_background(self.policy.shutdown_grace)
        shutil.rmtree(folder, ignore_errors=True)  # its log stays open in the ending worker: fine on POSIX

    def restart(self, reason: str = "requested") -> WorkerStatus:
        with self._lock:
            self._kill(f"restart: {reason}")
            self._pending_restart = reason
            return self._ensure_running()

    def prestart(self, model_appears: float = 300.0) -> None:
        """Launch the worker before its model file exists and return: it imports the runtime (a GPU
        build also initializes its device) while the caller writes the model, which must appear
        whole (renamed into place) within ``model_appears`` s. :meth:`start` then waits for it."""
        with self._lock:
            if self._proc is None:
                self._spawn(await_model=model_appears)
                self._prestarted = True

    # -- launching ------------------------------------------------------------------------------
    def _spawn(self, await_model: float = 0.0) -> None:
        if self._dir is None or not self._dir.is_dir():
            clean_stale()  # folders left by a killed process, and old crash logs
            self._dir = make()
        if self._proc is not None:
            self._proc.close()
        self.launches += 1
        self._stopping = self._exiting = False
        self._proc, self._token = WorkerProcess.for_runtime(self.runtime, self.options, self.model, self.extra_env,
                                                            self._dir, self.launches, await_model)
        self._log_path = self._proc.log_path
        self._proc.spawn()

    def _log_hint(self) -> str:
        return f"see the worker log {self._log_path}"

    def _keep_log(self) -> str:
        """Keep this supervisor's folder when it stops (a message names a log in it); the log's path."""
        if self._dir is not None and not self._crashed:
            self._crashed = True
            mark_crashed(self._dir)
        return str(self._log_path)

    def _launch_and_wait(self) -> WorkerStatus:
        """Launch the worker and wait until it is ready, as one progress task (the loading)."""
        task = f"loading {self.model_label}" if self.model else "starting the worker"
        self.progress(ProgressEvent("start", self.stage, task=task, message="starting the worker"))
        try:
            if not (self._prestarted and self.alive()):  # else prestart() launched it: its readiness is left
                self._spawn()
            self._prestarted = False
            assert self._proc is not None
            self.client = WorkerClient(self._proc.wait_listening(self.policy.startup_timeout), self._token)
            st = self._wait_ready(task)
        except BaseException as exc:
            self.progress(ProgressEvent("end", self.stage, task=task, ok=False,
                                        message=str(getattr(exc, "message", "") or exc or type(exc).__name__)))
            raise
        device = st.device.name if st.device is not None else self.runtime.backend
        took = f"{st.load_seconds:.1f} s on {device}" if st.load_seconds is not None else f"on {device}"
        self.progress(ProgressEvent("end", self.stage, task=task, ok=True, message=took))
        return st

    def _wait_ready(self, task: str = "") -> WorkerStatus:
        deadline = time.monotonic() + self.policy.load_timeout
        proc = self._proc
        assert proc is not None
        version = -1
        shown: Tuple[int, Optional[int], str] = (0, None, "")
        shown_at = time.monotonic()
        while True:
            rc = proc.poll()
            if rc is not None:
                log.warning("worker %d exited while starting (exit code %d)", proc.pid, rc)
                if self.model:
                    raise proc.load_failure(self.model, rc, self._keep_log())
                raise proc.start_failure(f"the worker exited while starting (exit code {rc})")
            st = self._status(self.policy.ping_timeout, wait=self.policy.poll_interval, since=version)
            if st is None:
                time.sleep(0.05)
            else:
                version = st.version
                if task and st.phase in ("starting", "loading"):
                    now_shown = load_note(st.phase, st.step, st.steps)
                    now = time.monotonic()
                    if now_shown != shown and now - shown_at >= 0.25 or now - shown_at >= 1.0:
                        shown, shown_at = now_shown, now  # a sign of life every second, its progress when known
                        self.progress(ProgressEvent("advance", self.stage, task=task, done=now_shown[0],
                                                    total=now_shown[1], message=now_shown[2],
                                                    extra={"unit": "tensor"} if now_shown[1] else {}))
                if st.phase == "ready":
                    log.info("worker %d ready (%s)", proc.pid, st.runtime_version or self.runtime.backend)
                    return st
                if st.phase == "error":
                    self._kill(f"it could not start: {st.error}")
                    if st.error_kind == "ModelLoadError":
                        raise ModelLoadError(st.error, hint="check that the file is a complete Stable Diffusion "
                                             "model (.safetensors, .gguf, .ckpt or a diffusers folder)")
                    raise WorkerStartError(f"the worker could not start the runtime: {st.error}",
                                           hint="the runtime is broken or does not match this machine; "
                                           "reinstall it", action=Action.REINSTALL, log_tail=self.log_tail())
            if time.monotonic() > deadline:
                self._kill("it was not ready in time")
                raise WorkerStartError(f"the worker was not ready within {self.policy.load_timeout:.0f} s",
                                       hint=self._log_hint(), action=Action.RETRY, log_tail=self.log_tail())

    def log_tail(self, lines: int = 20) -> List[str]:
        """The last lines of the current worker's log (or of the last one, once stopped)."""
        tail = self._proc.log_tail(lines) if self._proc is not None else []
        return tail or self._saved_tail[-lines:]

    def _kill(self, reason: str) -> None:
        if self._proc is not None:
            self._proc.kill(reason)

    def _ensure_running(self) -> WorkerStatus:
        """Start the worker if it is not running, after the backoff its failures earned."""
        if self._prestarted and self.alive():
            return self._launch_and_wait()
        if self.alive():
            st = self._status(self.policy.ping_timeout)
            if st is None or st.phase in ("ready", "generating"):
                return st or WorkerStatus(phase="ready", pid=self.pid or 0)
        now = time.monotonic()
        if self._proc is not None and self._pending_restart is None:  # it died while idle: a crash too
            rc = self._proc.poll()
            if rc not in (None, 0, EXIT_CANCELLED):
                self._keep_log()
                self._budget.record(now)
                self._pending_restart = f"the worker died while idle (exit code {rc}{signal_name(rc)})"
        delay = self._budget.delay(now, self._pending_restart or "", self._log_hint())
        if self._proc is not None or self._pending_restart:
            reason = self._pending_restart or "worker exited"
            self.restarts.append(RestartRecord(reason=reason, delay=delay, at=time.time()))
            log.warning("restarting the worker (%s) after %.1f s", reason, delay)
            self.progress(ProgressEvent("message", self.stage, message=f"restarting the worker "
                                        f"({self._pending_restart or 'it exited'}) after {delay:.1f} s"))
            if delay:
                time.sleep(delay)
        self._pending_restart = None
        self._kill("replaced by a new launch")
        return self._launch_and_wait()

    # -- requests -------------------------------------------------------------------------------
    def _status(self, timeout: float, wait: float = 0.0, since: Optional[int] = None) -> Optional[WorkerStatus]:
        st = self.client.status(timeout, wait=wait, since=since)
        if st is not None:
            self.last_status = st
        return st

    def ping(self, timeout: Optional[float] = None) -> bool:
        return self.client.ping(timeout or self.policy.ping_timeout)

    def status(self, timeout: Optional[float] = None) -> WorkerStatus:
        st = self._status(timeout or self.policy.ping_timeout)
        if st is None:
            raise WorkerCrashedError("the worker did not answer a status request", hint=self._log_hint())
        return st

    def cancel(self) -> bool:
        """Cancel the running job: its :meth:`generate` raises :class:`CancelledError` and the next
        call gets a fresh worker (a running step cannot be interrupted inside the worker).
        Returns True if the worker was generating when asked."""
        self._cancel.set()
        return self.client.cancel(self.policy.ping_timeout)

    # -- generation -----------------------------------------------------------------------------
    def generate(self, request: GenerateRequest, attempts: int = 1, label: str = "") -> GenerateResult:
        """Run one job. A worker that dies or stalls is killed; with ``attempts`` > 1 the job is
        run again on a restarted worker (restarts are counted in the result). ``label`` names the
        job's progress task (default: its size and steps)."""
        request.validate()
        if not self.model:
            raise GenerationError("this supervisor has no model loaded", hint="pass model= to Supervisor")
        restarts_before = len(self.restarts)
        last = crash_log = ""
        for _attempt in range(max(1, attempts)):
            with self._lock:
                self._ensure_running()
            self._cancel.clear()
            try:
                result = self._run_job(request, label)
                result.restarts = len(self.restarts) - restarts_before
                self._budget.clear()  # a success resets the backoff
                return result
            except _WorkerLost as lost:
                log.warning("worker lost during a job: %s", lost)
                last = str(lost)
                crash_log = self._keep_log()
                self._budget.record(time.monotonic())
                self._pending_restart = last
        tail = " | ".join(self.log_tail(3))
        raise WorkerCrashedError(f"generation failed: {last}" + (f" (tried {attempts} times)" if attempts > 1 else ""),
                                 hint=f"the worker's log is kept at {crash_log}"
                                 + (f" (its last lines: {tail})" if tail else "")
                                 + "; the runtime may not work on this machine, and a verification of it gives the details",
                                 action=Action.VERIFY)

    def _run_job(self, request: GenerateRequest, label: str = "") -> GenerateResult:
        proc = self._proc
        assert proc is not None
        before = self._status(self.policy.ping_timeout)  # its ticks: the first callback of the job ends the prompt's encoding
        base_ticks = before.ticks if before is not None else None
        try:
            job = self.client.submit(request, timeout=max(5.0, self.policy.ping_timeout))
        except TRANSPORT_ERRORS as exc:
            self._kill("it did not accept a job")
            raise _WorkerLost(f"the worker did not accept the job ({exc})") from None
        self.last_status = None  # from now on, the statuses of this job
        cancel_sent = False
        total = request.steps * request.batch_count
        task = label or f"generating {request.width}x{request.height}, {request.steps} steps" + (
            f" x{request.batch_count}" if request.batch_count > 1 else "")
        self.progress(ProgressEvent("start", self.stage, task=task, total=total, extra={"unit": "step"}))
        judge = LivenessJudge(self.policy.stall_timeout, self.policy.cpu_progress)
        started = time.monotonic()
        judge.reset(started, tree_cpu_seconds(proc.pid))
        done, version = 0, -1
        shown_at, note = started, ""
        try:
            while True:
                rc = proc.poll()
                if rc is not None:
                    if self._cancel.is_set() or rc == EXIT_CANCELLED:
                        self._pending_restart = "cancelled"
                        log.info("worker %d ended for a cancel (exit code %d)", proc.pid, rc)
                        raise CancelledError("generation cancelled")
                    raise _WorkerLost(f"the worker died during generation (exit code {rc}{signal_name(rc)})")
                if self._cancel.is_set() and not cancel_sent:  # a cancel that raced with the job's start
                    cancel_sent = True
                    self.client.cancel(self.policy.ping_timeout)
                # One long poll per step (or per poll_interval): the status answers at the next change.
                st = self._status(self.policy.ping_timeout, wait=self.policy.poll_interval, since=version)
                result_timeout = max(2.0, self.policy.ping_timeout)
                if st is not None:
                    version = st.version
                    outcome = (self.client.result(job, 0.0, result_timeout)
                               if st.job != job or st.phase != "generating" else None)
                else:  # no answer in time (busy, or hung): wait on the result itself, judge below
                    outcome = self.client.result(job, self.policy.poll_interval, result_timeout)
                if outcome is not None:
                    if "result" in outcome:
                        result = from_dict(GenerateResult, outcome["result"])
                        self.progress(ProgressEvent("end", self.stage, task=task, ok=True, done=total, total=total,
                                                    message=f"{result.seconds:.1f} s", extra={"unit": "step"}))
                        return result
                    raise GenerationError(outcome.get("error", "generation failed"), hint=outcome.get("hint") or None)
                now = time.monotonic()
                verdict = judge.observe(now, tree_cpu_seconds(proc.pid), st.ticks if st else None)
                if st is not None and st.job == job:
                    now_done = min(total, st.images_done * request.steps + st.step)
                    now_note = job_note(now_done, total, request.steps, st.ticks, base_ticks)
                    if now_done != done or now_note != note or now - shown_at >= 1.0:
                        done, note, shown_at = now_done, now_note, now
                        self.progress(ProgressEvent("advance", self.stage, task=task, done=done, total=total,
                                                    message=note, extra={"unit": "step"}))
                elif now - shown_at >= 1.0:  # no answer: still a sign of life, the liveness judge decides
                    shown_at = now
                    self.progress(ProgressEvent("advance", self.stage, task=task, done=done, total=total,
                                                message=note, extra={"unit": "step"}))
                if verdict == "stalled":
                    beat = f"; its heartbeat is {max(0.0, st.now - st.heartbeat):.1f} s old" if st is not None else ""
                    self._kill("it stopped making progress")
                    raise _WorkerLost(f"the worker stopped making progress for {judge.idle_for(now):.0f} s "
                                      f"(no step, no CPU time{beat if st else '; it does not answer'})")
                if self.policy.job_timeout is not None and now - started > self.policy.job_timeout:
                    self._kill("the job ran over its time limit")
                    raise _WorkerLost(f"the job ran over its {self.policy.job_timeout:.0f} s limit")
        except BaseException:
            self.progress(ProgressEvent("end", self.stage, task=task, ok=False, done=done, total=total))
            raise
