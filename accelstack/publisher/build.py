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
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional

from filelock import FileLock, Timeout

from ..artifacts.cache import hash_file
from ..errors import Action
from ..events import ProgressCallback, ProgressEvent, null_progress
from ..settings import Settings
from ..subprocesses import run_logged
from .errors import BuildError, BuildTimeout
from .sdist import fetch_sdist
from .variants import (
    DEFAULT_TOOLCHAIN_HINT,
    PROPERTIES,
    TOOLCHAIN_HINTS,
    VARIANTS,
    VULKAN_HEADERS_HINT,
    missing_toolchain,
    vulkan_headers_ok,
)

__all__ = [
    "BUILDER_VERSION", "COMPILE_TIMEOUT", "VARIANTS", "BuildError", "BuildResult", "BuildTimeout", "build_cache_dir",
    "PACKAGING_VERSION", "build_ggml", "cache_key", "cached_sha256", "lean_wheel", "missing_toolchain", "sha256_file",
    "vulkan_include_dir",
]

log = logging.getLogger(__name__)

BUILDER_VERSION = 1  # bump when the build recipe changes in a way the options do not show
# The packaging applied to a compiled wheel (lean_wheel). It is not part of the cache key: a newer
# packaging repackages a cached compile instead of compiling again.
PACKAGING_VERSION = 1
SYSTEM_INCLUDE = Path("/usr/include")  # where a distribution's libvulkan-dev puts the Vulkan headers
COMPILE_TIMEOUT = 3600.0  # seconds for one variant's compile (CUDA for many architectures is the slow one)
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


def cache_key(source_sha256: str, variant: str, cmake_args: List[str]) -> str:
    material = json.dumps(
        {"source": source_sha256, "variant": variant, "cmake": cmake_args, "builder": BUILDER_VERSION,
         "machine": platform.machine(), "system": platform.system()},
        sort_keys=True,
    )
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
    compile_timeout: float = COMPILE_TIMEOUT,
    download_timeout: Optional[float] = None,
) -> BuildResult:
    """Build (or reuse) the wheel for ``variant``; copy it to ``out_dir`` if given.

    ``cache_dir`` defaults to ``Settings.resolve().build_cache``; without ``sdist`` the source is
    downloaded into ``<cache_dir>/sdist`` (within ``download_timeout``). A compile past
    ``compile_timeout`` seconds is stopped with all its processes (:class:`BuildTimeout`).
    """
    if variant not in VARIANTS:
        raise BuildError(f"unknown backend variant {variant!r}", hint=f"choose one of: {', '.join(VARIANTS)}",
                         action=Action.FIX_INPUT)
    cache = Path(cache_dir) if cache_dir is not None else build_cache_dir()
    in_cache = sdist is None  # only files in the cache get a remembered digest beside them
    if sdist is None:
        sdist = fetch_sdist(cache / "sdist", progress=progress, timeout=download_timeout)
    sdist = Path(sdist)
    if not sdist.is_file():
        raise BuildError(f"source distribution {sdist} does not exist",
                         hint="give the path of an existing stable_diffusion_cpp_python-*.tar.gz", action=Action.FIX_INPUT)
    cmake_args = VARIANTS[variant] + list(extra_cmake_args or [])
    if variant == "vulkan":
        cmake_args += _vulkan_header_args(cache, cmake_args)
    source_sha = cached_sha256(sdist) if in_cache else sha256_file(sdist)
    key = cache_key(source_sha, variant, cmake_args)
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
        result = _compile(variant, sdist, source_sha, cmake_args, key, slot, jobs or os.cpu_count() or 2,
                          compile_timeout, progress)
        result = _package(result, slot)
        _write_json(slot / "build.json", asdict(result))
        return _export(result, out_dir)


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
             timeout: float, progress: ProgressCallback) -> BuildResult:
    wheel_dir = Path(tempfile.mkdtemp(prefix="wheel-", dir=slot))
    env = {**os.environ, "CMAKE_ARGS": " ".join(cmake_args), "CMAKE_BUILD_PARALLEL_LEVEL": str(jobs)}
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-v",
           "--config-settings=wheel.py-api=py3", "-w", str(wheel_dir), str(sdist)]
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
    finally:
        shutil.rmtree(wheel_dir, ignore_errors=True)
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
        properties=dict(PROPERTIES[variant]),
        seconds=round(outcome.seconds, 1),
        platform_tag=final.name.rsplit("-", 1)[-1][: -len(".whl")],
    )
