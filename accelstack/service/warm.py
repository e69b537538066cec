"""The service's warm model (issue 46): the generate jobs' session, kept between jobs.

A generate job for the same runtime, model and component files as the previous one runs on the
worker that already holds them (the engine's session reloads when a file changed on disk or the
load-time settings differ); another model replaces it. The worker is released when memory is
needed or it is no longer wanted: after ``idle`` seconds without a job, before a verify, install,
repair or upgrade (which never run beside a loaded worker of the runtime they change: jobs run one
at a time, and this releases first), on ``DELETE /v1/session``, and when the service stops. A
killed service's worker ends with it (the worker watches its parent).
While a worker is held it is registered (core/held_workers.py) so that an install, repair, upgrade
or rollback run by another process has this service release it first.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from .. import core
from ..core.direct import EngineOptions  # the load-time settings: the core's name for the engine's
from ..core.held_workers import register, unregister
from ..events import ProgressCallback
from ..settings import Settings

__all__ = ["WarmModel", "IDLE_SECONDS", "COMPONENTS"]

IDLE_SECONDS = 300.0  # a loaded model's memory is given back after this long without a job
COMPONENTS = ("diffusion_model", "vae", "clip_l", "clip_g", "t5xxl", "llm", "taesd", "control_net")


class WarmModel:
    """At most one loaded model, for the service's generate jobs (run one at a time by the job runner)."""

    def __init__(self, settings: Settings, idle: float = IDLE_SECONDS) -> None:
        self.settings = settings
        self.idle = idle
        self._session: Any = None  # a core.GenerationSession
        self._key: Optional[Tuple[Any, ...]] = None
        self._model = ""
        self._last = time.monotonic()
        self._lock = threading.RLock()
        self._address: Optional[Tuple[str, int]] = None  # the service's url and port, once it listens
        self._held: Optional[Path] = None  # the registration other processes' installs read (core.held_workers)

    def announce(self, url: str, port: int) -> None:
        """Where the service listens: while a worker is held, other processes' installs can ask it to release."""
        self._address = (url, port)

    def generate(self, model: Optional[Path], prompt: str, output: Path, *, stack: str, request: Dict[str, Any],
                 on_progress: ProgressCallback, options: Optional[EngineOptions] = None) -> Any:
        """One generate job on the loaded model when it is this one, else on a newly opened session;
        ``options``: the job's load-time settings (the config file's, with its ``engine`` keys over them)."""
        image = dict(request)
        components = {k: image.pop(k) for k in COMPONENTS if k in image}
        s = self.settings
        runtime = core.installed_runtime(stack=stack, settings=s)
        key = (stack, runtime, str(model), tuple(sorted(components.items())), repr(options))
        with self._lock:
            if self._session is None or key != self._key:
                self.release()
                self._session = core.open_session(model, runtime=runtime, settings=s, options=options, **components)
                self._key, self._model = key, Path(str(model or components.get("diffusion_model", ""))).name
                if self._address is not None:  # registered before the worker loads: an install never misses it
                    self._held = register(s.state_dir, url=self._address[0], port=self._address[1], stack=stack,
                                          runtime=str(runtime.path))
            try:
                return self._session.generate(prompt, output, on_progress=on_progress, **image)
            finally:
                self._last = time.monotonic()

    def release(self) -> bool:
        """Close the session (its worker stopped, its memory freed); whether a model was held."""
        with self._lock:
            session, self._session, self._key, self._model = self._session, None, None, ""
            held, self._held = self._held, None
        if session is None:
            unregister(held)
            return False
        loaded = bool(session.loaded)
        session.close()
        unregister(held)  # only once its worker has exited
        return loaded

    def release_if_idle(self) -> bool:
        with self._lock:
            if self._session is None or time.monotonic() - self._last < self.idle:
                return False
        return self.release()

    def until_idle(self) -> Optional[float]:
        """Seconds until the held model counts as idle (None: none is held)."""
        with self._lock:
            return None if self._session is None else max(0.0, self.idle - (time.monotonic() - self._last))

    def state(self) -> Dict[str, Any]:
        """What ``GET /v1/session`` shows: whether a model is loaded, which, and how many times it was loaded."""
        with self._lock:
            session = self._session
            return {"loaded": bool(session is not None and session.loaded), "model": self._model,
                    "loads": session.loads if session is not None else 0, "idle_release_seconds": self.idle}
