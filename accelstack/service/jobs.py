"""Jobs: the core's long functions (install, repair, upgrade, verify, generate), run one at a time.

A job is one call of a core function in the service's runner thread. Its progress events are
the library's own ``ProgressEvent``s, kept (as ``serde.to_dict``) so that any number of clients
can follow them from the start; its result is the core's return value, its error the core's
``AccelstackError``. The service adds no logic of its own: it checks the options' shape, picks
where a job's images go (a directory of its own, never a path from the request), and queues.

Jobs run in submission order, one at a time. A job that changes the runtime home (install,
repair, upgrade) is refused (``JobConflict``) while another such job is queued or running: a
second one would only repeat or fight the first. At most ``MAX_QUEUED`` jobs of a kind wait
(``QueueFull``, a 429, past it), and a finished job beyond the ``MAX_FINISHED_JOBS`` most recent
is forgotten as soon as another one ends, so the table stays bounded whatever clients send; its
folder (its images) goes with it, and what a stopped service left goes at the next start
(:mod:`accelstack.core.job_folders`). The job itself (state, events, images) is :mod:`.job_state`'s.

Cancelling sets a flag that the job's progress callback turns into :class:`JobCancelled` at
the job's next progress event (the core has no cancel of its own); the core undoes what it
started on any exception, so a cancelled install leaves the home as it was.
"""
from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from .. import core
from ..core import direct, job_folders
from ..core import machine as core_machine
from ..core.installing import install as install_runtime
from ..errors import AccelstackError
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
    QueueFull,
    describe_error,
    error_document,
)
from .job_options import MAX_SHORT, MAX_TEXT, Options
from .job_state import FINAL_STATES, MAX_EVENTS, Call, Job, JobListener, event_data, images_of, now_iso, read_image
from .models_dir import ModelsDir, NameRefused, What
from .warm import WarmModel

log = logging.getLogger(__name__)

__all__ = ["KINDS", "HOME_CHANGING", "FINAL_STATES", "MAX_FINISHED_JOBS", "MAX_QUEUED", "MAX_EVENTS", "now_iso",
           "event_data", "Job", "JobListener", "Jobs"]

KINDS = ("install", "repair", "upgrade", "verify", "generate")
# A generate job's options that name files: names in the models directory, never paths.
GENERATE_FILES = ("diffusion_model", "vae", "clip_l", "clip_g", "t5xxl", "llm", "taesd", "control_net", "init_image",
                  "control_image", "mask_image")
OPTIONAL_NUMBERS = ("guidance", "flow_shift")  # request fields that are None unless given (the family's value)
IMAGE_FIELDS = ("init_image", "control_image", "mask_image")  # of GENERATE_FILES: images, the rest weights files
WIRE_ONLY = ("init_pixels", "control_pixels", "mask_pixels", "ref_pixels")  # what the engine sends its worker: not a job's option
HOME_CHANGING = frozenset({"install", "repair", "upgrade"})
MAX_FINISHED_JOBS = 100  # finished jobs kept (a forgotten job's folder, its images, goes with it)
MAX_QUEUED = 16  # jobs of one kind waiting to run (home-changing kinds: one queued or running at all)


class Jobs:
    """The job table and the runner thread that works through the queue."""

    def __init__(self, settings: Settings, report: Callable[[], Any], *, models_dir: Optional[Path] = None,
                 describe: Describe = error_document, listener: Optional[JobListener] = None) -> None:
        self.settings = settings
        self.report = report  # the service's (cached) HardwareReport
        self.models_dir = models_dir
        self.describe = describe
        self.listener = listener
        self.root = job_folders.jobs_root(settings.state_dir)
        self._jobs: Dict[str, Job] = {}  # in submission order: the runner takes the first queued one
        self._lock = threading.RLock()  # re-entrant: a signal handler (cancel_all) may land while the loop holds it
        self._wake = threading.Condition(self._lock)  # a job was queued, or the service is stopping
        self._thread = threading.Thread(target=self._run, name="accelstack-jobs", daemon=True)
        self._stopping = False
        self.warm = WarmModel(settings)  # the generate jobs' loaded model, kept between them (issue 46)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Remove what stopped services left (their job folders), then take jobs."""
        removed, _ = job_folders.sweep(self.root)
        if removed:
            log.info("removed %d job folders a stopped service left", len(removed))
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
        with self._wake:
            self._wake.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.warm.release()  # the loaded model's worker stops with the service
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
            waiting = sum(1 for j in self._jobs.values() if j.kind == kind and j.state == "queued")
            if waiting >= MAX_QUEUED:
                raise QueueFull(f"{waiting} {kind} jobs are already waiting to run, the most the service queues",
                                hint="wait for one of them to end (follow its events), then start this one",
                                code="queue-full")
            self._jobs[job.id] = job
            self._evict()
            self._wake.notify_all()
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

    def image(self, job_id: str, index: int) -> bytes:
        """The ``index``-th image a job recorded, if it is still the file the job wrote."""
        job = self.get(job_id)
        if not 0 <= index < len(job.images):
            raise NotFound(f"job {job.id} has no image {index}" if job.images else f"job {job.id} has no image",
                           hint="verify and generate jobs make images once they succeed", code="not-found")
        return read_image(job.id, job.images[index])

    # -- internals ------------------------------------------------------------------------------
    def _cancel(self, job: Job) -> None:
        job.cancel_requested.set()
        with job._lock:
            queued = job.state == "queued"
        if queued:
            exc = JobCancelled("the job was cancelled before it started")
            job._finish("cancelled", error=describe_error(self.describe, job.kind, exc))
            self._ended(job)

    def _ended(self, job: Job) -> None:
        """A job ended: forget the oldest finished ones past the limit, tell the listener."""
        with self._lock:
            self._evict()
        self._tell(job)

    def _evict(self) -> None:
        """Forget the oldest finished jobs past the limit, and remove their folders (their images)."""
        finished = [j for j in self._jobs.values() if j.done]
        for j in finished[: max(0, len(finished) - MAX_FINISHED_JOBS)]:
            del self._jobs[j.id]
            try:
                job_folders.remove(j.outdir)
            except OSError as exc:
                log.warning("could not remove job %s's folder %s (%s)", j.id, j.outdir, exc.strerror or exc)

    def _next(self) -> Optional[Job]:
        """The first queued job, waiting for one; None once the service stops."""
        with self._wake:
            while True:
                job = next((j for j in self._jobs.values() if j.state == "queued" and not j.cancel_requested.is_set()), None)
                if job is not None or self._stopping:
                    return job
                if not self._wake.wait(self.warm.until_idle()):  # no job for a while: the loaded model goes
                    self.warm.release_if_idle()

    def _run(self) -> None:
        while True:
            job = self._next()
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
                job_folders.claim(job.outdir)  # marked as this service's: removed when the job is forgotten
                if job.kind != "generate":  # a verify needs the memory, an install must not run beside a loaded worker
                    self.warm.release()
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
                job._finish("succeeded", result=to_dict(result), images=images_of(result, job.outdir))
            self._ended(job)

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
            verifier = core.default_verifier(s, out / "verify.png", keep_probe=False)  # torch: its check in the target (no image)
            return lambda progress: install_runtime(None, stack=stack, requirements=reqs, backend=backend, report=self.report(),
                                                    settings=s, verifier=verifier, force=force, dry_run=dry_run,
                                                    on_progress=progress)
        if job.kind == "upgrade":
            stack, backend = o.stack(), o.backend()
            o.done()
            verifier = core.default_verifier(s, out / "verify.png", keep_probe=False)  # torch: its check in the target (no image)
            return lambda progress: core.upgrade(stack=stack, report=self.report(), settings=s, backend=backend,
                                                 verifier=verifier, on_progress=progress)
        if job.kind == "repair":
            o.done()
            return lambda progress: core.repair(settings=s, verifier=core.default_verifier(s, out / "verify.png", keep_probe=False),
                                                on_progress=progress)
        if job.kind == "verify":
            stack = o.stack()
            extra = self._verify_families(o, stack)  # the model families an app ships, as verify --family
            o.done()
            # verified once, as the CLI's verify: the 1 GB probe goes when the verify ends, not with the service
            return lambda progress: core.verify(stack=stack, settings=s, output=out / "verify.png", on_progress=progress,
                                                keep_probe=False, **extra)
        return self._prepare_generate(o, out)

    @staticmethod
    def _verify_families(o: Options, stack: str) -> Dict[str, Any]:
        """``families`` of a verify job, checked before the job is queued (none: the fast SD 1.x check)."""
        families = o.strings("families")
        if not families:
            return {}
        try:
            return {"families": direct.verify_families(stack, families)}
        except AccelstackError as exc:
            raise BadRequest(exc.message, hint=exc.hint, code="bad-request") from None

    def _prepare_generate(self, o: Options, out: Path) -> Call:
        stack = o.stack()
        request: Dict[str, Any] = {}
        # Component files and images (vae, clip_l, control_net, init_image...) are names in the models
        # directory too, like the model; a diffusion_model may stand in for the model.
        given_names: Dict[str, str] = {}
        for name in GENERATE_FILES:
            given = o.text(name, MAX_SHORT)
            if given:
                request[name] = str(self._model(given, "image" if name in IMAGE_FIELDS else "model"))
                given_names[name] = given
        refs = [str(self._model(name, "image")) for name in o.strings("ref_images")]  # edits: images of the models dir
        if refs:
            request["ref_images"] = refs
        named = o.text("model", MAX_SHORT, required="diffusion_model" not in request)
        model = self._model(named) if named else None
        shown = named or given_names["diffusion_model"]  # the result names the model as the client did
        prompt = o.text("prompt", MAX_TEXT, required=True)
        for name in ("lora_dir", "embeddings_dir"):  # folder names of the models directory, like the model
            given = o.text(name, MAX_SHORT)
            if given:
                request[name] = str(self._model(given, "folder"))
        for f in dataclasses.fields(core.GenerateRequest):
            if f.name in ("prompt", "lora_dir", "embeddings_dir", "ref_images", *GENERATE_FILES, *WIRE_ONLY) or f.name not in o.data:
                continue
            default = f.default
            if default is None and f.name in OPTIONAL_NUMBERS:  # guidance, flow_shift: None is the family's value
                request[f.name] = o.typed(f.name, float)
                continue
            if isinstance(default, bool) or not isinstance(default, (int, float, str)):
                continue
            # (the type the value must have: a default left out is a marked int or float, engine.worker.values)
            request[f.name] = o.typed(f.name, next(t for t in (str, float, int) if isinstance(default, t)))
        engine = o.mapping("engine")  # config.yaml's engine keys (issue 45: the memory levers), over the config
        dry = _dry_run_of(o)  # the planner's decision only: nothing loaded (on a declared machine: vram, ram)
        o.done()
        s = self.settings
        options = _engine_options(s, engine)
        if dry:  # the planner's decision only: no worker, so the loaded model (if any) stays as it is
            return lambda progress: _as_given(core.generate(model, prompt, out / "image.png", stack=stack, settings=s,
                                                            on_progress=progress, options=options, **dry, **request), shown)
        # on the loaded model when it is this one with these load-time settings (issue 46): reused_worker says so
        return lambda progress: _as_given(self.warm.generate(model, prompt, out / "image.png", stack=stack, request=request,
                                                             options=options, on_progress=progress), shown)

    def _model(self, name: str, what: What = "model") -> Path:
        """An entry of the models directory the service was started with, named by its place in it
        (``unet/flux.gguf``), never by a path from the request (``models_dir.ModelsDir``: no escape)."""
        if self.models_dir is None:
            raise BadRequest("this service has no models directory, so it cannot generate",
                             hint="start the service with a models directory", code="no-models")
        if not self.models_dir.is_dir():
            raise BadRequest("the models directory cannot be read", code="no-models")
        try:
            return ModelsDir(self.models_dir).resolve(name, what)
        except NameRefused as exc:
            raise BadRequest(exc.message, hint=exc.hint, code="bad-request") from None


def _as_given(result: Any, name: str) -> Any:
    """A generate job's result with its model named as the client named it (its place in the models
    directory), not by the absolute path the service resolved that name to on its own machine."""
    if isinstance(getattr(result, "model", None), str):
        result.model = name
    return result


def _engine_options(settings: Settings, engine: Dict[str, Any]) -> Any:
    """The engine options of a generate job: the settings' config.yaml with the job's ``engine`` object on
    top, checked now (a bad value is a 400 before the job is queued); None: the config's, read when it runs."""
    if not engine:
        return None
    try:
        return direct.engine_options_over(settings, engine, "job option 'engine'")
    except AccelstackError as exc:
        raise BadRequest(exc.message, hint=exc.hint, code="bad-request") from None


def _dry_run_of(o: Options) -> Dict[str, Any]:
    """A generate job's ``dry_run`` (with ``vram``/``ram``: a declared machine, e.g. "8GiB"), as core.generate's
    arguments; a bad size is a 400 before the job is queued."""
    dry, vram, ram = o.flag("dry_run"), o.text("vram", MAX_SHORT), o.text("ram", MAX_SHORT)
    if not dry:
        if vram or ram:
            raise BadRequest("vram and ram declare a machine for a dry run", hint="add \"dry_run\": true",
                             code="bad-request")
        return {}
    if not (vram or ram):
        return {"dry_run": True}
    try:
        machine = core_machine.declared_machine("cuda" if vram else "cpu", ram=core_machine.parse_size(ram, "ram") if ram
                                                else None, vram=core_machine.parse_size(vram, "vram") if vram else None)
        return {"dry_run": True, "machine": machine}
    except AccelstackError as exc:
        raise BadRequest(exc.message, hint=exc.hint, code="bad-request") from None
