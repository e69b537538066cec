"""The supervisor: starts the worker, waits for it, watches it, restarts it, and stops it.

It builds on :class:`~accelstack.engine.supervision.launcher.WorkerLauncher` (one launch of the worker: its
process, folder, client, readiness and stop) with :mod:`~accelstack.engine.supervision.policy` (deadlines, the
liveness judge, restart backoff). A process
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
import threading
import time
from typing import Dict, List, Optional

from ...errors import Action
from ...events import ProgressCallback, ProgressEvent, null_progress
from ...serde import from_dict
from ..config import EngineOptions
from ..errors import CancelledError, GenerationError, WorkerCrashedError
from ..runtime import Runtime
from ..worker.protocol import EXIT_CANCELLED, GenerateRequest, GenerateResult, WorkerStatus
from .client import TRANSPORT_ERRORS
from .launcher import WorkerLauncher
from .policy import LivenessJudge, RestartBudget, RestartRecord, SupervisorPolicy, job_note
from .process import signal_name, tree_cpu_seconds

__all__ = ["Supervisor", "SupervisorPolicy", "early_worker"]

log = logging.getLogger(__name__)


class _WorkerLost(Exception):
    """Internal: the worker died or stalled during a job (the job may be retried); str() says why."""


class Supervisor(WorkerLauncher):
    """One worker for one runtime (and optionally one loaded model), restarted when it dies or stalls.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. Thread-safe for
    :meth:`cancel` from another thread while :meth:`generate` runs.
    """

    def __init__(self, runtime: Runtime, model: Optional[str] = None, options: Optional[EngineOptions] = None,
                 policy: Optional[SupervisorPolicy] = None, progress: ProgressCallback = null_progress,
                 extra_env: Optional[Dict[str, str]] = None, stage: str = "generate", model_label: str = "") -> None:
        super().__init__(runtime, model=model, options=options, policy=policy, progress=progress, extra_env=extra_env,
                         stage=stage, model_label=model_label)
        self.restarts: List[RestartRecord] = []
        self._budget = RestartBudget(self.policy)
        self._pending_restart: Optional[str] = None
        self._cancel = threading.Event()

    # -- restarts -------------------------------------------------------------------------------
    def restart(self, reason: str = "requested") -> WorkerStatus:
        with self._lock:
            self._kill(f"restart: {reason}")
            self._pending_restart = reason
            return self._ensure_running()

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
        job's progress task (default: its size and steps). The request was checked once by the
        engine (:func:`~accelstack.engine.request.check.check_generation`, or built by ``verify``); the
        worker validates what reaches it."""
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
            # a live worker slow to answer (starved of CPU under load, its pages swapped out) is waited for as
            # long as a stall is: a dead one refuses at once, and one late answer is no verdict (issue 46)
            job = self.client.submit(request, timeout=max(5.0, self.policy.ping_timeout, self.policy.stall_timeout))
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


def early_worker(runtime: Runtime, policy: Optional[SupervisorPolicy] = None, within: float = 60.0) -> Supervisor:
    """A worker for :func:`~accelstack.engine.generation.generate` (``worker=``) on ``runtime``, started
    before its model and options are known: it imports the runtime (~0.15 s on the CPU build; a GPU
    build also opens its device) while the caller imports, checks the request and plans the memory.
    ``generate`` sends it its order and stops it. An order later than ``within`` s ends it and an
    ordinary launch replaces it (slow checks lose the head start, nothing else). A caller that does
    not get that far stops it itself (a worker also ends when its parent does)."""
    sup = Supervisor(runtime, policy=policy)
    sup.prestart(model_appears=within, deferred=True)
    return sup
