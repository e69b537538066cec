"""A runtime, as the engine sees it: a directory to import the stack from, and its environment.

The installer hands over a runtime home plus the plan's environment (``CUDA_VISIBLE_DEVICES``,
``HSA_OVERRIDE_GFX_VERSION``...); the engine needs nothing else to launch a worker on it.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional

from ..errors import Action
from .errors import ConfigError, RuntimeNotFoundError

GGML_BACKENDS = ("cpu", "cpu-noavx2", "cuda", "vulkan", "rocm", "metal", "sycl")
BACKENDS = GGML_BACKENDS + ("torch",)  # what a Runtime's ``backend`` may be ("torch": the torch stack)


@dataclass
class Runtime:
    """``path`` goes first on the worker's ``PYTHONPATH``; ``env`` is applied on top of ours.
    ``python`` is the interpreter to run the worker with ("" = the one running accelstack)."""

    path: Path
    backend: str = "cpu"
    env: Dict[str, str] = field(default_factory=dict)
    python: str = ""

    @property
    def is_gpu(self) -> bool:
        return not self.backend.startswith("cpu")

    def interpreter(self) -> str:
        return self.python or sys.executable

    @classmethod
    def torch(cls, path: Path, env: Optional[Mapping[str, str]] = None) -> Runtime:
        """A torch runtime: a venv (the worker runs under its ``bin/python``) or a
        ``pip --target`` directory (put first on the worker's ``PYTHONPATH``)."""
        p = Path(path)
        for exe in (p / "bin" / "python", p / "Scripts" / "python.exe"):
            if exe.is_file():
                return cls(path=p, backend="torch", env=dict(env or {}), python=str(exe))
        return cls(path=p, backend="torch", env=dict(env or {}))

    def worker_command(self) -> List[str]:
        """The worker's command line up to its options: ``accelstack.engine.worker`` run as
        ``__main__`` by a bootstrap that registers the ``accelstack`` package without running its
        ``__init__``: that binds ``accelstack.detect``, which needs ``packaging``, while the worker
        needs only the standard library. So the worker runs in an interpreter that has none of
        accelstack's dependencies, such as a torch runtime's own venv, where accelstack's import
        root is appended to the *end* of ``sys.path`` so the venv's packages win over ours.
        (``python -m accelstack.engine.worker`` works too where accelstack's dependencies are.)"""
        root = Path(__file__).resolve().parents[2]
        boot = ("import runpy, sys, types; sys.path.append(%r); "
                "pkg = types.ModuleType('accelstack'); pkg.__path__ = [%r]; sys.modules['accelstack'] = pkg; "
                "runpy.run_module('accelstack.engine.worker', run_name='__main__', alter_sys=True)"
                % (str(root), str(root / "accelstack")))
        return [self.interpreter(), "-c", boot] + (["--backend", "torch"] if self.backend == "torch" else [])

    def worker_env(self, base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
        """The worker's environment: ``base`` (default ours) + ``env``, runtime first on the path."""
        env = dict(os.environ if base is None else base)
        env.update(self.env)
        parts = [str(self.path)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(parts)
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("PYTHONIOENCODING", "utf-8")
        return env

    def check(self) -> Runtime:
        """Fail early, with a hint, when the directory cannot hold a ggml runtime."""
        if self.backend not in BACKENDS:
            raise ConfigError(f"unknown backend {self.backend!r}", hint=f"choose one of: {', '.join(BACKENDS)}",
                              action=Action.FIX_INPUT)
        p = Path(self.path)
        if not p.is_dir():
            raise RuntimeNotFoundError(f"runtime directory {p} does not exist",
                                       hint="use the directory of an installed runtime, or install one",
                                       action=Action.INSTALL)
        if self.backend != "torch" and not (p / "stable_diffusion_cpp").is_dir():
            raise RuntimeNotFoundError(
                f"{p} is not a ggml runtime: it has no stable_diffusion_cpp package",
                hint="use the directory the stable-diffusion-cpp-python wheel was installed into, or install a runtime",
                action=Action.INSTALL)
        return self
