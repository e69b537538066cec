"""What the worker's two backends share: the surface the worker drives, and the log they keep.

:class:`~accelstack.engine.ggml_backend.GgmlBackend` (stable-diffusion.cpp) and
:class:`~accelstack.engine.torch_engine.TorchBackend` (diffusers) subclass it, so the worker's
HTTP server, status and progress work unchanged for both. Runs inside the worker: standard
library only.
"""
from __future__ import annotations

import collections
from typing import IO, Any, Callable, Deque, List, Optional, Tuple

from .config import EngineOptions
from .protocol import DeviceInfo, GeneratedImage, GenerateRequest


class WorkerBackend:
    """One stack inside the worker. ``log_tail`` keeps the last (level, line) pairs the runtime
    logged (they explain a failed load); ``on_progress(step, steps)`` is set by the worker."""

    name = ""

    def __init__(self, log_stream: IO[str]) -> None:
        self.log_stream = log_stream
        self.log_tail: Deque[Tuple[str, str]] = collections.deque(maxlen=200)
        self.sd: Any = None  # the loaded model (None until load)
        self.on_progress: Callable[[int, int], None] = lambda step, steps: None
        self.library_seconds: Optional[float] = None  # the stack's own time for the last generate

    def log(self, level: str, line: str) -> None:
        """Keep ``line`` in the tail and write it to the worker's log (stderr)."""
        self.log_tail.append((level, line))
        try:
            self.log_stream.write(f"[{level}] {line}\n")
            self.log_stream.flush()
        except (OSError, ValueError):
            pass

    def import_runtime(self) -> None:
        raise NotImplementedError

    def version(self) -> str:
        raise NotImplementedError

    def system_info(self) -> str:
        raise NotImplementedError

    def device(self) -> DeviceInfo:
        raise NotImplementedError

    def load(self, model: str, options: EngineOptions) -> None:
        raise NotImplementedError

    def load_reason(self) -> str:
        raise NotImplementedError

    def generate(self, req: GenerateRequest) -> Tuple[List[GeneratedImage], int, str, str]:
        """(images, the seed used, the sampler and scheduler that "default" resolved to)."""
        raise NotImplementedError
