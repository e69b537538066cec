"""A generation session an app holds: open it with a model, its component files and load-time
settings, generate many images with per-image settings, close it (issue 46).

The model stays loaded in one supervised worker between images (:class:`accelstack.engine.session.WarmSession`):
four images of one model cost one load, not four. The session's worker starts as it opens (it imports
the runtime while the app prepares its first prompt) and is replaced when a model file changed on disk
since it was loaded, when the worker died, or when an image's size makes the memory planner choose
other load-time settings. The machine's memory is read once, when the session opens.

    with accelstack.open_session("sd15.safetensors", vae="vae.safetensors") as session:
        for seed in range(4):
            session.generate("a lighthouse at dusk", f"out-{seed}.png", seed=seed, steps=20)
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional, Union

from ..engine.config import EngineOptions, load_config
from ..engine.errors import InvalidRequestError
from ..engine.generation import GenerateReport
from ..engine.request.check import check_generation
from ..engine.runtime import Runtime
from ..engine.session import WarmSession
from ..engine.supervision.supervisor import SupervisorPolicy, early_worker
from ..engine.worker.protocol import COMPONENT_FLAGS, GenerateRequest
from ..events import ProgressCallback, ProgressEvent, null_progress
from ..hardware.protocol import System
from ..installer.records import Receipt
from ..settings import Settings
from .machine import machine_memory
from .running import installed_runtime

__all__ = ["GenerationSession", "open_session"]


class GenerationSession:
    """One model loaded in one worker, for many images. Thread-safe: images are made one at a time."""

    def __init__(self, model: Optional[Union[str, Path]], *, runtime: Runtime, options: EngineOptions,
                 components: Dict[str, str], system: Optional[System] = None, policy: Optional[SupervisorPolicy] = None,
                 start_early: bool = True) -> None:
        unknown = sorted(set(components) - set(COMPONENT_FLAGS))
        if unknown:
            raise InvalidRequestError(f"not a component file of a model: {', '.join(unknown)}",
                                      hint=f"components are {', '.join(COMPONENT_FLAGS)}")
        self.model = str(model) if model is not None else None
        self.runtime = runtime
        self.options = options
        self.components = {k: str(v) for k, v in components.items() if v}
        machine = machine_memory(runtime.backend, system) if runtime.traits.memory_estimate else None
        worker = early_worker(runtime, policy=policy) if start_early else None
        self._early_pid = worker.pid if worker is not None else None  # told once, to the first image's progress
        self._engine = WarmSession(runtime, policy=policy, machine=machine, worker=worker)

    def __enter__(self) -> GenerationSession:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def loaded(self) -> bool:
        return self._engine.loaded

    @property
    def loads(self) -> int:
        """How many times the model was loaded (1 while nothing forced a reload)."""
        return self._engine.loads

    def request(self, prompt: str, **image: Any) -> GenerateRequest:
        """The request of one image: the session's components with ``image``'s per-image settings."""
        fixed = sorted(set(image) & set(COMPONENT_FLAGS))
        if fixed:
            raise InvalidRequestError(f"{', '.join(fixed)} is a load-time setting of this session, not of one image",
                                      hint="open another session for other component files")
        fields: Dict[str, Any] = {**self.components, **image}
        return GenerateRequest(prompt=prompt, **fields)

    def generate(self, prompt: str, output: Union[str, Path], *, on_progress: Optional[ProgressCallback] = None,
                 **image: Any) -> GenerateReport:
        """One generation (``image``: the per-image fields of :class:`accelstack.engine.GenerateRequest`:
        negative_prompt, width, height, steps, seed, sampler, scheduler, cfg_scale, batch_count, lora_dir...),
        checked once, then run on the loaded worker; the report's ``reused_worker`` says whether it was."""
        progress = on_progress or null_progress
        pid, self._early_pid = self._early_pid, None
        if pid:  # the worker this session started as it opened: importing the runtime while the request is checked
            progress(ProgressEvent("message", "generate", task="worker", extra={"pid": pid, "early": True},
                                   message=f"the worker started early (pid {pid}); checking the request"))
        checked = check_generation(self.request(prompt, **image), self.model, output, self.options,
                                   traits=self.runtime.traits)
        progress(ProgressEvent("message", "generate", task="check", message="the request is checked"))
        return self._engine.generate(checked, progress=progress)

    def release(self) -> bool:
        """Free the loaded model's memory now (the next image loads it again); whether one was loaded."""
        return self._engine.release()

    def cancel(self) -> bool:
        return self._engine.cancel()

    def close(self) -> None:
        """Stop the worker and wait for its exit; idempotent."""
        self._engine.close()


def open_session(model: Optional[Union[str, Path]], *, receipt: Optional[Receipt] = None, stack: str = "ggml",
                 settings: Optional[Settings] = None, options: Optional[EngineOptions] = None,
                 runtime: Optional[Runtime] = None, system: Optional[System] = None,
                 policy: Optional[SupervisorPolicy] = None, **components: str) -> GenerationSession:
    """A :class:`GenerationSession` on an installed runtime (default: the active one of ``stack``) or on
    ``runtime``; ``options``: the load-time settings (default: the settings' config file); ``components``:
    vae, clip_l, clip_g, t5xxl, llm, taesd, control_net, diffusion_model files."""
    s = settings or Settings.resolve()
    rt = runtime if runtime is not None else installed_runtime(receipt, stack=stack, settings=s)
    opts = options if options is not None else load_config(s.config_file, missing_ok=True)
    return GenerationSession(model, runtime=rt, options=opts, components=components, system=system, policy=policy)
