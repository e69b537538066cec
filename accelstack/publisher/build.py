"""Publisher side: compile stable-diffusion-cpp-python for one backend variant into a wheel.

The wheel is tagged ``py3-none-<platform>``: the bindings load the library with ctypes and never
link libpython, so one build serves every Python version the bindings support. Builds never use
``-march=native`` (they must run on other machines) and are cached by their inputs — the sdist's
sha256 plus the exact CMake options and platform — so a repeated build is a lookup.

This module runs a build; the cache slots are :mod:`.build_cache`, the lean packaging
:mod:`.wheel_repack`, the CUDA toolchains :mod:`.cuda_toolchain` and :mod:`.cuda_isolation`, the
variants' options :mod:`.variants`.
"""
from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import Action
from ..events import ProgressCallback, ProgressEvent, null_progress
from ..fsio import copy_file
from ..settings import Settings, inherited_env
from ..subprocesses import run_logged
from .build_cache import BuildResult, build_lock, cache_key, cached_sha256, make_slot, read_record, sha256_file, write_record
from .cuda_isolation import CudaToolchain, check_cuda_compiler, cuda_build_env
from .cuda_toolchain import cuda12_toolchain, cuda13_toolchain, require_cuda_toolkit
from .errors import BuildError, BuildTimeout
from .sdist import fetch_sdist, offline_source_error, sdist_name
from .variants import (
    CUDA13_TOOLCHAIN,
    CUDA13_VERSION,
    CUDA_VARIANTS,
    DEFAULT_TOOLCHAIN_HINT,
    LINUX_CMAKE_ARGS,
    TOOLCHAIN_HINTS,
    VARIANTS,
    VULKAN_HEADERS_HINT,
    CudaToolkit,
    configured_cuda_archs,
    cuda_cmake_args,
    cuda_targets,
    missing_toolchain,
    parse_cuda_archs,
    properties_for,
    vulkan_headers_ok,
)
from .wheel_repack import PACKAGING_VERSION, package_build

__all__ = ["COMPILE_TIMEOUT", "CUDA_COMPILE_TIMEOUT_PER_ARCH", "SYSTEM_INCLUDE", "VARIANTS", "build_ggml",
           "build_options", "compile_timeout_for", "vulkan_include_dir"]

log = logging.getLogger(__name__)

SYSTEM_INCLUDE = Path("/usr/include")  # where a distribution's libvulkan-dev puts the Vulkan headers
COMPILE_TIMEOUT = 3600.0  # seconds for one variant's compile (CUDA for many architectures is the slow one)
# A CUDA compile's limit grows with its architectures: ggml-cuda's files are compiled again for each one,
# and one (sm_90, CUDA 13) took 5656 s on 2 loaded cores here (docs/builds.md), past the 1 h default.
CUDA_COMPILE_TIMEOUT_PER_ARCH = 4 * 3600.0


def compile_timeout_for(variant: str, cuda_archs: Optional[Sequence[str]] = None, configured: str = "") -> float:
    """The default compile limit of ``variant``: COMPILE_TIMEOUT, and for a CUDA variant 4 h for each
    architecture it compiles (:func:`cuda_targets` of ``cuda_archs`` and ``configured``,
    ``Settings.cuda_archs``)."""
    if variant in CUDA_VARIANTS:
        return max(COMPILE_TIMEOUT, CUDA_COMPILE_TIMEOUT_PER_ARCH * len(cuda_targets(variant, cuda_archs, configured)))
    return COMPILE_TIMEOUT


_STEP = re.compile(r"^\[(?:(\d+)/(\d+)|\s*(\d+)%)\]")  # ninja "[12/51] ..." or make "[ 42%] Building ..."


def build_ggml(
    variant: str,
    settings: Settings,
    *,
    sdist: Optional[Path] = None,
    out_dir: Optional[Path] = None,
    extra_cmake_args: Optional[List[str]] = None,
    jobs: Optional[int] = None,
    progress: ProgressCallback = null_progress,
    compile_timeout: Optional[float] = None,
    cuda_archs: Optional[Sequence[str]] = None,
) -> BuildResult:
    """Build (or reuse) the wheel for ``variant`` in ``settings.build_cache``; copy it to ``out_dir`` if given.

    Without ``sdist`` the source is downloaded into ``<build cache>/sdist`` (within
    ``settings.timeouts.pip``). A compile past ``compile_timeout`` seconds (default
    :func:`compile_timeout_for`: 1 h, a CUDA build 4 h per architecture) is stopped with all its
    processes (:class:`BuildTimeout`). ``cuda_archs`` ("90", "86"; default ``settings.cuda_archs``,
    else every architecture the toolkit supports) narrows a CUDA build. The ``cuda`` variant
    compiles with NVIDIA's CUDA 13 packages from PyPI, installed into a virtual environment in the
    build cache (no system CUDA is used; the package index is ``settings.index_url``, else PyPI);
    ``cuda12`` needs a system CUDA 12 toolkit where ``settings.cuda_env`` points
    (:class:`CudaToolkitMissing` otherwise).
    An unknown variant is refused by :func:`build_options`, before anything is downloaded.
    """
    if compile_timeout is None:
        compile_timeout = compile_timeout_for(variant, cuda_archs, settings.cuda_archs)
    cache = settings.build_cache
    # a CUDA 12 build without a CUDA 12 toolkit (or with unreadable architectures) is refused
    # before the source is even downloaded
    system_kit = require_cuda_toolkit(12, settings.cuda_env) if variant == "cuda12" else None
    cmake_args, toolkit_key = build_options(variant, cuda_archs, extra_cmake_args, cuda_env=settings.cuda_env,
                                            system_kit=system_kit, configured=settings.cuda_archs)
    in_cache = sdist is None  # only files in the cache get a remembered digest beside them
    if sdist is None and settings.offline and not (cache / "sdist" / sdist_name()).is_file():
        raise offline_source_error(cache / "sdist")  # offline downloads nothing, the source included
    if sdist is None:
        sdist = fetch_sdist(cache / "sdist", progress=progress, timeout=settings.timeouts.pip)
    sdist = Path(sdist)
    if not sdist.is_file():
        raise BuildError(f"source distribution {sdist} does not exist",
                         hint="give the path of an existing stable_diffusion_cpp_python-*.tar.gz", action=Action.FIX_INPUT)
    if variant == "vulkan":
        cmake_args += _vulkan_header_args(cache, cmake_args)
    source_sha = cached_sha256(sdist) if in_cache else sha256_file(sdist)
    key = cache_key(source_sha, variant, cmake_args, toolkit_key)
    slot = make_slot(cache / key)  # marked: `cache purge builds` deletes only slots it finds the mark in
    with build_lock(Path(str(slot) + ".lock"), variant, progress):
        cached = read_record(slot / "build.json")
        if cached is not None and cached.packaging < PACKAGING_VERSION:
            log.info("repackaging the cached %s build %s (packaging %d -> %d)", variant, key, cached.packaging,
                     PACKAGING_VERSION)
            try:
                cached = package_build(cached, slot)
                write_record(slot / "build.json", cached, root=cache, cache_hit=False)
            except BuildError as exc:
                log.info("cannot repackage the cached %s build (%s); building again", variant, exc.message)
                cached = None
        if cached is not None:
            log.info("build cache hit for %s (key %s): %s", variant, key, cached.wheel)
            progress(ProgressEvent("message", "build", task=variant, message=f"reusing cached build {key}"))
            return _export(cached, out_dir)
        log.info("build cache miss for %s (key %s) in %s", variant, key, cache)
        missing = missing_toolchain(variant)
        if missing:
            raise BuildError(f"cannot build the {variant} variant here: {', '.join(missing)} not found",
                             hint=TOOLCHAIN_HINTS.get(variant, DEFAULT_TOOLCHAIN_HINT), action=Action.INSTALL_TOOLCHAIN)
        toolchain: Optional[CudaToolchain] = None
        if variant == "cuda":
            toolchain = cuda13_toolchain(settings, progress)  # offline: only one made before
        elif system_kit is not None:
            toolchain = cuda12_toolchain(settings, system_kit, progress)
        result = _compile(variant, sdist, source_sha, cmake_args, key, slot, jobs or os.cpu_count() or 2,
                          compile_timeout, progress, toolchain)
        result = package_build(result, slot)
        write_record(slot / "build.json", result, root=cache)
        return _export(result, out_dir)


def build_options(variant: str, cuda_archs: Optional[Sequence[str]] = None,
                  extra_cmake_args: Optional[Sequence[str]] = None, *, cuda_env: Mapping[str, str],
                  system_kit: Optional[CudaToolkit] = None,
                  configured: str = "") -> Tuple[List[str], Optional[Dict[str, Any]]]:
    """The (CMake options, toolkit key) a build of ``variant`` for ``cuda_archs`` uses: the inputs
    of its cache key besides the source. One function for :func:`build_ggml` and for whoever looks
    a build up without making it (an install's dry run), so the two cannot key a build differently.

    Reads only: nothing is downloaded. ``cuda12`` keys on the system CUDA 12 toolkit (``system_kit``,
    else the one :func:`require_cuda_toolkit` finds where ``cuda_env`` points: :class:`CudaToolkitMissing`
    without one); ``cuda`` on the pinned PyPI packages. A CUDA build without ``cuda_archs`` compiles
    what ``configured`` (``Settings.cuda_archs``) names, else every architecture. On Linux every
    variant adds ``LINUX_CMAKE_ARGS`` before ``extra_cmake_args`` (which win). A Vulkan build
    adds its header folder after this (``_vulkan_header_args``), which depends on what is
    installed. Bad architectures (or a bad ``ACCELSTACK_CUDA_ARCHS``) are a :class:`BuildError`."""
    if variant not in VARIANTS:
        raise BuildError(f"unknown backend variant {variant!r}", hint=f"choose one of: {', '.join(VARIANTS)}",
                         action=Action.FIX_INPUT)
    extra = (LINUX_CMAKE_ARGS if sys.platform.startswith("linux") else []) + list(extra_cmake_args or [])
    if variant not in CUDA_VARIANTS:
        return list(VARIANTS[variant]) + extra, None
    cmake_args = _cuda_args(variant, cuda_archs, configured) + extra
    if variant == "cuda12":
        kit = system_kit if system_kit is not None else require_cuda_toolkit(12, cuda_env)
        return cmake_args, {"cuda": kit.version, "nvcc": kit.nvcc}
    return cmake_args, {"cuda": CUDA13_VERSION, "packages": dict(CUDA13_TOOLCHAIN)}


def _cuda_args(variant: str, archs: Optional[Sequence[str]], configured: str = "") -> List[str]:
    """The CMake options of a CUDA build for ``archs`` (as the caller or ``configured``,
    ACCELSTACK_CUDA_ARCHS, spells them: "86", "sm_86", "8.6"; none: every architecture of the variant)."""
    try:
        chosen = parse_cuda_archs(",".join(archs), "cuda_archs") if archs else configured_cuda_archs(configured)
    except ValueError as exc:
        raise BuildError(str(exc), action=Action.FIX_INPUT) from None
    return cuda_cmake_args(variant, chosen)


def vulkan_include_dir(cache: Path) -> Optional[Path]:
    """The newest Vulkan headers extracted into ``<cache>/vulkan-headers/<version>/usr/include`` (by
    scripts/setup-vulkan.sh) that ggml-vulkan can compile against, or None."""
    def version(path: Path) -> List[int]:
        return [int(n) for n in re.findall(r"\d+", path.parents[1].name)]

    found = sorted((Path(cache) / "vulkan-headers").glob("*/usr/include"), key=version, reverse=True)
    return next((d for d in found if vulkan_headers_ok(d)), None)


def _vulkan_header_args(cache: Path, cmake_args: List[str]) -> List[str]:
    """``-DVulkan_INCLUDE_DIR`` for headers new enough for ggml-vulkan, unless the caller gave one or
    the system's own headers are new enough."""
    if any(arg.startswith("-DVulkan_INCLUDE_DIR=") for arg in cmake_args):
        return []
    found = vulkan_include_dir(cache)
    if found is not None:
        return [f"-DVulkan_INCLUDE_DIR={found}"]
    if vulkan_headers_ok(SYSTEM_INCLUDE) or sys.platform != "linux":
        return []  # the system's (or the Vulkan SDK's, found by CMake) headers
    raise BuildError("cannot build the vulkan variant here: the Vulkan headers are missing or older than 1.3.255 "
                     "(ggml-vulkan needs vk::LayerSettingEXT)", hint=VULKAN_HEADERS_HINT,
                     action=Action.INSTALL_TOOLCHAIN)


def _export(result: BuildResult, out_dir: Optional[Path]) -> BuildResult:
    if out_dir is None:
        return result
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dest = out / Path(result.wheel).name
    if not dest.is_file() or sha256_file(dest) != result.sha256:
        copy_file(result.wheel, dest)  # the copy appears whole, or not at all
    exported = BuildResult(**{**asdict(result), "wheel": str(dest)})
    write_record(out / f"{dest.name}.build.json", exported)
    log.info("exported %s to %s", result.variant, dest)
    return exported


def _compile(variant: str, sdist: Path, source_sha: str, cmake_args: List[str], key: str, slot: Path, jobs: int,
             timeout: float, progress: ProgressCallback, toolchain: Optional[CudaToolchain] = None) -> BuildResult:
    wheel_dir = Path(tempfile.mkdtemp(prefix="wheel-", dir=slot))
    given = cmake_args + (toolchain.cmake_args if toolchain else [])  # toolchain paths: not in the key
    base_env = cuda_build_env(inherited_env(), toolchain) if toolchain else inherited_env()
    env = {**base_env, "CMAKE_ARGS": " ".join(shlex.quote(a) for a in given), "CMAKE_BUILD_PARALLEL_LEVEL": str(jobs)}
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-v",
           "--config-settings=wheel.py-api=py3", "-w", str(wheel_dir), str(sdist)]
    build_dir = slot / "cmake-build"
    if toolchain is not None:  # kept to read back which compiler CMake used (then removed)
        shutil.rmtree(build_dir, ignore_errors=True)
        cmd.insert(-1, f"--config-settings=build-dir={build_dir}")
    log_path = slot / "build.log"

    def on_line(line: str) -> None:
        step = _STEP.match(line.strip())
        if step:
            done, total = (int(step.group(1)), int(step.group(2))) if step.group(2) else (int(step.group(3)), 100)
            progress(ProgressEvent("advance", "build", task=variant, done=done, total=total))

    log.info("compiling %s with %d jobs (time limit %.0f s): %s; log %s", variant, jobs, timeout,
             " ".join(cmake_args), log_path)
    progress(ProgressEvent("start", "build", task=variant, message=f"compiling {variant} ({' '.join(cmake_args)})"))
    try:
        outcome = run_logged(cmd, log_path=log_path, timeout=timeout, env=env, on_line=on_line)
        wheels = sorted(wheel_dir.glob("*.whl"))
        if outcome.timed_out or outcome.returncode != 0 or not wheels:
            progress(ProgressEvent("end", "build", task=variant, ok=False))
            log.info("building %s failed (%s); full log: %s", variant,
                     "time limit" if outcome.timed_out else f"exit {outcome.returncode}", log_path)
            if outcome.timed_out:
                raise BuildTimeout(f"building the {variant} variant did not finish within {timeout:.0f} s",
                                   hint=f"give the build more time or fewer targets; its output so far is in {log_path}",
                                   action=Action.RETRY, log=log_path)
            raise BuildError(f"building the {variant} variant failed (exit {outcome.returncode}); last lines:\n"
                             + outcome.tail(), hint=f"the full log is {log_path}", log=log_path)
        final = slot / wheels[0].name
        os.replace(wheels[0], final)
        used: Dict[str, Any] = {}
        if toolchain is not None:
            used = check_cuda_compiler(build_dir / "CMakeCache.txt", toolchain)
            shutil.copyfile(build_dir / "CMakeCache.txt", slot / "CMakeCache.txt")
    finally:
        shutil.rmtree(wheel_dir, ignore_errors=True)
        if toolchain is not None:
            shutil.rmtree(build_dir, ignore_errors=True)
    log.info("compiled %s in %.1f s: %s", variant, outcome.seconds, final)
    progress(ProgressEvent("end", "build", task=variant, ok=True, done=100, total=100))
    return BuildResult(
        variant=variant,
        wheel=str(final),
        sha256=cached_sha256(final),  # records the digest, so the first cache hit does not hash again
        size=final.stat().st_size,
        cmake_args=cmake_args,
        source_sha256=source_sha,
        key=key,
        properties=properties_for(variant, cmake_args, toolchain.kit.version if toolchain else ""),
        seconds=round(outcome.seconds, 1),
        platform_tag=final.name.rsplit("-", 1)[-1][: -len(".whl")],
        cuda_libs=[dict(lib) for lib in toolchain.runtime] if toolchain else [],
        toolchain={**toolchain.describe(), **used} if toolchain else {},
    )
