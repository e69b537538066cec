"""Publisher side: compile stable-diffusion-cpp-python for one backend variant into a wheel.

The wheel is tagged ``py3-none-<platform>``: the bindings load the library with ctypes and never
link libpython, so one build serves every Python version the bindings support. Builds never use
``-march=native`` (they must run on other machines) and are cached by their inputs — the sdist's
sha256 plus the exact CMake options and platform — so a repeated build is a lookup.
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from filelock import FileLock, Timeout

from ..artifacts.cache import hash_file
from ..errors import Action
from ..events import ProgressCallback, ProgressEvent, null_progress
from ..settings import Settings
from ..subprocesses import run_logged
from .errors import BuildError, BuildTimeout, CudaToolkitMissing
from .sdist import fetch_sdist
from .variants import (
    CUDA12_HINT,
    CUDA12_RUNTIME,
    CUDA13_RUNTIME,
    CUDA13_TOOLCHAIN,
    CUDA13_VERSION,
    CUDA_VARIANTS,
    DEFAULT_TOOLCHAIN_HINT,
    TOOLCHAIN_HINTS,
    TOOLKIT_ROOTS,
    VARIANTS,
    VULKAN_HEADERS_HINT,
    CudaToolkit,
    cuda_archs_from_env,
    cuda_cmake_args,
    cuda_targets,
    cuda_toolkit_candidates,
    find_cuda_toolkit,
    missing_toolchain,
    nvcc_version,
    parse_cuda_archs,
    properties_for,
    vulkan_headers_ok,
)

__all__ = [
    "BUILDER_VERSION", "COMPILE_TIMEOUT", "CUDA_COMPILE_TIMEOUT_PER_ARCH", "compile_timeout_for", "VARIANTS", "BuildError", "BuildResult", "BuildTimeout", "build_cache_dir",
    "PACKAGING_VERSION", "CudaToolchain", "build_ggml", "build_options", "cache_key", "cached_sha256", "cuda12_toolchain",
    "cuda13_toolchain", "cuda_build_env", "lean_wheel", "missing_toolchain", "published_url", "sha256_file",
    "vulkan_include_dir",
]

log = logging.getLogger(__name__)

BUILDER_VERSION = 1  # bump when the build recipe changes in a way the options do not show
# The packaging applied to a compiled wheel (lean_wheel). It is not part of the cache key: a newer
# packaging repackages a cached compile instead of compiling again.
PACKAGING_VERSION = 1
SYSTEM_INCLUDE = Path("/usr/include")  # where a distribution's libvulkan-dev puts the Vulkan headers
COMPILE_TIMEOUT = 3600.0  # seconds for one variant's compile (CUDA for many architectures is the slow one)
# A CUDA compile's limit grows with its architectures: ggml-cuda's files are compiled again for each one,
# and one (sm_90, CUDA 13) took 5656 s on 2 loaded cores here (docs/builds.md), past the 1 h default.
CUDA_COMPILE_TIMEOUT_PER_ARCH = 4 * 3600.0


def compile_timeout_for(variant: str, cuda_archs: Optional[Sequence[str]] = None) -> float:
    """The default compile limit of ``variant``: COMPILE_TIMEOUT, and for a CUDA variant 4 h for each
    architecture it compiles (:func:`cuda_targets`)."""
    if variant in CUDA_VARIANTS:
        return max(COMPILE_TIMEOUT, CUDA_COMPILE_TIMEOUT_PER_ARCH * len(cuda_targets(variant, cuda_archs)))
    return COMPILE_TIMEOUT

_STEP = re.compile(r"^\[(?:(\d+)/(\d+)|\s*(\d+)%)\]")  # ninja "[12/51] ..." or make "[ 42%] Building ..."


@dataclass
class BuildResult:
    variant: str
    wheel: str  # path of the wheel in the cache (or in out_dir when one was given)
    sha256: str
    size: int
    cmake_args: List[str]
    source_sha256: str
    key: str
    properties: Dict[str, object] = field(default_factory=dict)
    cache_hit: bool = False
    seconds: float = 0.0
    platform_tag: str = ""
    installed_size: int = 0  # bytes the wheel's files take once installed (its uncompressed contents)
    packaging: int = 0  # PACKAGING_VERSION that made ``wheel`` (0: the wheel as the compile left it)
    compiled_wheel: str = ""  # the wheel as compiled, before packaging (in the cache slot)
    # NVIDIA runtime wheels a CUDA build links but does not carry: {name, version, sha256, size, url}
    # of the exact files its toolchain used (the manifest's cuda_libs)
    cuda_libs: List[Dict[str, Any]] = field(default_factory=list)
    toolchain: Dict[str, Any] = field(default_factory=dict)  # CUDA: the nvcc used, its version, its packages


def build_cache_dir() -> Path:
    """The build cache of the current settings (``Settings.resolve().build_cache``)."""
    return Settings.resolve().build_cache


def sha256_file(path: Path) -> str:
    return hash_file(path).hexdigest()


def cached_sha256(path: Path) -> str:
    """sha256 of a build-cache file, remembered in ``<file>.sha256`` with its size and mtime.

    A cache hit is on the path of every install that builds locally; re-hashing the 20 MB source
    and the 19 MB wheel each time would dominate a no-op run.
    """
    st = path.stat()
    stamp = f"{st.st_size} {st.st_mtime_ns}"
    side = path.with_name(path.name + ".sha256")
    try:
        digest, seen = side.read_text().split(" ", 1)
        if seen.strip() == stamp and len(digest) == 64:
            return digest
    except (OSError, ValueError):
        pass
    digest = sha256_file(path)
    try:
        side.write_text(f"{digest} {stamp}\n")
    except OSError:
        pass  # a read-only cache still works, only slower
    return digest


def cache_key(source_sha256: str, variant: str, cmake_args: List[str],
              toolchain: Optional[Mapping[str, Any]] = None) -> str:
    """The build slot of a source, variant and options; ``toolchain`` (a CUDA build's compiler
    and package versions) joins the key only when given, so other variants' keys stay as they were."""
    facts: Dict[str, Any] = {"source": source_sha256, "variant": variant, "cmake": cmake_args,
                             "builder": BUILDER_VERSION, "machine": platform.machine(), "system": platform.system()}
    if toolchain:
        facts["toolchain"] = dict(toolchain)
    material = json.dumps(facts, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()[:20]


def build_ggml(
    variant: str = "cpu",
    sdist: Optional[Path] = None,
    out_dir: Optional[Path] = None,
    cache_dir: Optional[Path] = None,
    extra_cmake_args: Optional[List[str]] = None,
    jobs: Optional[int] = None,
    progress: ProgressCallback = null_progress,
    *,
    compile_timeout: Optional[float] = None,
    download_timeout: Optional[float] = None,
    cuda_archs: Optional[Sequence[str]] = None,
) -> BuildResult:
    """Build (or reuse) the wheel for ``variant``; copy it to ``out_dir`` if given.

    ``cache_dir`` defaults to ``Settings.resolve().build_cache``; without ``sdist`` the source is
    downloaded into ``<cache_dir>/sdist`` (within ``download_timeout``). A compile past
    ``compile_timeout`` seconds (default :func:`compile_timeout_for`: 1 h, a CUDA build 4 h per
    architecture) is stopped with all its processes (:class:`BuildTimeout`).
    ``cuda_archs`` ("90", "86"; default ``ACCELSTACK_CUDA_ARCHS``, else every architecture the
    toolkit supports) narrows a CUDA build. The ``cuda`` variant compiles with NVIDIA's CUDA 13
    packages from PyPI, installed into a virtual environment in the build cache (no system CUDA
    is used); ``cuda12`` needs a system CUDA 12 toolkit (:class:`CudaToolkitMissing` otherwise).
    An unknown variant is refused by :func:`build_options`, before anything is downloaded.
    """
    if compile_timeout is None:
        compile_timeout = compile_timeout_for(variant, cuda_archs)
    cache = Path(cache_dir) if cache_dir is not None else build_cache_dir()
    # a CUDA 12 build without a CUDA 12 toolkit (or with unreadable architectures) is refused
    # before the source is even downloaded
    system_kit = require_cuda_toolkit(12) if variant == "cuda12" else None
    cmake_args, toolkit_key = build_options(variant, cuda_archs, extra_cmake_args, system_kit=system_kit)
    in_cache = sdist is None  # only files in the cache get a remembered digest beside them
    if sdist is None:
        sdist = fetch_sdist(cache / "sdist", progress=progress, timeout=download_timeout)
    sdist = Path(sdist)
    if not sdist.is_file():
        raise BuildError(f"source distribution {sdist} does not exist",
                         hint="give the path of an existing stable_diffusion_cpp_python-*.tar.gz", action=Action.FIX_INPUT)
    if variant == "vulkan":
        cmake_args += _vulkan_header_args(cache, cmake_args)
    source_sha = cached_sha256(sdist) if in_cache else sha256_file(sdist)
    key = cache_key(source_sha, variant, cmake_args, toolkit_key)
    slot = cache / key
    slot.mkdir(parents=True, exist_ok=True)
    with build_lock(Path(str(slot) + ".lock"), variant, progress):
        cached = _cached_result(slot / "build.json")
        if cached is not None and cached.packaging < PACKAGING_VERSION:
            log.info("repackaging the cached %s build %s (packaging %d -> %d)", variant, key, cached.packaging,
                     PACKAGING_VERSION)
            try:
                cached = _package(cached, slot)
                _write_json(slot / "build.json", {**asdict(cached), "cache_hit": False})
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
            toolchain = cuda13_toolchain(cache, progress, timeout=download_timeout)
        elif system_kit is not None:
            toolchain = cuda12_toolchain(cache, system_kit, progress, timeout=download_timeout)
        result = _compile(variant, sdist, source_sha, cmake_args, key, slot, jobs or os.cpu_count() or 2,
                          compile_timeout, progress, toolchain)
        result = _package(result, slot)
        _write_json(slot / "build.json", asdict(result))
        return _export(result, out_dir)


def build_options(variant: str, cuda_archs: Optional[Sequence[str]] = None,
                  extra_cmake_args: Optional[Sequence[str]] = None, *,
                  system_kit: Optional[CudaToolkit] = None) -> Tuple[List[str], Optional[Dict[str, Any]]]:
    """The (CMake options, toolkit key) a build of ``variant`` for ``cuda_archs`` uses: the inputs
    of its cache key besides the source. One function for :func:`build_ggml` and for whoever looks
    a build up without making it (an install's dry run), so the two cannot key a build differently.

    Reads only: nothing is downloaded. ``cuda12`` keys on the system CUDA 12 toolkit (``system_kit``,
    else the one :func:`require_cuda_toolkit` finds: :class:`CudaToolkitMissing` without one);
    ``cuda`` on the pinned PyPI packages. A Vulkan build adds its header folder after this
    (``_vulkan_header_args``), which depends on what is installed. Bad architectures (or a bad
    ``ACCELSTACK_CUDA_ARCHS``) are a :class:`BuildError`."""
    if variant not in VARIANTS:
        raise BuildError(f"unknown backend variant {variant!r}", hint=f"choose one of: {', '.join(VARIANTS)}",
                         action=Action.FIX_INPUT)
    extra = list(extra_cmake_args or [])
    if variant not in CUDA_VARIANTS:
        return list(VARIANTS[variant]) + extra, None
    cmake_args = _cuda_args(variant, cuda_archs) + extra
    if variant == "cuda12":
        kit = system_kit if system_kit is not None else require_cuda_toolkit(12)
        return cmake_args, {"cuda": kit.version, "nvcc": kit.nvcc}
    return cmake_args, {"cuda": CUDA13_VERSION, "packages": dict(CUDA13_TOOLCHAIN)}


@contextlib.contextmanager
def build_lock(path: Path, variant: str, progress: ProgressCallback = null_progress,
               poll: float = 1.0) -> Iterator[None]:
    """Hold the build slot's lock. When another process holds it (another accelstack building the
    same variant), say so and tick every ``poll`` seconds until it is free: a wait of minutes
    must not look like a hang."""
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        task = f"waiting for the {variant} build lock"
        said = f"waiting for another accelstack build of {variant} (lock {path})"
        log.info("%s", said)
        progress(ProgressEvent("message", "build", task=variant, message=said))
        progress(ProgressEvent("start", "build", task=task, message=said))
        start = time.monotonic()
        try:
            while True:
                try:
                    lock.acquire(timeout=poll)
                    break
                except Timeout:
                    progress(ProgressEvent("advance", "build", task=task, message=said,
                                           extra={"elapsed": round(time.monotonic() - start, 1), "lock": str(path)}))
        except BaseException:
            progress(ProgressEvent("end", "build", task=task, ok=False, message="stopped waiting for the build lock"))
            raise
        waited = time.monotonic() - start
        log.info("got the %s build lock after %.1f s", variant, waited)
        progress(ProgressEvent("end", "build", task=task, ok=True,
                               message=f"the other build of {variant} finished after {waited:.0f} s of waiting"))
    try:
        yield
    finally:
        lock.release()


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


def _package(result: BuildResult, slot: Path) -> BuildResult:
    """The lean wheel of a compiled one (see :func:`lean_wheel`), kept beside it in the cache slot."""
    compiled = Path(result.compiled_wheel or result.wheel)
    dest = slot / f"lean{PACKAGING_VERSION}" / compiled.name
    installed = lean_wheel(compiled, dest)
    log.info("packaged %s: %.1f MB wheel -> %.1f MB, %.1f MB installed", result.variant, compiled.stat().st_size / 1e6,
             dest.stat().st_size / 1e6, installed / 1e6)
    return BuildResult(**{**asdict(result), "wheel": str(dest), "sha256": cached_sha256(dest),
                          "size": dest.stat().st_size, "installed_size": installed, "packaging": PACKAGING_VERSION,
                          "compiled_wheel": str(compiled)})


_INSTALL_TREE = ("include/", "lib/cmake/", "lib/pkgconfig/", "bin/")  # CMake's install tree at the wheel root


def lean_wheel(src: Path, dest: Path) -> int:
    """Write ``src`` without what a runtime never loads; return the bytes its files take installed.

    scikit-build-core puts CMake's whole install tree into the bindings' wheel beside the package:
    headers, CMake package files, ggml's static archives and a second copy of every shared
    library (the bindings load theirs from ``<package>/lib``). Each shared library is kept once
    (the package's copy), no static archive, no header, and symbols are stripped where ``strip``
    exists. RECORD is rewritten; entry times are kept, so the same input gives the same bytes.
    """
    try:
        return _lean_wheel(src, dest)
    except (zipfile.BadZipFile, StopIteration) as exc:
        raise BuildError(f"{src} is not a wheel with a RECORD ({exc or 'no RECORD'})",
                         hint="delete it from the build cache and build again", action=Action.RETRY) from exc


def _lean_wheel(src: Path, dest: Path) -> int:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    with zipfile.ZipFile(src) as zin:
        infos = [i for i in zin.infolist() if not i.is_dir()]
        in_package = {Path(i.filename).name for i in infos if "/" in i.filename and _is_package_file(i.filename)}
        kept: List[zipfile.ZipInfo] = []
        for info in infos:
            name = info.filename
            if name.endswith(".dist-info/RECORD"):
                continue
            if name.endswith(".a") or name.startswith(_INSTALL_TREE):
                continue
            if not _is_package_file(name) and _is_shared_library(name) and Path(name).name in in_package:
                continue  # the install tree's copy of a library the package carries
            if is_nvidia_runtime(name):
                continue  # NVIDIA's own libraries come from their wheels (the manifest's cuda_libs)
            kept.append(info)
        record_name = next(i.filename for i in infos if i.filename.endswith(".dist-info/RECORD"))
        rows: List[str] = []
        installed = 0
        with tempfile.TemporaryDirectory(prefix="lean-") as work, \
                zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zout:
            for info in kept:
                data = zin.read(info)
                if _is_shared_library(info.filename) and data[:4] == b"\x7fELF":
                    data = _stripped(data, Path(work))
                out = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                out.external_attr = info.external_attr
                out.compress_type = zipfile.ZIP_DEFLATED
                zout.writestr(out, data)
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                rows.append(f"{info.filename},sha256={digest},{len(data)}")
                installed += len(data)
            record = ("\n".join(rows + [f"{record_name},,"]) + "\n").encode()
            out = zipfile.ZipInfo(record_name, date_time=zin.getinfo(record_name).date_time)
            out.external_attr = zin.getinfo(record_name).external_attr
            out.compress_type = zipfile.ZIP_DEFLATED
            zout.writestr(out, record)
            installed += len(record)
    os.replace(tmp, dest)
    return installed


# NVIDIA's runtime libraries a CUDA build links: loaded from NVIDIA's wheels, never carried.
_NVIDIA_RUNTIME = re.compile(r"^(lib)?(cudart|cublas|cublasLt|nvblas|nvrtc|nvJitLink|cudadevrt|cuda)"
                             r"((64)?_\d+)?(_static)?\.(so(\.\d+)*|dll|a|lib)$", re.IGNORECASE)


def is_nvidia_runtime(name: str) -> bool:
    """Whether a wheel entry is one of NVIDIA's runtime libraries (libcudart.so.13, cublas64_12.dll,
    the driver's libcuda.so.1) rather than the build's own."""
    return _NVIDIA_RUNTIME.match(Path(name).name) is not None


def _is_package_file(name: str) -> bool:
    """A file of an importable package or of the wheel's metadata (not CMake's install tree)."""
    return "/" in name and name.split("/", 1)[0] not in ("lib", "include", "bin", "share")


def _is_shared_library(name: str) -> bool:
    base = Path(name).name
    return base.endswith((".so", ".dylib", ".dll")) or ".so." in base


def _stripped(data: bytes, work: Path) -> bytes:
    """``data`` (an ELF shared library) without symbols a loader does not need; as is without ``strip``."""
    tool = shutil.which("strip")
    if tool is None:
        return data
    path = work / "lib.so"
    path.write_bytes(data)
    try:
        done = subprocess.run([tool, "--strip-unneeded", str(path)], capture_output=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.info("strip failed (%s); keeping the library's symbols", exc)
        return data
    if done.returncode != 0:
        log.info("strip failed (%s); keeping the library's symbols", done.stderr.decode(errors="replace").strip())
        return data
    return path.read_bytes()


def _cached_result(record: Path) -> Optional[BuildResult]:
    """The recorded build in a cache slot, if its wheel is still there and intact."""
    if not record.is_file():
        return None
    try:
        result = BuildResult(**json.loads(record.read_text()))
    except (OSError, ValueError, TypeError) as exc:
        log.info("ignoring unreadable build record %s (%s)", record, exc)
        return None
    wheel = Path(result.wheel)
    if not wheel.is_file() or cached_sha256(wheel) != result.sha256:
        log.info("cached wheel %s is missing or changed; building again", wheel)
        return None
    result.cache_hit = True
    return result


def _write_json(path: Path, data: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def _export(result: BuildResult, out_dir: Optional[Path]) -> BuildResult:
    if out_dir is None:
        return result
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dest = out / Path(result.wheel).name
    if not dest.is_file() or sha256_file(dest) != result.sha256:
        tmp = dest.with_suffix(".tmp")
        shutil.copyfile(result.wheel, tmp)
        os.replace(tmp, dest)
    exported = BuildResult(**{**asdict(result), "wheel": str(dest)})
    _write_json(out / f"{dest.name}.build.json", asdict(exported))
    log.info("exported %s to %s", result.variant, dest)
    return exported


def _compile(variant: str, sdist: Path, source_sha: str, cmake_args: List[str], key: str, slot: Path, jobs: int,
             timeout: float, progress: ProgressCallback, toolchain: Optional[CudaToolchain] = None) -> BuildResult:
    wheel_dir = Path(tempfile.mkdtemp(prefix="wheel-", dir=slot))
    given = cmake_args + (toolchain.cmake_args if toolchain else [])  # toolchain paths: not in the key
    base_env = cuda_build_env(os.environ, toolchain) if toolchain else dict(os.environ)
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



# -- CUDA toolchains ------------------------------------------------------------------------------

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


def _cuda_args(variant: str, archs: Optional[Sequence[str]]) -> List[str]:
    """The CMake options of a CUDA build for ``archs`` (as the caller or ACCELSTACK_CUDA_ARCHS spells
    them: "86", "sm_86", "8.6"; none: every architecture of the variant)."""
    try:
        chosen = parse_cuda_archs(",".join(archs), "cuda_archs") if archs else cuda_archs_from_env()
    except ValueError as exc:
        raise BuildError(str(exc), action=Action.FIX_INPUT) from None
    return cuda_cmake_args(variant, chosen)


def require_cuda_toolkit(major: int, env: Optional[Mapping[str, str]] = None,
                         roots: Sequence[Path] = TOOLKIT_ROOTS) -> CudaToolkit:
    """The system's CUDA ``major`` toolkit, or :class:`CudaToolkitMissing` saying what was found instead."""
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


def cuda13_toolchain(cache: Path, progress: ProgressCallback = null_progress, *, timeout: Optional[float] = None,
                     packages: Optional[Mapping[str, str]] = None, index_url: Optional[str] = None) -> CudaToolchain:
    """NVIDIA's CUDA 13 toolchain from PyPI in a build-only virtual environment under ``cache``
    (``toolchains/cuda-13.0-<hash of the package versions>``), made once and reused.

    The wheels are downloaded with pip (its configured index), installed into the environment
    without network, and made a toolkit CMake can use: the unversioned library names a linker
    looks for, and a stub ``libcuda.so`` generated from the toolkit's own ``cuda.h`` (the real one
    comes with the driver at run time). The runtime wheels (cudart, cuBLAS) are recorded with the
    sha256 and size of the downloaded files and their URL on the package index.
    """
    pins = dict(packages or CUDA13_TOOLCHAIN)
    where = _toolchain_dir(cache, CUDA13_VERSION, pins)
    stamp = where / "toolchain.json"
    where.parent.mkdir(parents=True, exist_ok=True)
    with build_lock(Path(str(where) + ".lock"), "cuda toolchain", progress):
        made = _read_toolchain(stamp)
        if made is None:
            made = _make_cuda13_toolchain(where, pins, progress, timeout, index_url)
            _write_json(stamp, made)
    root = Path(made["root"])
    kit = CudaToolkit(nvcc=str(root / "bin" / _exe("nvcc")), root=str(root), version=CUDA13_VERSION,
                      source=f"PyPI packages in {where / 'venv'}")
    hidden = _other_toolkits(root)
    return CudaToolchain(kit=kit, cmake_args=_cuda_cmake_paths(kit, hidden), runtime=list(made["runtime"]),
                         hidden=hidden, packages=pins, tools=dict(made.get("tools", {})))


def _exe(name: str) -> str:
    return name + ".exe" if os.name == "nt" else name


def _read_toolchain(stamp: Path) -> Optional[Dict[str, Any]]:
    """A finished toolchain's record, if its compiler is still there."""
    try:
        made = json.loads(stamp.read_text())
        if (Path(made["root"]) / "bin" / _exe("nvcc")).is_file() and isinstance(made.get("runtime"), list):
            return dict(made)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _make_cuda13_toolchain(where: Path, pins: Mapping[str, str], progress: ProgressCallback,
                           timeout: Optional[float], index_url: Optional[str]) -> Dict[str, Any]:
    limit = Settings.resolve().timeouts.pip if timeout is None else timeout
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
                             timeout=Settings.resolve().timeouts.venv)
        if outcome.returncode != 0 or outcome.timed_out:
            raise BuildError(f"could not create the toolchain's virtual environment {venv}: {outcome.tail(4)}",
                             hint=f"the full output is in {outcome.log}", log=outcome.log)
        python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
        _pip(["install", "--no-index", "--no-deps", *map(str, files.values())], where / "install.log", limit,
             "installing the CUDA 13 toolchain packages", python=str(python))
        root = _venv_toolkit_root(venv)
        _complete_toolkit(root)
        runtime = [_runtime_record(files[name], name, pins[name], index_url) for name in CUDA13_RUNTIME if name in pins]
        tools = {t: str(root / "bin" / _exe(t)) for t in ("cuobjdump", "nvdisasm") if (root / "bin" / _exe(t)).is_file()}
        version = nvcc_version(str(root / "bin" / _exe("nvcc")))
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
    if not found or not (found[0] / "bin" / _exe("nvcc")).is_file():
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
    source.write_text("".join(f"int {n}(void) {{ return 999; }}\n" for n in names))
    done = subprocess.run([cc, "-x", "c", "-shared", "-fPIC", "-o", str(dest), "-Wl,-soname,libcuda.so.1", str(source)],
                          capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise BuildError(f"could not compile the CUDA driver stub: {done.stderr.strip()[-400:]}",
                         action=Action.INSTALL_TOOLCHAIN)
    return names


def _other_toolkits(root: Optional[Path] = None) -> List[str]:
    """This machine's CUDA toolkit folders other than ``root`` (what a PyPI build must not see)."""
    out: List[str] = []
    folders = [p for base in TOOLKIT_ROOTS if base.is_dir() for p in sorted(base.glob("cuda*"))]
    for _where, nvcc in cuda_toolkit_candidates():
        folders += [nvcc.parent.parent, nvcc.resolve().parent.parent]
    for folder in folders:
        if True:
            if (root is None or not _inside(folder, root)) and str(folder) not in out and folder != Path("/usr"):
                if (folder / "include" / "cuda_runtime.h").is_file() or folder.name.startswith("cuda"):
                    out.append(str(folder))
    return sorted(out)


def _inside(path: Path, root: Path) -> bool:
    try:
        Path(path).resolve().relative_to(Path(root).resolve())
        return True
    except ValueError:
        return False


def _cuda_cmake_paths(kit: CudaToolkit, hidden: Sequence[str]) -> List[str]:
    args = [f"-DCMAKE_CUDA_COMPILER={kit.nvcc}"]
    if kit.root:
        args.append(f"-DCUDAToolkit_ROOT={kit.root}")
    if hidden:
        args.append(f"-DCMAKE_IGNORE_PREFIX_PATH={';'.join(hidden)}")
    return args


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
        if _inside(p, own):
            return False
        if any(_inside(p, h) for h in hidden):
            return True
        nvcc = p / _exe("nvcc")
        return nvcc.is_file() and not _inside(nvcc.resolve(), own)

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
                    if k != "CMAKE_IGNORE_PREFIX_PATH" and any(_inside(Path(part), Path(h)) for part in v.split(";")
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


def _runtime_record(wheel: Path, name: str, version: str, index_url: Optional[str]) -> Dict[str, Any]:
    """The ``cuda_libs`` entry of a downloaded runtime wheel: its own sha256 and size, and the
    URL the package index publishes that very file at (matched by name and sha256)."""
    sha = sha256_file(wheel)
    return {"name": wheel.name, "version": version, "sha256": sha, "size": wheel.stat().st_size,
            "url": published_url(name, wheel.name, sha, index_url)}


PYPI_SIMPLE = "https://pypi.org/simple"


def published_url(package: str, filename: str, sha256: str, index_url: Optional[str] = None,
                  timeout: float = 60.0) -> str:
    """The URL the package index (``index_url``, else ``Settings.index_url``, else PyPI) serves
    ``filename`` at, read from its simple API page for ``package`` (PEP 691 JSON or PEP 503 HTML)
    and accepted only when the index's sha256 of it is ``sha256``: never a guessed address."""
    index = (index_url or Settings.resolve().index_url or PYPI_SIMPLE).rstrip("/")
    page = f"{index}/{re.sub(r'[-_.]+', '-', package).lower()}/"
    request = urllib.request.Request(page, headers={
        "Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.2"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (an index URL)
            body = response.read(64 * 1024 * 1024).decode("utf-8", errors="replace")
            kind = response.headers.get("Content-Type", "")
    except OSError as exc:
        raise BuildError(f"cannot read {page} to find where {filename} is published ({exc})",
                         hint="check the connection to the package index", action=Action.CHECK_NETWORK) from None
    for url, digest in _index_files(body, kind, page):
        if url.split("#", 1)[0].rsplit("/", 1)[-1] == filename:
            if digest != sha256:
                raise BuildError(f"{page} lists {filename} with sha256 {digest or 'unknown'}, but the file pip "
                                 f"downloaded has {sha256}", hint="the mirror pip used serves another file than "
                                 "the index: use one that matches", action=Action.FIX_INPUT)
            return url.split("#", 1)[0]
    raise BuildError(f"{page} does not list {filename}", hint="the wheel pip downloaded is not on the package index "
                     "(a local copy?); set ACCELSTACK_INDEX_URL to the index it comes from", action=Action.FIX_INPUT)


def _index_files(body: str, content_type: str, page: str) -> List[Tuple[str, str]]:
    """(absolute URL, sha256) of every file a simple-API page lists."""
    from urllib.parse import urljoin

    if "json" in content_type:
        try:
            doc = json.loads(body)
            return [(urljoin(page, str(f["url"])), str(f.get("hashes", {}).get("sha256", "")))
                    for f in doc.get("files", []) if isinstance(f, dict) and "url" in f]
        except (ValueError, KeyError, TypeError, AttributeError):
            return []
    out = []
    for href in re.findall(r'href="([^"]+)"', body):
        href = href.replace("&amp;", "&")
        digest = re.search(r"#sha256=([0-9a-f]{64})", href)
        out.append((urljoin(page, href), digest.group(1) if digest else ""))
    return out


def cuda12_toolchain(cache: Path, kit: CudaToolkit, progress: ProgressCallback = null_progress, *,
                     timeout: Optional[float] = None, index_url: Optional[str] = None) -> CudaToolchain:
    """A system CUDA 12 toolkit, and NVIDIA's CUDA 12 runtime wheels of its major.minor (the newest
    of that release on the index, downloaded once into ``cache``) as the build's ``cuda_libs``."""
    where = Path(cache) / "toolchains" / f"cuda-{kit.version}-runtime"
    stamp = where / "runtime.json"
    where.parent.mkdir(parents=True, exist_ok=True)
    with build_lock(Path(str(where) + ".lock"), "cuda12 runtime wheels", progress):
        try:
            runtime = json.loads(stamp.read_text())
            if not isinstance(runtime, list):
                raise ValueError("not a list")
        except (OSError, ValueError):
            limit = Settings.resolve().timeouts.pip if timeout is None else timeout
            specs = [f"{name}=={kit.version}.*" for name in CUDA12_RUNTIME]
            _pip(["download", "--no-deps", "--only-binary", ":all:", "-d", str(where / "wheels")] + specs,
                 where / "download.log", limit, "downloading the CUDA 12 runtime wheels")
            runtime = []
            for name in CUDA12_RUNTIME:
                found = sorted((where / "wheels").glob(f"{_norm(name)}-{kit.version}.*.whl"))
                if not found:
                    raise BuildError(f"pip left no {name} {kit.version}.x wheel in {where / 'wheels'}", action=Action.RETRY)
                version = found[-1].name.split("-")[1]
                runtime.append(_runtime_record(found[-1], name, version, index_url))
            _write_json(stamp, runtime)
    hidden = [h for h in _other_toolkits(Path(kit.root) if kit.root else Path(kit.nvcc).parent.parent)]
    return CudaToolchain(kit=kit, cmake_args=_cuda_cmake_paths(kit, hidden), runtime=runtime, hidden=hidden)
