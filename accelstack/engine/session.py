"""A warm engine: one worker that keeps its model loaded between images (issue 46).

:func:`~accelstack.engine.generation.generate` starts a worker, loads the model, makes the images
and stops it; an app that makes many images of one model pays the load for each. A
:class:`WarmSession` keeps its worker after a job: the next job whose *load* is the same (the model
and component files, unchanged on disk, and the load-time options the memory planner resolved:
weight type, offload, flash attention, embeddings) runs on it at once; per-image settings (prompt,
seed, size, steps, sampler, CFG, LoRA tags, which stable-diffusion.cpp applies per image) never
ask for a reload. Anything else replaces the worker, so a model changed on disk since it was
loaded (size, mtime or identity) is loaded again, never used stale.

A worker that died is replaced on the next job (the supervisor restarts only a process that has
exited: a busy worker that does not answer a ping is never killed for it). The rule for a job that
does not succeed (cancelled, failed, its worker crashed): its worker is stopped (a running step cannot
be interrupted inside it, and a cancelled image may still be drawing), and the next job loads again. :meth:`close`
stops the worker and waits for its exit; a worker also ends when its parent does.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Optional, Tuple

from ..events import ProgressCallback, null_progress
from .generation import GenerateReport, Prepared, prepare, run_prepared
from .memory.device import MachineMemory
from .request.check import CheckedGeneration
from .runtime import Runtime
from .supervision.supervisor import Supervisor, SupervisorPolicy

__all__ = ["WarmSession", "load_key"]

# A file as its identity on disk: a replacement (rename over it) changes the inode, an edit the size or mtime.
FileId = Tuple[str, int, int, int, int]


def _file_id(path: str) -> FileId:
    try:
        st = os.stat(path)
    except OSError:
        return (path, -1, -1, -1, -1)
    return (path, st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def load_key(prep: Prepared, job: CheckedGeneration) -> Tuple[Any, ...]:
    """What a worker loaded: the model and component files (with their identity on disk), the embeddings
    (by their source folder's files: the staged copies are new each job) and every load-time option."""
    options = prep.options
    files = [prep.checked.model.path, *sorted(prep.checked.paths.values())]
    emb_dir = job.request.embeddings_dir
    embeddings: Tuple[FileId, ...] = ()
    if prep.extra.embedding_paths and emb_dir:
        embeddings = tuple(_file_id(os.path.join(emb_dir, os.path.basename(p))) for p in sorted(prep.extra.embedding_paths))
    fields = {k: v for k, v in vars(options).items() if k != "embeddings"}
    return (tuple(_file_id(os.path.abspath(f)) for f in files), embeddings, repr(sorted(fields.items())))


class WarmSession:
    """One runtime's worker, kept loaded between jobs; thread-safe (jobs run one at a time).

    ``worker``: one :func:`~accelstack.engine.supervision.supervisor.early_worker` started for
    ``runtime`` (it takes the first job's load). Use as a context manager, or call :meth:`close`."""

    def __init__(self, runtime: Runtime, *, policy: Optional[SupervisorPolicy] = None,
                 machine: Optional[MachineMemory] = None, worker: Optional[Supervisor] = None) -> None:
        if worker is not None and worker.runtime != runtime:
            raise ValueError("the early worker was started for another runtime")
        self.runtime = runtime
        self.policy = policy
        self.machine = machine or MachineMemory()
        self.loads = 0  # how many times a model was loaded (a replaced or restarted worker counts)
        self.jobs = 0
        self.last_used = time.monotonic()
        self._sup: Optional[Supervisor] = None
        self._early = worker
        self._key: Optional[Tuple[Any, ...]] = None
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> WarmSession:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def loaded(self) -> bool:
        """Whether a worker with a model is running now."""
        return self._sup is not None and self._sup.alive()

    @property
    def pid(self) -> Optional[int]:
        return self._sup.pid if self._sup is not None else None

    def generate(self, job: CheckedGeneration, *, progress: ProgressCallback = null_progress,
                 attempts: int = 2) -> GenerateReport:
        """Run ``job`` (checked once by :func:`~accelstack.engine.request.check.check_generation` for this
        runtime's stack) on the loaded worker when its load is the same, else on a new one; the report's
        ``reused_worker`` says which."""
        if job.traits != self.runtime.traits:
            raise ValueError(f"the request was checked for the {job.traits.library} stack, not {self.runtime.traits.library}")
        with self._lock:
            if self._closed:
                raise ValueError("this session is closed")
            start = time.perf_counter()
            prep = prepare(self.runtime, job, self.machine)
            try:
                key = load_key(prep, job)
                reused = self._sup is not None and key == self._key and self._sup.alive()
                sup = self._sup if reused else self._replace(prep, key)
                assert sup is not None
                sup.progress = progress
                launches = sup.launches
                try:
                    report = run_prepared(self.runtime, job, prep, sup, attempts=attempts, keep=True, start=start)
                except BaseException:
                    # crashed, cancelled (the worker may still be drawing the cancelled image), failed to load, or
                    # refused: the worker goes, and the next job loads afresh on a new one
                    self._drop()
                    raise
                finally:
                    self.loads += max(sup.launches - launches, 0 if reused else 1)  # an early worker launched already
                    self.jobs += 1
                    self.last_used = time.monotonic()
                report.reused_worker = reused and sup.launches == launches
                return report
            finally:
                prep.extra.cleanup()

    def _replace(self, prep: Prepared, key: Tuple[Any, ...]) -> Supervisor:
        """The worker for a new load: the early one (first job), else a new one after the old is stopped."""
        self._drop()
        early, self._early = self._early, None
        if early is not None:
            early.configure(prep.checked.model.path, prep.options, model_label=prep.label)
            sup = early
        else:
            sup = Supervisor(self.runtime, model=prep.checked.model.path, options=prep.options, policy=self.policy,
                             model_label=prep.label)
        self._sup, self._key = sup, key
        return sup

    def _drop(self) -> None:
        sup, self._sup, self._key = self._sup, None, None
        if sup is not None:
            sup.stop()  # waits for its exit: its memory is free when this returns

    def release(self) -> bool:
        """Stop the loaded worker (its memory freed), keeping the session open; whether one was loaded."""
        with self._lock:
            had = self._sup is not None
            self._drop()
            return had

    def cancel(self) -> bool:
        """Cancel the running job (its worker ends; the next job loads again)."""
        sup = self._sup
        return sup.cancel() if sup is not None else False

    def close(self) -> None:
        """Stop the worker (and an unused early one) and wait for its exit; idempotent."""
        with self._lock:
            self._closed = True
            self._drop()
            early, self._early = self._early, None
            if early is not None:
                early.stop()
