"""A runtime, as the engine sees it: a directory to import the stack from, and its environment.

The installer hands over a runtime home plus the plan's environment (``CUDA_VISIBLE_DEVICES``,
``HSA_OVERRIDE_GFX_VERSION``...); the engine needs nothing else to launch a worker on it.

A CUDA runtime's ``libcudart`` and cuBLAS live outside it, shared by every runtime of the home
(or in a torch environment); the installer leaves a note, :data:`LIBS_FILE`, in the runtime
directory saying where. The worker gets those directories and the libraries to load first through
its environment (:func:`accelstack.engine.worker.backend.load_runtime_libraries` loads them in
order before the runtime; Linux also gets ``LD_LIBRARY_PATH``, Windows ``PATH`` and
``os.add_dll_directory``). macOS has no CUDA, so no note is ever written there.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Dict, List, Mapping, Optional

from ..domain import RUNTIME_LIBS_NOTE, RUNTIME_LIBS_NOTE_FORMAT
from ..errors import Action
from ..limits import read_capped
from ..settings import inherited_env
from .errors import ConfigError, RuntimeNotFoundError
from .worker.protocol import LIB_DIRS_ENV, PRELOAD_ENV

__all__ = ["Runtime", "RuntimeLibraries", "StackTraits", "runtime_libraries", "GGML", "TORCH", "STACKS",
           "GGML_BACKENDS", "BACKENDS", "TORCH_BACKEND", "LIBS_FILE", "MAX_LIBS_FILE"]

LIBS_FILE = RUNTIME_LIBS_NOTE  # written by accelstack.installer.cuda_libs.write_links
MAX_LIBS_FILE = 1 << 20
GGML_BACKENDS = ("cpu", "cpu-noavx2", "cuda", "vulkan", "rocm", "metal", "sycl")
TORCH_BACKEND = "torch"  # a torch runtime's ``backend``: the torch worker picks its device itself


@dataclass(frozen=True)
class StackTraits:
    """What the engine does differently for one stack, as data: code reads these fields instead of
    comparing stack names, so a third stack is one more entry of :data:`STACKS`."""

    stack: str  # "ggml" or "torch": the worker's ``--backend`` (its WorkerBackend's ``name``)
    library: str  # what generates, named in the PNGs' ``Version``
    package: str  # the package a runtime directory must hold ("" = none to look for: a venv or --target dir)
    library_note: bool  # the runtime may name outside libraries in its note (CUDA's, shared by the home)
    device_check: bool  # the worker reports the device the model went to: verify fails a GPU build that ran on its CPU
    memory_estimate: bool  # :mod:`accelstack.engine.memory.estimate`'s estimate (stable-diffusion.cpp's) applies
    companions: bool = False  # takes <lora:...> tags and embeddings (engine.request.companions stages them)
    # aligns sizes up to its family's multiple (engine.request.sizes refuses what it cannot make) and runs each family
    # with its reference settings for what a request leaves out (engine.request.defaults, data/family_settings.json)
    family_rules: bool = False


GGML = StackTraits(stack="ggml", library="stable-diffusion.cpp", package="stable_diffusion_cpp", library_note=True,
                   device_check=True, memory_estimate=True, companions=True, family_rules=True)
TORCH = StackTraits(stack="torch", library="diffusers", package="", library_note=False, device_check=False,
                    memory_estimate=False)
# A Runtime's ``backend`` -> its stack's traits: what ``backend`` may be.
STACKS: Dict[str, StackTraits] = {**{backend: GGML for backend in GGML_BACKENDS}, TORCH_BACKEND: TORCH}
BACKENDS = tuple(STACKS)


@dataclass
class RuntimeLibraries:
    """Where a runtime's outside libraries are: directories for the loader's path, files to preload."""

    dirs: List[Path] = field(default_factory=list)
    preload: List[Path] = field(default_factory=list)


def _libs_error(path: Path, why: str) -> RuntimeNotFoundError:
    return RuntimeNotFoundError(f"the runtime {path} cannot find its CUDA libraries: {why}",
                                hint="install the runtime again (it fetches the libraries it needs)", action=Action.REINSTALL)


def runtime_libraries(path: Path) -> RuntimeLibraries:
    """Read the runtime's library note (none: no outside libraries). A directory kept in the home is
    written relative to it and found among the runtime's parent directories (staging or runtimes),
    so a moved home keeps working; a torch environment's is absolute."""
    note = Path(path) / LIBS_FILE
    if not note.is_file():
        return RuntimeLibraries()
    try:
        raw = read_capped(note, MAX_LIBS_FILE + 1)  # never blocks on a FIFO swapped in after is_file()
        if len(raw) > MAX_LIBS_FILE:
            raise ValueError("too large")
        doc = json.loads(raw.decode("utf-8"))
        entries = doc["libraries"]
        if doc.get("format") != RUNTIME_LIBS_NOTE_FORMAT or not isinstance(entries, list):
            raise ValueError("unknown format")
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise _libs_error(path, f"its note {note} is damaged ({str(exc)[:100]})") from None
    out = RuntimeLibraries()
    for e in entries:
        if not isinstance(e, dict) or not isinstance(e.get("dir"), str) or not isinstance(e.get("files", []), list):
            raise _libs_error(path, f"its note {note} is damaged")
        rel, base = e["dir"], e.get("base")
        if base == "absolute" and Path(rel).is_absolute():
            where: Optional[Path] = Path(rel)
        elif base == "home" and rel and not PurePosixPath(rel).is_absolute() and ".." not in PurePosixPath(rel).parts:
            where = next((p / rel for p in Path(path).resolve().parents if (p / rel).is_dir()), None)
        else:
            raise _libs_error(path, f"its note {note} names {rel!r} as a {base!r} directory")
        if where is None or not where.is_dir():
            raise _libs_error(path, f"{rel} is gone ({e.get('source', '')})")
        out.dirs.append(where)
        for f in e.get("files", []):
            if not isinstance(f, str) or "/" in f or "\\" in f or f in ("", ".", ".."):
                raise _libs_error(path, f"its note {note} names {f!r} as a library")
            if not (where / f).is_file():
                raise _libs_error(path, f"{where / f} is missing")
            out.preload.append(where / f)
    return out


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

    @property
    def traits(self) -> StackTraits:
        """What the engine does for this runtime's stack (ConfigError for an unknown backend)."""
        found = STACKS.get(self.backend)
        if found is None:
            raise ConfigError(f"unknown backend {self.backend!r}", hint=f"choose one of: {', '.join(BACKENDS)}",
                              action=Action.FIX_INPUT)
        return found

    @property
    def stack(self) -> str:
        """``ggml`` or ``torch``, as in a receipt."""
        return self.traits.stack

    def interpreter(self) -> str:
        return self.python or sys.executable

    @classmethod
    def torch(cls, path: Path, env: Optional[Mapping[str, str]] = None) -> Runtime:
        """A torch runtime: a venv (the worker runs under its ``bin/python``) or a
        ``pip --target`` directory (put first on the worker's ``PYTHONPATH``)."""
        p = Path(path)
        for exe in (p / "bin" / "python", p / "Scripts" / "python.exe"):
            if exe.is_file():
                return cls(path=p, backend=TORCH_BACKEND, env=dict(env or {}), python=str(exe))
        return cls(path=p, backend=TORCH_BACKEND, env=dict(env or {}))

    def worker_command(self) -> List[str]:
        """The worker's command line up to its options: ``accelstack.engine.worker.main`` run as
        ``__main__`` by a bootstrap that registers the ``accelstack`` package without running its
        ``__init__``: that binds ``accelstack.detect``, which needs ``packaging``, while the worker
        needs only the standard library. So the worker runs in an interpreter that has none of
        accelstack's dependencies, such as a torch runtime's own venv, where accelstack's import
        root is appended to the *end* of ``sys.path`` so the venv's packages win over ours.
        (``python -m accelstack.engine.worker.main`` works too where accelstack's dependencies are.)

        The options that follow the bootstrap come from the runtime: its stack (``--backend``) and
        the outside libraries its note names (``--lib-dir``, ``--preload``, in loading order)."""
        root = Path(__file__).resolve().parents[2]
        boot = ("import runpy, sys, types; sys.path.append(%r); "
                "pkg = types.ModuleType('accelstack'); pkg.__path__ = [%r]; sys.modules['accelstack'] = pkg; "
                "runpy.run_module('accelstack.engine.worker.main', run_name='__main__', alter_sys=True)"
                % (str(root), str(root / "accelstack")))
        cmd = [self.interpreter(), "-c", boot, "--backend", self.traits.stack]
        libs = self.libraries()
        for folder in libs.dirs:
            cmd += ["--lib-dir", str(folder)]
        for lib in libs.preload:
            cmd += ["--preload", str(lib)]
        return cmd

    def libraries(self) -> RuntimeLibraries:
        """The outside libraries the runtime's note names (none for a stack without notes)."""
        return runtime_libraries(self.path) if self.traits.library_note else RuntimeLibraries()

    def worker_env(self, base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
        """The worker's environment: ``base`` (default ours) + ``env``, runtime first on the path.
        The outside libraries' folders go first on the loader's path, for what the runtime loads
        later; :data:`LIB_DIRS_ENV` and :data:`PRELOAD_ENV` name them for a child that starts the
        runtime without the worker's options (the core's import check)."""
        env = inherited_env() if base is None else dict(base)
        env.update(self.env)
        parts = [str(self.path)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(parts)
        libs = self.libraries()
        if libs.dirs:
            env[LIB_DIRS_ENV] = os.pathsep.join(str(d) for d in libs.dirs)
            env[PRELOAD_ENV] = os.pathsep.join(str(f) for f in libs.preload)
            var = "PATH" if os.name == "nt" else "LD_LIBRARY_PATH"  # what the library itself loads later finds them too
            env[var] = os.pathsep.join([str(d) for d in libs.dirs] + [p for p in env.get(var, "").split(os.pathsep) if p])
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("PYTHONIOENCODING", "utf-8")
        return env

    def check(self) -> Runtime:
        """Fail early, with a hint, when the directory cannot hold a runtime of its stack."""
        traits = self.traits
        p = Path(self.path)
        if not p.is_dir():
            raise RuntimeNotFoundError(f"runtime directory {p} does not exist",
                                       hint="use the directory of an installed runtime, or install one",
                                       action=Action.INSTALL)
        if traits.package and not (p / traits.package).is_dir():
            raise RuntimeNotFoundError(
                f"{p} is not a {traits.stack} runtime: it has no {traits.package} package",
                hint="use the directory the stable-diffusion-cpp-python wheel was installed into, or install a runtime",
                action=Action.INSTALL)
        self.libraries()  # its outside libraries (CUDA) are still there
        return self
