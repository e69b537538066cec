"""Folders the project's own scripts keep in accelstack's build cache, so ``cache list`` can say whose they are.

They are not cache entries (``cache purge`` leaves them, like every name it did not write and mark), but they
are not a stranger's either: calling them "not written by accelstack" sent people hunting for who put them
there. Each is recognised by its name *and* what its script writes inside it, never by a name alone, and
never through a symbolic link:

``vulkan-headers/<version>/usr/include``
    Debian's Vulkan headers, extracted by scripts/setup-vulkan.sh; ``build ggml --backend vulkan`` compiles
    against the newest (accelstack.publisher.build).
``vulkan-lavapipe/<version>/env``
    a newer Mesa lavapipe, extracted by scripts/vulkan-lavapipe.sh (its env file's first line names the
    script); only the Vulkan end-to-end test reads it, with ACCELSTACK_NEWER_LAVAPIPE=1.
``runtime-<16 hex>/stable_diffusion_cpp``
    a CPU runtime benchmarks/bench_engine.py unpacked from a wheel (the engine tests run on it).
``sd-cli-<16 hex>/build``
    stable-diffusion.cpp's sd-cli, built by benchmarks/bench_engine.py from the runtime's source.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Dict, List, Pattern, Tuple

from .job_folders import real_dir

__all__ = ["SCRIPT_FOLDERS", "written_by"]


def _versions(folder: Path) -> List[Path]:
    try:
        return [v for v in sorted(folder.iterdir()) if real_dir(v)] if real_dir(folder) else []
    except OSError:
        return []


def _headers(folder: Path) -> bool:
    return any(real_dir(v / "usr" / "include") for v in _versions(folder))


def _lavapipe(folder: Path) -> bool:
    for v in _versions(folder):
        env = v / "env"
        try:
            if not env.is_symlink() and "scripts/vulkan-lavapipe.sh" in env.read_text(errors="replace")[:400]:
                return True
        except OSError:
            continue
    return False


# (name, what its script leaves inside, "script: what it is") for the build cache
SCRIPT_FOLDERS: Dict[str, List[Tuple[Pattern[str], Callable[[Path], bool], str]]] = {"builds": [
    (re.compile(r"vulkan-headers\Z"), _headers,
     "scripts/setup-vulkan.sh: Vulkan headers `build ggml --backend vulkan` compiles against"),
    (re.compile(r"vulkan-lavapipe\Z"), _lavapipe,
     "scripts/vulkan-lavapipe.sh: a newer lavapipe for the Vulkan tests (ACCELSTACK_NEWER_LAVAPIPE=1)"),
    (re.compile(r"runtime-[0-9a-f]{16}\Z"), lambda f: real_dir(f / "stable_diffusion_cpp"),
     "benchmarks/bench_engine.py: a CPU runtime unpacked for the engine tests"),
    (re.compile(r"sd-cli-[0-9a-f]{16}\Z"), lambda f: real_dir(f / "build"),
     "benchmarks/bench_engine.py: stable-diffusion.cpp's sd-cli built for the pixel tests"),
]}


def written_by(cache: str, root: Path, names: List[str]) -> Dict[str, str]:
    """Of ``names`` (left alone in cache ``cache`` at ``root``), those the project's scripts wrote: name -> whose."""
    out: Dict[str, str] = {}
    for name in names:
        folder = root / name
        for pattern, looks_right, whose in SCRIPT_FOLDERS.get(cache, []):
            if pattern.match(name) and real_dir(folder) and looks_right(folder):
                out[name] = whose
                break
    return out
