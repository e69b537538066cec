"""Keeping a CUDA build to its own toolkit: the other toolkits of this machine stay out of its
sight, and what CMake recorded proves it.

A build with NVIDIA's PyPI toolchain must not pick up a system CUDA (a newer ``cuda_runtime.h``, an
``nvcc`` wrapper in /usr/local/bin, ``CUDA_HOME``): :func:`cuda_build_env` is the environment it
runs in, and :func:`check_cuda_compiler` reads the CMake cache and ``build.ninja`` afterwards.
"""
from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from ..errors import Action
from .errors import BuildError
from .variants import TOOLKIT_ROOTS, CudaToolkit, cuda_toolkit_candidates

__all__ = ["CudaToolchain", "check_cuda_compiler", "cuda_build_env", "exe_name", "inside", "other_toolkits"]


@dataclass
class CudaToolchain:
    """The CUDA compiler a build uses and what goes with it.

    ``cmake_args`` point CMake at it (paths of this machine: not part of the cache key);
    ``runtime`` are the NVIDIA runtime wheels the result links (``cuda_libs`` records);
    ``hidden`` are the other CUDA toolkits of this machine, kept out of the build's sight.
    """

    kit: CudaToolkit
    cmake_args: List[str]
    runtime: List[Dict[str, Any]]
    hidden: List[str] = field(default_factory=list)
    packages: Dict[str, str] = field(default_factory=dict)  # PyPI toolchain: name -> version
    tools: Dict[str, str] = field(default_factory=dict)  # cuobjdump and the like, for checking a build

    def describe(self) -> Dict[str, Any]:
        return {"cuda": self.kit.version, "nvcc": self.kit.nvcc, "root": self.kit.root, "source": self.kit.source,
                "packages": dict(self.packages), "tools": dict(self.tools)}


def exe_name(name: str) -> str:
    """``name`` as an executable's file name on this OS (``nvcc.exe`` on Windows)."""
    return name + ".exe" if os.name == "nt" else name


def other_toolkits(root: Optional[Path], env: Mapping[str, str]) -> List[str]:
    """This machine's CUDA toolkit folders other than ``root`` (what a PyPI build must not see):
    those under the usual roots and those ``env`` (``Settings.cuda_env``) points at."""
    out: List[str] = []
    folders = [p for base in TOOLKIT_ROOTS if base.is_dir() for p in sorted(base.glob("cuda*"))]
    for _where, nvcc in cuda_toolkit_candidates(env):
        folders += [nvcc.parent.parent, nvcc.resolve().parent.parent]
    for folder in folders:
        if (root is None or not inside(folder, root)) and str(folder) not in out and folder != Path("/usr"):
            if (folder / "include" / "cuda_runtime.h").is_file() or folder.name.startswith("cuda"):
                out.append(str(folder))
    return sorted(out)


def inside(path: Path, root: Path) -> bool:
    try:
        Path(path).resolve().relative_to(Path(root).resolve())
        return True
    except ValueError:
        return False


_PATH_VARS = ("PATH", "LD_LIBRARY_PATH", "LIBRARY_PATH", "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH")
_CUDA_VARS = ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDA_TOOLKIT_ROOT_DIR", "CUDAToolkit_ROOT", "CUDACXX",
              "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN", "CUDAHOSTCXX")


def cuda_build_env(base: Mapping[str, str], toolchain: CudaToolchain) -> Dict[str, str]:
    """The environment a CUDA build runs in: only ``toolchain``'s CUDA is visible. Other CUDA
    variables are dropped, folders of other toolkits (and any holding another nvcc, such as a
    wrapper in /usr/local/bin) leave the search paths, and CUDACXX names the toolchain's nvcc.
    Tools a build needs from a dropped folder (cmake, ninja) stay reachable through links."""
    env = {k: v for k, v in base.items() if k not in _CUDA_VARS and not k.startswith("CUDA_PATH_V")}
    kit = toolchain.kit
    own = Path(kit.root) if kit.root else Path(kit.nvcc).parent.parent
    hidden = [Path(h) for h in toolchain.hidden]

    def foreign(folder: str) -> bool:
        if not folder:
            return True
        p = Path(folder)
        if inside(p, own):
            return False
        if any(inside(p, h) for h in hidden):
            return True
        nvcc = p / exe_name("nvcc")
        return nvcc.is_file() and not inside(nvcc.resolve(), own)

    keep_tools: Dict[str, str] = {}
    for name in ("cmake", "ninja", "c++", "cc", "g++", "gcc"):
        where = shutil.which(name, path=base.get("PATH", ""))
        if where and foreign(str(Path(where).parent)):
            keep_tools[name] = where
    for var in _PATH_VARS:
        if var in env:
            env[var] = os.pathsep.join(d for d in env[var].split(os.pathsep) if not foreign(d))
    path = [str(Path(kit.nvcc).parent)]
    if keep_tools:
        links = own.parent / "accelstack-host-tools"
        links.mkdir(parents=True, exist_ok=True)
        for name, target in keep_tools.items():
            link = links / name
            if not link.exists():
                link.symlink_to(target)
        path.append(str(links))
    env["PATH"] = os.pathsep.join(path + [d for d in env.get("PATH", "").split(os.pathsep) if d])
    env["CUDACXX"] = kit.nvcc
    if kit.root:
        env["CUDA_HOME"] = kit.root
    return env


def check_cuda_compiler(cache_file: Path, toolchain: CudaToolchain) -> Dict[str, Any]:
    """What CMake recorded about CUDA in the build's ``CMakeCache.txt``: the compiler must be the
    toolchain's, and no CUDA path there (nor any command line of the ``build.ninja`` beside it) may
    lead into another toolkit. Returns the recorded values."""
    try:
        lines = Path(cache_file).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        raise BuildError(f"the build left no CMake cache to check ({exc})", action=Action.REPORT_BUG) from None
    values: Dict[str, str] = {}
    for line in lines:
        m = re.match(r"^([A-Za-z0-9_]*CUDA[A-Za-z0-9_]*|CUDAToolkit[A-Za-z0-9_]*):[A-Z]+=(.*)$", line)
        if m:
            values[m.group(1)] = m.group(2)
    compiler = values.get("CMAKE_CUDA_COMPILER", "")
    if not compiler or Path(compiler).resolve() != Path(toolchain.kit.nvcc).resolve():
        raise BuildError(f"CMake compiled CUDA with {compiler or 'no compiler'}, not with {toolchain.kit.nvcc}",
                         hint=f"see {cache_file}", action=Action.REPORT_BUG)
    strays = sorted(f"{k}={v}" for k, v in values.items() for h in toolchain.hidden
                    if k != "CMAKE_IGNORE_PREFIX_PATH" and any(inside(Path(part), Path(h)) for part in v.split(";")
                                                               if part.startswith("/")))
    ninja = Path(cache_file).with_name("build.ninja")  # every compile and link command line
    if ninja.is_file():
        text = ninja.read_text(encoding="utf-8", errors="replace")
        strays += [f"build.ninja names {h}" for h in toolchain.hidden
                   if re.search(re.escape(h.rstrip("/")) + r"(/|\s|$|;|\")", text)]
    if strays:
        raise BuildError(f"the CUDA build reached another toolkit: {'; '.join(strays)}", hint=f"see {cache_file}",
                         action=Action.REPORT_BUG)
    return {"cmake_cuda_compiler": compiler,
            "cmake_cuda_libraries": {k: v for k, v in values.items()
                                     if k.startswith("CUDA_") and k.endswith("_LIBRARY") and not v.endswith("NOTFOUND")}}
