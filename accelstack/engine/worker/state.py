"""The worker's state: phase, job progress, heartbeat and results, shared by its threads.

The HTTP handlers (:mod:`accelstack.engine.worker.server`) read it, the job thread and the
backend's progress callback write it, all under one condition variable whose ``version`` lets
status readers long-poll for the next change.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Dict, List, Optional

from ...serde import to_dict
from ..errors import GenerationError
from .backend import WorkerBackend
from .protocol import DeviceInfo, GenerateRequest, GenerateResult, WorkerStatus

try:
    import resource
except ImportError:  # Windows
    resource = None  # type: ignore[assignment]

__all__ = ["WorkerState", "LOAD_PROGRESS_INTERVAL"]

LOAD_PROGRESS_INTERVAL = 0.2  # seconds between two status changes for the loading's progress


def _rss_bytes() -> Optional[int]:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    if resource is None:
        return None
    try:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024
    except Exception:
        return None


class WorkerState:
    """Everything the HTTP handlers read and the job thread writes (under ``lock``)."""

    def __init__(self, backend: WorkerBackend, token: str) -> None:
        self.backend = backend
        self.token = token
        self.lock = threading.Condition()  # guards the state; notified when a phase or a job ends
        self.phase = "starting"
        self.version = 0  # bumped on every change a status reader may wait for
        self.error = ""
        self.error_kind = ""
        self.job = ""
        self.step = 0
        self.steps = 0
        self.images_done = 0
        self.ticks = 0
        self.heartbeat = time.time()
        self.load_seconds: Optional[float] = None
        self.device: Optional[DeviceInfo] = None
        self.runtime_version = ""
        self.system_info = ""
        self.results: Dict[str, Dict[str, Any]] = {}
        self.sampling: List[float] = []  # [start, end] of the sampling loop of the current image
        self.sampling_total = 0.0
        self.stop = threading.Event()
        self._load_changed = 0.0  # perf_counter of the last loading progress a reader was woken for

    def changed(self) -> None:
        """Call with the lock held after a change a status reader may wait for."""
        self.version += 1
        self.lock.notify_all()

    def fail(self, message: str, kind: str) -> None:
        with self.lock:
            self.phase, self.error, self.error_kind = "error", message, kind
            self.changed()

    def on_progress(self, step: int, steps: int) -> None:
        """Every callback is activity (``ticks``); those with the job's step count are sampling
        steps (the same callback also reports model loading and VAE tiles). While loading,
        ``step``/``steps`` are the loading's own progress (tensors), for the supervisor to show."""
        now = time.perf_counter()
        with self.lock:
            self.ticks += 1
            if self.phase == "loading":
                self.step, self.steps = step, steps
                if now - self._load_changed >= LOAD_PROGRESS_INTERVAL or step >= steps:
                    self._load_changed = now  # at most a few wake-ups a second for thousands of tensors
                    self.changed()
                return
            if self.phase != "generating" or steps != self.steps:
                return
            if step == 0:  # the sampling of an image begins (ticks moved: the prompt is encoded)
                self.sampling = [now, now]
                self.step = 0
                self.changed()
            elif self.sampling:
                self.sampling[1] = now
                self.step = step
                if step == steps:
                    self.sampling_total += self.sampling[1] - self.sampling[0]
                    self.sampling = []
                    self.images_done += 1
                    self.step = 0
                self.changed()

    def status(self) -> WorkerStatus:
        with self.lock:
            return WorkerStatus(
                phase=self.phase, pid=os.getpid(), version=self.version, job=self.job, step=self.step,
                steps=self.steps, images_done=self.images_done, ticks=self.ticks,
                heartbeat=self.heartbeat, now=time.time(), load_seconds=self.load_seconds, device=self.device,
                rss_bytes=_rss_bytes(), error=self.error, error_kind=self.error_kind,
                runtime_version=self.runtime_version, system_info=self.system_info)

    def run_job(self, job: str, req: GenerateRequest) -> None:
        start = time.perf_counter()
        try:
            images, seed, sampler, scheduler = self.backend.generate(req)
            result = GenerateResult(job=job, images=images, seconds=round(time.perf_counter() - start, 4),
                                    sampling_seconds=round(self.sampling_total, 4), steps=req.steps * req.batch_count,
                                    seed=seed, sampler=sampler, scheduler=scheduler, device=self.device,
                                    load_seconds=self.load_seconds, library_seconds=self.backend.library_seconds,
                                    extra={**({"runtime": self.runtime_version} if self.runtime_version else {}),
                                           **getattr(self.backend, "notes", {})})  # e.g. ggml's decode_retry
            outcome: Dict[str, Any] = {"result": to_dict(result)}
        except GenerationError as exc:
            outcome = {"error": exc.message, "kind": "GenerationError", "hint": exc.hint or ""}
        except Exception as exc:  # never let the job thread die silently
            outcome = {"error": f"{type(exc).__name__}: {exc}", "kind": "GenerationError", "hint": ""}
        with self.lock:
            self.results = {job: outcome}
            self.phase = "ready"
            self.sampling = []
            self.changed()

