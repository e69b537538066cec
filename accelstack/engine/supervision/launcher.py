"""One worker process for one runtime: launch it, wait until it is ready, ask its status, stop it.

:class:`WorkerLauncher` is the part of the :class:`~accelstack.engine.supervision.supervisor.Supervisor` that
deals with one launch at a time: it makes the supervisor's folder (ready files, the token file,
worker logs: :mod:`~accelstack.engine.supervision.workdirs`), starts the process
(:mod:`~accelstack.engine.supervision.process`), connects its client (:mod:`~accelstack.engine.supervision.client`),
reports the model's loading as progress, and stops the worker (asking first, then killing its
tree), keeping the folder of a worker that crashed (a message names its log). What to do when a
worker dies or stalls (restarts, backoff, retried jobs) is the supervisor's.
"""
from __future__ import annotations

import logging
import math
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, TypeVar

from ...errors import Action
from ...events import ProgressCallback, ProgressEvent, null_progress
from ..config import EngineOptions
from ..errors import ModelLoadError, WorkerCrashedError, WorkerStartError
from ..runtime import Runtime
from ..worker.protocol import COMPONENT_FLAGS, WorkerStatus, flag_of
from .client import WorkerClient
from .policy import SupervisorPolicy, load_note
from .process import WorkerProcess
from .workdirs import clean_stale, make, mark_crashed, stamp

__all__ = ["WorkerLauncher"]

log = logging.getLogger(__name__)
# A prestarted worker is used only while it still waits for its model (or its deferred load file)
# by this margin; later, it may have given up (its wait counts from after its import: ours is earlier).
LOAD_MARGIN = 1.0
# What stable-diffusion.cpp's load errors say of each component file (the prefix its tensors load under, its
# log lines: src/stable-diffusion.cpp new_sd_ctx, src/control.hpp load_from_file), lower case.
_COMPONENT_WORDS: Dict[str, Tuple[str, ...]] = {
    "control_net": ("control net",), "vae": ("first_stage_model.", "loading vae"), "taesd": ("'tae.", "loading tae"),
    "clip_l": ("clip_l", "cond_stage_model.transformer."), "clip_g": ("clip_g", "cond_stage_model.1."),
    "t5xxl": ("t5xxl",), "llm": ("text_encoders.llm.", "loading llm"),
}
_Launcher = TypeVar("_Launcher", bound="WorkerLauncher")


class WorkerLauncher:
    """The current worker of one runtime (and optionally one loaded model): its launch, readiness,
    status and stop. Use as a context manager, or call :meth:`start` and :meth:`stop`."""

    def __init__(self, runtime: Runtime, model: Optional[str] = None, options: Optional[EngineOptions] = None,
                 policy: Optional[SupervisorPolicy] = None, progress: ProgressCallback = null_progress,
                 extra_env: Optional[Dict[str, str]] = None, stage: str = "generate", model_label: str = "") -> None:
        self.runtime = runtime
        self.model = os.path.abspath(model) if model else ""  # the worker runs in its own folder
        self.stage = stage
        self.model_label = model_label or (Path(self.model).name if self.model else "")
        self.options = (options or EngineOptions()).validate().concrete()  # the worker never gets "auto"
        self.policy = policy or SupervisorPolicy()
        self.progress = progress
        self.extra_env = dict(extra_env or {})
        self.launches = 0
        self.last_status: Optional[WorkerStatus] = None
        self.client = WorkerClient(0, "")
        self._proc: Optional[WorkerProcess] = None  # the latest launch (it may have died)
        self._dir: Optional[Path] = None  # per-supervisor folder: ready files and worker logs
        self._log_path: Optional[Path] = None
        self._saved_tail: List[str] = []
        self._crashed = False  # a worker crashed: its folder (the log a message names) is kept
        self._stopping = self._exiting = False  # the worker was asked to exit; it answered that it does
        self._prestarted, self._token = False, ""  # prestart launched the current worker; start connects to it
        self._awaits_load = False  # the current launch was deferred and has not been sent its load file yet
        self._load_by = math.inf  # when (time.monotonic()) a prestarted launch stops waiting for its model or
        # load file, at the earliest; inf once it has them (or for an ordinary launch)
        self._lock = threading.RLock()

    # -- lifecycle ------------------------------------------------------------------------------
    def __enter__(self: _Launcher) -> _Launcher:
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

    @property
    def launch_env(self) -> Dict[str, str]:
        """The environment the current (or last) worker was started with ({} before the first)."""
        return dict(self._proc.env) if self._proc is not None else {}

    def alive(self) -> bool:
        return self._proc is not None and self._proc.alive()

    def start(self) -> WorkerStatus:
        """Launch the worker and wait until it is ready (model loaded). On failure nothing is
        left running (``log_tail()`` still has the worker's last lines)."""
        with self._lock:
            if self.alive() and not self._prestarted:  # a loaded worker: a late answer (starved of CPU) is no verdict
                st = self._status(self.policy.ping_timeout)  # the job's submit and its liveness judge decide
                return st or self.last_status or WorkerStatus(phase="ready", pid=self.pid or 0)
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

    def prestart(self, model_appears: float = 300.0, deferred: bool = False) -> None:
        """Launch the worker before its model file exists and return: it imports the runtime (a GPU
        build also initializes its device) while the caller writes the model, which must appear
        whole (renamed into place) within ``model_appears`` s. With ``deferred`` the model and the
        options are not known yet either (the caller checks its inputs and plans the memory
        meanwhile): :meth:`configure` gives them within that time. :meth:`start` then waits for it."""
        with self._lock:
            if self._proc is None:
                self._spawn(await_model=model_appears, deferred=deferred)
                self._prestarted = True

    def configure(self, model: Optional[str], options: Optional[EngineOptions] = None, model_label: str = "") -> None:
        """Set the model and options (before :meth:`start`); a worker prestarted ``deferred`` gets
        them now and loads as soon as it has imported the runtime."""
        with self._lock:
            self.model = os.path.abspath(model) if model else ""
            self.model_label = model_label or (Path(self.model).name if self.model else "")
            self.options = (options or EngineOptions()).validate().concrete()
            self._send_load()

    # -- launching ------------------------------------------------------------------------------
    def _spawn(self, await_model: float = 0.0, deferred: bool = False) -> None:
        folder, fresh = self._dir, self._dir is None or not self._dir.is_dir()
        if folder is None or fresh:
            folder = self._dir = make(stamped=False)  # stamped once the worker runs (psutil's import)
        if self._proc is not None:
            self._proc.close()
        self.launches += 1
        self._stopping = self._exiting = False
        self._proc, self._token = WorkerProcess.for_runtime(self.runtime, self.options, self.model, self.extra_env,
                                                            folder, self.launches, await_model, deferred)
        self._awaits_load = deferred
        self._load_by = time.monotonic() + await_model if await_model > 0 else math.inf
        self._log_path = self._proc.log_path
        self._proc.spawn()
        if fresh:  # folders left by a killed process, and old crash logs (ours is alive): while the worker starts
            stamp(folder)
            clean_stale()

    def _send_load(self) -> None:
        """A deferred launch's model and options, once (the current ones), unless it is too late."""
        if self._awaits_load and self._proc is not None:
            self._awaits_load = False
            if not self._drop_if_late():
                self._proc.send_load(self.model, self.options)
                self._load_by = math.inf

    def _drop_if_late(self) -> bool:
        """End a prestarted worker that may have stopped waiting for its model or load file (the caller's
        checks or its writing of the model outlasted the wait: a copy from a slow disk), so that
        :meth:`start` launches an ordinary one: a slow caller costs the head start, not an error."""
        if self._proc is None or not self._prestarted or time.monotonic() < self._load_by - LOAD_MARGIN:
            return False
        log.info("worker %d may have stopped waiting for its model; an ordinary launch replaces it", self._proc.pid)
        self._proc.kill("its model came after it stopped waiting")
        self._prestarted, self._load_by = False, math.inf
        return True

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
            self._send_load()  # a deferred prestart not configured: what this launcher has (no model: none)
            self._drop_if_late()  # a prestart whose model was written late
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
                    kept = self._keep_log()
                    crash = proc.load_failure(self.model, rc, kept)
                    raise self._load_error(crash.message, crash.hint, kept)
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
                        raise self._load_error(st.error, "check that the file is a complete Stable Diffusion model "
                                               "(.safetensors, .gguf, .ckpt or a diffusers folder)")
                    raise WorkerStartError(f"the worker could not start the runtime: {st.error}",
                                           hint="the runtime is broken or does not match this machine; "
                                           "reinstall it", action=Action.REINSTALL, log_tail=self.log_tail())
            if time.monotonic() > deadline:
                self._kill("it was not ready in time")
                raise WorkerStartError(f"the worker was not ready within {self.policy.load_timeout:.0f} s",
                                       hint=self._log_hint(), action=Action.RETRY, log_tail=self.log_tail())

    def _load_error(self, message: str, hint: str, kept_log: str = "") -> ModelLoadError:
        """The worker's failed load, told on the component file the runtime's reason names (its tensors'
        prefix, its log line): the load takes every file given with the model, and a damaged ControlNet or
        VAE was reported as the model's fault, with a hint about a complete model."""
        given = [(name, getattr(self.options, name)) for name in COMPONENT_FLAGS
                 if name != "diffusion_model" and getattr(self.options, name)]
        if not given:
            return ModelLoadError(message, hint=hint)
        reason = message.split(": ", 1)[-1] if message.startswith("cannot load model ") else message
        low = reason.lower()
        named = [(name, path) for name, path in given
                 if path in reason or any(word in low for word in _COMPONENT_WORDS.get(name, ()))]
        files = ", ".join(f"{flag_of(name)} {path}" for name, path in named or given)
        log_note = f"; the worker's log is kept at {kept_log}" if kept_log else ""
        if named:
            return ModelLoadError(f"cannot load {files} (given with the model {self.model}): {reason}",
                                  hint=f"check {' and '.join(flag_of(n) for n, _p in named)}: the file may be damaged, "
                                  f"cut, or not made for this model; or leave it out{log_note}")
        return ModelLoadError(f"{message} (loaded with {files})",
                              hint="check the model and the files given with it: each must be complete and made for "
                              f"the model's family, or leave them out to tell which one fails{log_note}")

    def log_tail(self, lines: int = 20) -> List[str]:
        """The last lines of the current worker's log (or of the last one, once stopped)."""
        tail = self._proc.log_tail(lines) if self._proc is not None else []
        return tail or self._saved_tail[-lines:]

    def _kill(self, reason: str) -> None:
        if self._proc is not None:
            self._proc.kill(reason)

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
