"""The CUDA toolchains of a build: NVIDIA's CUDA 13 packages from PyPI made into a build-only
toolkit, or a system CUDA 12 toolkit with NVIDIA's CUDA 12 runtime wheels.

Either way the runtime wheels the build links (cudart, cuBLAS) are recorded with the sha256 and
size of the very files used and the URL the package index publishes them at (:mod:`.pypi_index`):
the manifest's ``cuda_libs``. :mod:`.cuda_isolation` keeps every other toolkit out of the build.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..artifacts.errors import OfflineError
from ..errors import Action
from ..events import ProgressCallback, ProgressEvent, null_progress
from ..fsio import write_text
from ..settings import Settings, Timeouts
from ..subprocesses import run_logged
from .build_cache import build_lock, sha256_file, write_json
from .cuda_isolation import CudaToolchain, exe_name, other_toolkits
from .errors import BuildError, BuildTimeout, CudaToolkitMissing
from .pypi_index import published_url
from .variants import (
    CUDA12_HINT,
    CUDA12_RUNTIME,
    CUDA13_RUNTIME,
    CUDA13_TOOLCHAIN,
    CUDA13_VERSION,
    DEFAULT_TOOLCHAIN_HINT,
    TOOLKIT_ROOTS,
    CudaToolkit,
    find_cuda_toolkit,
    nvcc_version,
)

__all__ = ["CudaToolchain", "cuda12_toolchain", "cuda13_toolchain", "driver_stub", "require_cuda_toolkit"]


def require_cuda_toolkit(major: int, env: Mapping[str, str], roots: Sequence[Path] = TOOLKIT_ROOTS) -> CudaToolkit:
    """The system's CUDA ``major`` toolkit (searched where ``env``, ``Settings.cuda_env``, points and
    under ``roots``), or :class:`CudaToolkitMissing` saying what was found instead."""
    kit, others = find_cuda_toolkit(major, env, roots)
    if kit is not None:
        return kit
    seen = f" (found instead: {'; '.join(others)})" if others else " (no nvcc in CUDA_HOME, CUDA_PATH, PATH or /usr/local/cuda*)"
    raise CudaToolkitMissing(f"cannot build the cuda{major} variant here: it needs a CUDA {major} toolkit "
                             f"(nvcc {major}.x), and none was found{seen}", hint=CUDA12_HINT if major == 12 else "",
                             action=Action.INSTALL_TOOLCHAIN)


def _toolchain_dir(cache: Path, version: str, packages: Mapping[str, str]) -> Path:
    material = json.dumps({"packages": dict(packages), "python": list(sys.version_info[:2]),
                           "machine": platform.machine(), "system": platform.system()}, sort_keys=True)
    return Path(cache) / "toolchains" / f"cuda-{version}-{hashlib.sha256(material.encode()).hexdigest()[:12]}"


def cuda13_toolchain(settings: Settings, progress: ProgressCallback = null_progress, *,
                     packages: Optional[Mapping[str, str]] = None) -> CudaToolchain:
    """NVIDIA's CUDA 13 toolchain from PyPI in a build-only virtual environment under the build
    cache (``toolchains/cuda-13.0-<hash of the package versions>``), made once and reused.

    The wheels are downloaded with pip (its configured index), installed into the environment
    without network, and made a toolkit CMake can use: the unversioned library names a linker
    looks for, and a stub ``libcuda.so`` generated from the toolkit's own ``cuda.h`` (the real one
    comes with the driver at run time). The runtime wheels (cudart, cuBLAS) are recorded with the
    sha256 and size of the downloaded files and their URL on the package index
    (``settings.index_url``, else PyPI). pip runs within ``settings.timeouts``.
    """
    pins = dict(packages or CUDA13_TOOLCHAIN)
    where = _toolchain_dir(settings.build_cache, CUDA13_VERSION, pins)
    stamp = where / "toolchain.json"
    where.parent.mkdir(parents=True, exist_ok=True)
    with build_lock(Path(str(where) + ".lock"), "cuda toolchain", progress):
        made = _read_toolchain(stamp)
        if made is None and settings.offline:
            raise OfflineError(f"offline mode: a local cuda build needs NVIDIA's CUDA {CUDA13_VERSION} toolchain from "
                               f"PyPI, which is not in the build cache ({where})",
                               "install from an offline bundle made on a machine with network access "
                               "(`accelstack bundle create`), or run once without --offline to download it")
        if made is None:
            made = _make_cuda13_toolchain(where, pins, progress, settings.timeouts, settings.index_url)
            write_json(stamp, made)
    root = Path(made["root"])
    kit = CudaToolkit(nvcc=str(root / "bin" / exe_name("nvcc")), root=str(root), version=CUDA13_VERSION,
                      source=f"PyPI packages in {where / 'venv'}")
    hidden = other_toolkits(root, settings.cuda_env)
    return CudaToolchain(kit=kit, cmake_args=_cuda_cmake_paths(kit, hidden), runtime=list(made["runtime"]),
                         hidden=hidden, packages=pins, tools=dict(made.get("tools", {})))


def _read_toolchain(stamp: Path) -> Optional[Dict[str, Any]]:
    """A finished toolchain's record, if its compiler is still there."""
    try:
        made = json.loads(stamp.read_text())
        if (Path(made["root"]) / "bin" / exe_name("nvcc")).is_file() and isinstance(made.get("runtime"), list):
            return dict(made)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _make_cuda13_toolchain(where: Path, pins: Mapping[str, str], progress: ProgressCallback,
                           timeouts: Timeouts, index_url: Optional[str]) -> Dict[str, Any]:
    limit = timeouts.pip
    wheels = where / "wheels"
    venv = where / "venv"
    shutil.rmtree(venv, ignore_errors=True)  # a half-made one of an interrupted run
    task = "CUDA 13 toolchain"
    progress(ProgressEvent("start", "build", task=task,
                           message=f"downloading NVIDIA's CUDA {CUDA13_VERSION} toolchain from PyPI into {where}"))
    ok = False
    try:
        specs = [f"{name}=={version}" for name, version in sorted(pins.items())]
        _pip(["download", "--no-deps", "--only-binary", ":all:", "-d", str(wheels)] + specs,
             where / "download.log", limit, "downloading the CUDA 13 toolchain packages")
        files = {name: _wheel_of(wheels, name, version) for name, version in pins.items()}
        outcome = run_logged([sys.executable, "-m", "venv", str(venv)], log_path=where / "venv.log",
                             timeout=timeouts.venv)
        if outcome.returncode != 0 or outcome.timed_out:
            raise BuildError(f"could not create the toolchain's virtual environment {venv}: {outcome.tail(4)}",
                             hint=f"the full output is in {outcome.log}", log=outcome.log)
        python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
        _pip(["install", "--no-index", "--no-deps", *map(str, files.values())], where / "install.log", limit,
             "installing the CUDA 13 toolchain packages", python=str(python))
        root = _venv_toolkit_root(venv)
        _complete_toolkit(root)
        runtime = [_runtime_record(files[name], name, pins[name], index_url) for name in CUDA13_RUNTIME if name in pins]
        tools = {t: str(root / "bin" / exe_name(t)) for t in ("cuobjdump", "nvdisasm") if (root / "bin" / exe_name(t)).is_file()}
        version = nvcc_version(str(root / "bin" / exe_name("nvcc")))
        if version != CUDA13_VERSION:
            raise BuildError(f"the CUDA toolchain in {venv} reports version {version}, not {CUDA13_VERSION}",
                             hint="delete the folder and build again", action=Action.RETRY)
        ok = True
        return {"root": str(root), "venv": str(venv), "packages": dict(pins), "runtime": runtime, "tools": tools}
    finally:
        progress(ProgressEvent("end", "build", task=task, ok=ok))


def _pip(args: List[str], log_path: Path, timeout: float, what: str, python: Optional[str] = None) -> None:
    cmd = [python or sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    outcome = run_logged(cmd, log_path=log_path, timeout=timeout)
    if outcome.timed_out:
        raise BuildTimeout(f"{what} did not finish within {timeout:.0f} s", hint="check the connection to the "
                           f"package index; the output so far is in {log_path}", action=Action.CHECK_NETWORK, log=log_path)
    if outcome.returncode != 0:
        raise BuildError(f"{what} failed (exit {outcome.returncode}): {outcome.tail(6)[-600:]}",
                         hint=f"check the connection to the package index; the full output is in {log_path}",
                         action=Action.CHECK_NETWORK, log=log_path)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _wheel_of(folder: Path, name: str, version: str) -> Path:
    """The downloaded wheel of ``name`` ``version`` in ``folder``."""
    prefix = f"{_norm(name)}-{version}-"
    found = sorted(p for p in Path(folder).glob("*.whl") if _norm(p.name.split("-", 1)[0]) + "-" +
                   p.name.split("-", 2)[1] + "-" == prefix)
    if not found:
        raise BuildError(f"pip did not leave a wheel of {name} {version} in {folder}", action=Action.RETRY)
    return found[-1]


def _venv_toolkit_root(venv: Path) -> Path:
    """Where NVIDIA's wheels put the toolkit in ``venv``: ``site-packages/nvidia/cu13``."""
    found = sorted(venv.glob("lib/python*/site-packages/nvidia/cu13")) + sorted(venv.glob("Lib/site-packages/nvidia/cu13"))
    if not found or not (found[0] / "bin" / exe_name("nvcc")).is_file():
        raise BuildError(f"no nvidia/cu13/bin/nvcc in {venv} after installing the toolchain packages",
                         hint="the package layout changed; report this", action=Action.REPORT_BUG)
    return found[0]


def _complete_toolkit(root: Path) -> None:
    """Make the wheels' files a toolkit CMake's FindCUDAToolkit accepts: the names a linker looks
    for (``libcudart.so`` -> ``libcudart.so.13``; wheels cannot carry links) and a stub driver
    library (``lib/stubs/libcuda.so``) to link against."""
    if os.name == "nt":
        return
    lib = root / "lib"
    if not (root / "lib64").exists():  # nvcc.profile links from lib64 (the wheels use lib)
        (root / "lib64").symlink_to("lib")
    for versioned in sorted(lib.glob("lib*.so.*")):  # the wheels' names say it: libcudart.so.13
        plain = lib / (versioned.name.split(".so.")[0] + ".so")
        if not plain.exists():
            plain.symlink_to(versioned.name)
    driver_stub(root / "include" / "cuda.h", lib / "stubs" / "libcuda.so")


_CU_FUNCTION = re.compile(r"\bCUresult\s+(?:CUDAAPI\s+)?(cu[A-Za-z0-9_]+)\s*\(")


def driver_stub(header: Path, dest: Path, compiler: Optional[str] = None) -> List[str]:
    """Write a stub ``libcuda.so`` (soname ``libcuda.so.1``) exporting every driver function
    ``header`` (a toolkit's cuda.h) declares, under the names its macros give them (cuMemAlloc ->
    cuMemAlloc_v2): a build links against it, the driver's library replaces it at run time.
    Returns the names. Every stub returns an error code; nothing ever calls them."""
    cc = compiler or shutil.which("cc") or shutil.which("c++")
    if cc is None:
        raise BuildError("no C compiler to make the CUDA driver stub", hint=DEFAULT_TOOLCHAIN_HINT,
                         action=Action.INSTALL_TOOLCHAIN)
    pre = subprocess.run([cc, "-E", "-P", "-x", "c", "-I", str(header.parent), str(header)], capture_output=True,
                         text=True, timeout=300, check=False)
    names = sorted(set(_CU_FUNCTION.findall(pre.stdout)))
    if pre.returncode != 0 or not names:
        raise BuildError(f"could not read the driver API from {header}: {pre.stderr.strip()[-400:]}",
                         action=Action.REPORT_BUG)
    dest.parent.mkdir(parents=True, exist_ok=True)
    source = dest.with_name("libcuda-stub.c")
    write_text(source, "".join(f"int {n}(void) {{ return 999; }}\n" for n in names), durable=False)
    done = subprocess.run([cc, "-x", "c", "-shared", "-fPIC", "-o", str(dest), "-Wl,-soname,libcuda.so.1", str(source)],
                          capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise BuildError(f"could not compile the CUDA driver stub: {done.stderr.strip()[-400:]}",
                         action=Action.INSTALL_TOOLCHAIN)
    return names


def _cuda_cmake_paths(kit: CudaToolkit, hidden: Sequence[str]) -> List[str]:
    args = [f"-DCMAKE_CUDA_COMPILER={kit.nvcc}"]
    if kit.root:
        args.append(f"-DCUDAToolkit_ROOT={kit.root}")
    if hidden:
        args.append(f"-DCMAKE_IGNORE_PREFIX_PATH={';'.join(hidden)}")
    return args


def _runtime_record(wheel: Path, name: str, version: str, index_url: Optional[str]) -> Dict[str, Any]:
    """The ``cuda_libs`` entry of a downloaded runtime wheel: its own sha256 and size, and the
    URL the package index publishes that very file at (matched by name and sha256)."""
    sha = sha256_file(wheel)
    return {"name": wheel.name, "version": version, "sha256": sha, "size": wheel.stat().st_size,
            "url": published_url(name, wheel.name, sha, index_url)}


def cuda12_toolchain(settings: Settings, kit: CudaToolkit, progress: ProgressCallback = null_progress) -> CudaToolchain:
    """A system CUDA 12 toolkit, and NVIDIA's CUDA 12 runtime wheels of its major.minor (the newest
    of that release on the index, downloaded once into the build cache) as the build's ``cuda_libs``."""
    where = settings.build_cache / "toolchains" / f"cuda-{kit.version}-runtime"
    stamp = where / "runtime.json"
    where.parent.mkdir(parents=True, exist_ok=True)
    with build_lock(Path(str(where) + ".lock"), "cuda12 runtime wheels", progress):
        try:
            runtime = json.loads(stamp.read_text())
            if not isinstance(runtime, list):
                raise ValueError("not a list")
        except (OSError, ValueError):
            limit = settings.timeouts.pip
            specs = [f"{name}=={kit.version}.*" for name in CUDA12_RUNTIME]
            _pip(["download", "--no-deps", "--only-binary", ":all:", "-d", str(where / "wheels")] + specs,
                 where / "download.log", limit, "downloading the CUDA 12 runtime wheels")
            runtime = []
            for name in CUDA12_RUNTIME:
                found = sorted((where / "wheels").glob(f"{_norm(name)}-{kit.version}.*.whl"))
                if not found:
                    raise BuildError(f"pip left no {name} {kit.version}.x wheel in {where / 'wheels'}", action=Action.RETRY)
                version = found[-1].name.split("-")[1]
                runtime.append(_runtime_record(found[-1], name, version, settings.index_url))
            write_json(stamp, runtime)
    hidden = other_toolkits(Path(kit.root) if kit.root else Path(kit.nvcc).parent.parent, settings.cuda_env)
    return CudaToolchain(kit=kit, cmake_args=_cuda_cmake_paths(kit, hidden), runtime=runtime, hidden=hidden)
