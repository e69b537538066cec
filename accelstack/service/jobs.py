"""Jobs: the core's long functions (install, repair, upgrade, verify, generate), run one at a time.

A job is one call of a core function in the service's runner thread. Its progress events are
the library's own ``ProgressEvent``s, kept (as ``serde.to_dict``) so that any number of clients
can follow them from the start; its result is the core's return value, its error the core's
``AccelstackError``. The service adds no logic of its own: it checks the options' shape, picks
where a job's images go (a directory of its own, never a path from the request), and queues.

Jobs run in submission order, one at a time. A job that changes the runtime home (install,
repair, upgrade) is refused (``JobConflict``) while another such job is queued or running: a
second one would only repeat or fight the first.

Cancelling sets a flag that the job's progress callback turns into :class:`JobCancelled` at
the job's next progress event (the core has no cancel of its own); the core undoes what it
started on any exception, so a cancelled install leaves the home as it was.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from .. import core
from ..core.installing import install as install_runtime
from ..errors import AccelstackError
from ..events import ProgressCallback, ProgressEvent, iso_utc
from ..serde import to_dict
from ..settings import Settings
from .errors import (
    BadRequest,
    Describe,
    InternalError,
    JobCancelled,
    JobConflict,
    JobFinished,
    NotFound,
    describe_error,
    error_document,
)
from .job_options import MAX_SHORT, MAX_TEXT, Options

log = logging.getLogger(__name__)

__all__ = ["KINDS", "HOME_CHANGING", "FINAL_STATES", "MAX_FINISHED_JOBS", "MAX_EVENTS", "now_iso", "event_data", "Job",
           "JobListener", "Jobs"]

KINDS = ("install", "repair", "upgrade", "verify", "generate")
HOME_CHANGING = frozenset({"install", "repair", "upgrade"})
FINAL_STATES = ("succeeded", "failed", "cancelled")
MAX_FINISHED_JOBS = 100  # finished jobs kept in memory (their images stay on disk)
MAX_EVENTS = 20_000  # per job; past it only non-"advance" events are kept (counted in events_dropped)

Call = Callable[[ProgressCallback], Any]
JobListener = Callable[["Job"], None]  # told when a job starts and when it ends (the serve log)


def now_iso() -> str:
    """Now, as the CLI writes times: ISO 8601 UTC with milliseconds and a ``Z``."""
    return iso_utc(time.time())


def event_data(event: ProgressEvent) -> Dict[str, Any]:
    """A progress event as the API sends it: its fields, ``ts`` as the CLI writes it (ISO 8601 UTC)."""
    data = to_dict(event)
    data["ts"] = iso_utc(event.ts)
    return data


@dataclass
class Job:
    """One job and everything a client may ask about it."""

    id: str
    kind: str
    options: Dict[str, Any]
    outdir: Path
    created_at: str = field(default_factory=now_iso)
    state: str = "queued"
    started_at: str = ""
    finished_at: str = ""
    result: Any = None  # to_dict of the core's return value
    error: Optional[Dict[str, Any]] = None  # the error document (errors.describe_error)
    images: List[Path] = field(default_factory=list)
    events: List[Dict[str, Any]] = field(default_factory=list)
    events_dropped: int = 0
    call: Optional[Call] = None
    cancel_requested: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _waiters: Set[Tuple[asyncio.AbstractEventLoop, asyncio.Event]] = field(default_factory=set)

    @property
    def done(self) -> bool:
        return self.state in FINAL_STATES

    def summary(self, *, full: bool = True) -> Dict[str, Any]:
        """The job as JSON: state, times, counts, and (``full``) its result or error."""
        with self._lock:
            out: Dict[str, Any] = {
                "id": self.id, "kind": self.kind, "options": self.options, "state": self.state,
                "created_at": self.created_at, "started_at": self.started_at, "finished_at": self.finished_at,
                "cancel_requested": self.cancel_requested.is_set(), "events": len(self.events),
                "events_dropped": self.events_dropped, "images": len(self.images),
                "last_event": self.events[-1] if self.events else None,
                "links": {"self": f"/api/v1/jobs/{self.id}", "events": f"/api/v1/jobs/{self.id}/events",
                          **({"image": f"/api/v1/jobs/{self.id}/image"} if self.images else {})},
            }
            if full:
                out["result"] = self.result
                out["error"] = self.error
            return out

    # -- events: written by the runner thread, read by any number of async streams -------------
    def progress(self, event: ProgressEvent) -> None:
        """The job's progress callback. After a cancel, any event but an ``end`` (the ones
        emitted while the library cleans up) raises :class:`JobCancelled`."""
        if self.cancel_requested.is_set() and event.kind != "end":
            raise JobCancelled()
        data = event_data(event)
        with self._lock:
            if len(self.events) < MAX_EVENTS or event.kind != "advance":
                self.events.append(data)
            else:
                self.events_dropped += 1
        self._notify()

    def snapshot(self, start: int) -> Tuple[List[Dict[str, Any]], bool]:
        """Events from index ``start`` on, and whether the job had ended when they were taken."""
        with self._lock:
            return self.events[start:], self.done

    async def changed(self, seen: int, timeout: float) -> bool:
        """Wait until there are more than ``seen`` events or the job ends; False on timeout."""
        loop = asyncio.get_running_loop()
        ev = asyncio.Event()
        key = (loop, ev)
        with self._lock:
            if len(self.events) > seen or self.done:
                return True
            self._waiters.add(key)
        try:
            await asyncio.wait_for(ev.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            with self._lock:
                self._waiters.discard(key)

    def _notify(self) -> None:
        with self._lock:
            waiters = list(self._waiters)
        for loop, ev in waiters:
            try:
                loop.call_soon_threadsafe(ev.set)
            except RuntimeError:  # the loop is closed: the server is gone
                pass

    def _finish(self, state: str, result: Any = None, error: Optional[Dict[str, Any]] = None,
                images: Optional[List[Path]] = None) -> None:
        with self._lock:
            self.state, self.result, self.error = state, result, error
            self.images = images or []
            self.finished_at = now_iso()
            self.call = None
        self._notify()


class Jobs:
    """The job table and the runner thread that works through the queue."""

    def __init__(self, settings: Settings, report: Callable[[], Any], *, models_dir: Optional[Path] = None,
                 describe: Describe = error_document, listener: Optional[JobListener] = None) -> None:
        self.settings = settings
        self.report = report  # the service's (cached) HardwareReport
        self.models_dir = models_dir
        self.describe = describe
        self.listener = listener
        self.root = settings.state_dir / "service" / "jobs"
        self._jobs: Dict[str, Job] = {}
        self._lock = threading.Lock()
        self._queue: queue.Queue[Optional[Job]] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="accelstack-jobs", daemon=True)
        self._stopping = False

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def cancel_all(self) -> None:
        """Cancel every queued and running job and take no more (shutdown)."""
        with self._lock:
            self._stopping = True
            jobs = list(self._jobs.values())
        for job in jobs:
            self._cancel(job)

    def stop(self, timeout: float) -> bool:
        """Cancel everything, wait up to ``timeout`` s for the running job to undo its work."""
        self.cancel_all()
        self._queue.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- the API's operations -------------------------------------------------------------------
    def submit(self, kind: Any, options: Any) -> Job:
        if kind not in KINDS:
            raise BadRequest(f"unknown job kind {kind!r}: choose one of {', '.join(KINDS)}", code="bad-request")
        if options is None:
            options = {}
        if not isinstance(options, dict):
            raise BadRequest("options must be a JSON object", code="bad-request")
        job = Job(id=secrets.token_hex(8), kind=kind, options=dict(options), outdir=Path())
        job.outdir = self.root / job.id
        job.call = self._prepare(job)  # a bad option is refused here, before anything is queued
        with self._lock:
            if self._stopping:
                raise JobConflict("the service is stopping and takes no new jobs", hint="start the service again")
            if kind in HOME_CHANGING:
                holder = next((j for j in self._jobs.values() if j.kind in HOME_CHANGING and not j.done), None)
                if holder is not None:
                    raise JobConflict(f"the {holder.kind} job {holder.id} is {holder.state}, and one job that changes "
                                      "the runtime home runs at a time", hint="wait for it to finish (follow its events), "
                                      "or cancel it, then start this one", job=holder.id)
            self._jobs[job.id] = job
            self._evict()
        self._queue.put(job)
        return job

    def get(self, job_id: str) -> Job:
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            raise NotFound(f"there is no job {job_id!r}", hint="list the jobs to see their ids", code="not-found")
        return job

    def all(self) -> List[Job]:
        with self._lock:
            return list(self._jobs.values())

    def cancel(self, job_id: str) -> Job:
        job = self.get(job_id)
        if job.done:
            raise JobFinished(f"job {job.id} has already ended ({job.state})", code="job-finished")
        self._cancel(job)
        return job

    def image(self, job_id: str, index: int) -> Path:
        """The ``index``-th image a job recorded; only files inside the job's own directory."""
        job = self.get(job_id)
        if not 0 <= index < len(job.images):
            raise NotFound(f"job {job.id} has no image {index}" if job.images else f"job {job.id} has no image",
                           hint="verify and generate jobs make images once they succeed", code="not-found")
        return job.images[index]

    # -- internals ------------------------------------------------------------------------------
    def _cancel(self, job: Job) -> None:
        job.cancel_requested.set()
        with job._lock:
            queued = job.state == "queued"
        if queued:
            exc = JobCancelled("the job was cancelled before it started")
            job._finish("cancelled", error=describe_error(self.describe, job.kind, exc))
            self._tell(job)

    def _evict(self) -> None:
        finished = [j for j in self._jobs.values() if j.done]
        for j in finished[: max(0, len(finished) - MAX_FINISHED_JOBS)]:
            del self._jobs[j.id]

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            with job._lock:
                if job.state != "queued" or job.cancel_requested.is_set():  # cancelled while it waited
                    continue
                job.state, job.started_at = "running", now_iso()
                call = job.call
            job._notify()
            assert call is not None
            log.info("job %s (%s) started", job.id, job.kind)
            self._tell(job)
            try:
                job.outdir.mkdir(parents=True, exist_ok=True, mode=0o700)
                result = call(job.progress)
            except AccelstackError as exc:
                state = "cancelled" if isinstance(exc, JobCancelled) or job.cancel_requested.is_set() else "failed"
                log.info("job %s %s: %s", job.id, state, exc.message)
                job._finish(state, error=describe_error(self.describe, job.kind, exc))
            except Exception as exc:  # a bug: report it as one, keep serving
                log.exception("job %s failed unexpectedly", job.id)
                bug = InternalError(exc, "the service log has the details")
                job._finish("failed", error=describe_error(self.describe, job.kind, bug))
            else:
                log.info("job %s succeeded", job.id)
                job._finish("succeeded", result=to_dict(result), images=_images_of(result, job.outdir))
            self._tell(job)

    def _tell(self, job: Job) -> None:
        """The listener's news of a job (started, ended); a listener that fails is logged, never fatal."""
        if self.listener is None:
            return
        try:
            self.listener(job)
        except Exception:
            log.exception("the job listener failed")

    def _prepare(self, job: Job) -> Call:
        """Check the options for ``job.kind`` and bind the core call (nothing runs yet)."""
        o = Options(job.kind, job.options)
        s = self.settings
        out = job.outdir
        if job.kind == "install":
            stack = o.stack()
            backend, force, dry_run, reqs = o.backend(), o.flag("force"), o.flag("dry_run"), o.strings("requirements")
            o.done()
            verifier = core.default_verifier(s, out / "verify.png")  # torch: its check in the target (no image)
            return lambda progress: install_runtime(None, stack=stack, requirements=reqs, backend=backend, report=self.report(),
                                                    settings=s, verifier=verifier, force=force, dry_run=dry_run,
                                                    on_progress=progress)
        if job.kind == "upgrade":
            stack, backend = o.stack(), o.backend()
            o.done()
            verifier = core.default_verifier(s, out / "verify.png")  # torch: its check in the target (no image)
            return lambda progress: core.upgrade(stack=stack, report=self.report(), settings=s, backend=backend,
                                                 verifier=verifier, on_progress=progress)
        if job.kind == "repair":
            o.done()
            return lambda progress: core.repair(settings=s, verifier=core.default_verifier(s, out / "verify.png"),
                                                on_progress=progress)
        if job.kind == "verify":
            stack = o.stack()
            o.done()
            return lambda progress: core.verify(stack=stack, settings=s, output=out / "verify.png", on_progress=progress)
        return self._prepare_generate(o, out)

    def _prepare_generate(self, o: Options, out: Path) -> Call:
        stack = o.stack()
        model = self._model(o.text("model", MAX_SHORT, required=True))
        prompt = o.text("prompt", MAX_TEXT, required=True)
        request: Dict[str, Any] = {}
        for f in dataclasses.fields(core.GenerateRequest):
            if f.name == "prompt" or f.name not in o.data:
                continue
            default = f.default
            if isinstance(default, bool) or not isinstance(default, (int, float, str)):
                continue
            request[f.name] = o.typed(f.name, type(default))
        o.done()
        s = self.settings
        return lambda progress: core.generate(model, prompt, out / "image.png", stack=stack, settings=s,
                                              on_progress=progress, **request)

    def _model(self, name: str) -> Path:
        """A model the service was started with: a name from the models directory's listing (never
        a path from the request)."""
        if self.models_dir is None:
            raise BadRequest("this service has no models directory, so it cannot generate",
                             hint="start the service with a models directory", code="no-models")
        try:
            names = {p.name: p for p in self.models_dir.iterdir() if not p.name.startswith(".")}
        except OSError as exc:
            raise BadRequest(f"the models directory cannot be read ({exc.strerror or exc})", code="no-models") from None
        if name not in names:
            raise BadRequest(f"there is no model {name!r} in the service's models directory",
                             hint=f"choose one of: {', '.join(sorted(names)) or '(none)'}", code="bad-request")
        return names[name]


def _images_of(result: Any, outdir: Path) -> List[Path]:
    """The images a job's result names that lie in the job's own directory (verify's probe
    image, generate's PNGs); anything else the result mentions is not served."""
    names: List[str] = []
    for holder in (result, getattr(result, "verification", None), getattr(getattr(result, "receipt", None), "verification", None)):
        if holder is None:
            continue
        if isinstance(getattr(holder, "image", None), str) and holder.image:
            names.append(holder.image)
        names += [p for p in getattr(holder, "images", None) or [] if isinstance(p, str)]
    root = outdir.resolve()
    out: List[Path] = []
    for n in names:
        p = Path(n).resolve()
        if p.parent == root and p.is_file() and p not in out:
            out.append(p)
    return out

