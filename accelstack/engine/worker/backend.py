"""What the worker's two backends share: the surface the worker drives, and the log they keep.

:class:`~accelstack.engine.worker.ggml_backend.GgmlBackend` (stable-diffusion.cpp) and
:class:`~accelstack.engine.worker.torch_backend.TorchBackend` (diffusers) subclass it, so the worker's
HTTP server, status and progress work unchanged for both. Runs inside the worker: standard
library only.
"""
from __future__ import annotations

import collections
import ctypes
import os
from typing import IO, Any, Callable, Deque, List, Mapping, Optional, Sequence, Tuple

from ..config import EngineOptions
from .protocol import LIB_DIRS_ENV, PRELOAD_ENV, DeviceInfo, GeneratedImage, GenerateRequest

__all__ = ["WorkerBackend", "load_runtime_libraries", "libraries_in", "LIB_DIRS_ENV", "PRELOAD_ENV"]

_loaded: List[Any] = []  # the handles stay alive for the life of the worker


def libraries_in(environ: Mapping[str, str]) -> Tuple[List[str], List[str]]:
    """(directories, files to preload) as :meth:`Runtime.worker_env` wrote them into ``environ``."""
    dirs = [d for d in environ.get(LIB_DIRS_ENV, "").split(os.pathsep) if d]
    files = [f for f in environ.get(PRELOAD_ENV, "").split(os.pathsep) if f]
    return dirs, files


def load_runtime_libraries(dirs: Sequence[str], files: Sequence[str]) -> List[str]:
    """Load the runtime's shared libraries ``files`` before its own (a CUDA build links ``libcudart.so.13``
    by name; once a library of that name is loaded, the dynamic loader uses it). Windows: ``dirs``
    are also added to the DLL search path. Returns the files loaded; a file that does
    not load raises ImportError naming it (the worker reports it as a failed import)."""
    if os.name == "nt":
        for d in dirs:
            try:
                _loaded.append(os.add_dll_directory(d))  # type: ignore[attr-defined]
            except OSError as exc:
                raise ImportError(f"cannot use the library directory {d}: {exc}") from None
    done: List[str] = []
    for f in files:
        try:
            _loaded.append(ctypes.CDLL(f, mode=getattr(ctypes, "RTLD_GLOBAL", 0)))
        except OSError as exc:
            raise ImportError(f"cannot load the library {f}: {exc}") from None
        done.append(f)
    return done


class WorkerBackend:
    """One stack inside the worker. ``log_tail`` keeps the last (level, line) pairs the runtime
    logged (they explain a failed load); ``on_progress(step, steps)`` is set by the worker.
    ``lib_dirs`` and ``preload`` are the runtime's outside libraries (the worker's options), which
    :meth:`import_runtime` loads first where the stack has them."""

    name = ""

    def __init__(self, log_stream: IO[str], lib_dirs: Sequence[str] = (), preload: Sequence[str] = ()) -> None:
        self.log_stream = log_stream
        self.lib_dirs, self.preload = list(lib_dirs), list(preload)
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
