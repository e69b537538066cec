"""The supervision policy: deadlines, when a worker counts as hung, and how restarts back off.

Liveness is judged on more than a ping. A worker deep in a heavy step may answer a ping late
(the field's usual approach kills it then, and the user loses a healthy generation), so a job is
"stalled" only when, for ``stall_timeout`` seconds, *none* of these moved:

* the worker's progress callbacks (``ticks``: sampling steps, VAE tiles, loading), read from
  ``/status`` when it answers;
* the worker's CPU time (user + system of the process tree), read from the OS, which needs no
  answer from the worker at all.

Dead and stalled workers are restarted with exponential backoff, at most ``max_restarts`` times
within ``restart_window`` seconds (:class:`RestartBudget`). Nothing here touches a process.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from ..errors import WorkerCrashedError

__all__ = ["SupervisorPolicy", "RestartRecord", "LivenessJudge", "RestartBudget", "load_note", "job_note"]


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


def load_note(phase: str, step: int, steps: int) -> Tuple[int, Optional[int], str]:
    """(done, total, what) of a worker that is starting: the model's loading by tensors when the
    runtime reports it, else what it is doing."""
    if steps:
        return step, steps, "loading the model"
    return 0, None, "importing the runtime" if phase == "starting" else "loading the model"


def job_note(done: int, total: int, steps: int, ticks: int, base_ticks: Optional[int]) -> str:
    """What a job is doing, said beside its bar so that a bar at 0 or at its end does not look stuck:
    before the first step the worker encodes the prompt (until its first progress callback), after
    the last it decodes the image."""
    if done >= total:
        return "decoding the image"
    if done == 0 and base_ticks is not None and ticks <= base_ticks:
        return "encoding the prompt"
    return f"sampling step {done % steps + 1} of {steps}"


class RestartBudget:
    """Recent failures (crashes, stalls) and the backoff they earn; a success clears them."""

    def __init__(self, policy: SupervisorPolicy) -> None:
        self.policy = policy
        self.failures: List[float] = []  # monotonic times

    def record(self, now: float) -> None:
        self.failures.append(now)

    def clear(self) -> None:
        self.failures.clear()

    def delay(self, now: float, last_reason: str, log_hint: str) -> float:
        """Seconds to wait before the next launch; :class:`WorkerCrashedError` when the budget
        is spent (more than ``max_restarts`` failures within ``restart_window``)."""
        p = self.policy
        self.failures = [t for t in self.failures if now - t <= p.restart_window]
        if not self.failures:
            return 0.0
        if len(self.failures) > p.max_restarts:
            raise WorkerCrashedError(
                f"the worker failed {len(self.failures)} times in {p.restart_window:.0f} s "
                f"(last: {last_reason or 'unknown'}); not restarting it again",
                hint=f"{log_hint}; the runtime may not work on this machine")
        return min(p.backoff_max, p.backoff_initial * 2 ** (len(self.failures) - 1))
