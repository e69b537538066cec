"""Publisher side: compile stable-diffusion-cpp-python for one backend variant into a wheel.

The wheel is tagged ``py3-none-<platform>``: the bindings load the library with ctypes and never
link libpython, so one build serves every Python version the bindings support. Builds never use
``-march=native`` (they must run on other machines) and are cached by their inputs — the sdist's
sha256 plus the exact CMake options and platform — so a repeated build is a lookup.
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
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from ..errors import AccelstackError
from ..events import ProgressCallback, ProgressEvent, null_progress

SDIST_PACKAGE = "stable-diffusion-cpp-python"
SDIST_VERSION = "0.4.7"
BUILDER_VERSION = 1  # bump when the build recipe changes in a way the options do not show
_STEP = re.compile(r"^\[(?:(\d+)/(\d+)|\s*(\d+)%)\]")

# CMake options per backend variant. GGML_NATIVE=OFF keeps -march=native out; ggml then enables
# the x86-64-v3 set (AVX, AVX2, FMA, F16C, BMI2) unless told otherwise.
VARIANTS: Dict[str, List[str]] = {
    "cpu": ["-DGGML_NATIVE=OFF"],
    "cpu-noavx2": [
        "-DGGML_NATIVE=OFF", "-DGGML_AVX=OFF", "-DGGML_AVX2=OFF", "-DGGML_FMA=OFF",
        "-DGGML_F16C=OFF", "-DGGML_BMI2=OFF", "-DGGML_SSE42=ON",
    ],
    "cuda": ["-DGGML_NATIVE=OFF", "-DSD_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=61-virtual;70-virtual;75-virtual;80;86;89;90;120"],
    "vulkan": ["-DGGML_NATIVE=OFF", "-DSD_VULKAN=ON"],
    "rocm": ["-DGGML_NATIVE=OFF", "-DSD_HIPBLAS=ON", "-DGPU_TARGETS=gfx906;gfx908;gfx90a;gfx942;gfx1030;gfx1100;gfx1101;gfx1102;gfx1200;gfx1201"],
    "metal": ["-DSD_METAL=ON", "-DGGML_METAL_EMBED_LIBRARY=ON"],
}
# What each variant needs on the build machine, checked before a long build starts.
TOOLCHAINS: Dict[str, List[str]] = {
    "cpu": ["cmake", "c++"],
    "cpu-noavx2": ["cmake", "c++"],
    "cuda": ["cmake", "c++", "nvcc"],
    "vulkan": ["cmake", "c++", "glslc"],
    "rocm": ["cmake", "hipcc"],
    "metal": ["cmake", "xcrun"],
}
# The properties a manifest entry carries for the variant (what the target machine must have).
PROPERTIES: Dict[str, Dict[str, object]] = {
    "cpu": {"backend": "cpu", "cpu_features": ["avx2", "fma", "f16c"]},
    "cpu-noavx2": {"backend": "cpu", "cpu_features": ["sse4.2"]},
    "cuda": {"backend": "cuda", "sm": ["61", "70", "75", "80", "86", "89", "90", "120"]},
    "vulkan": {"backend": "vulkan"},
    "rocm": {"backend": "rocm", "gfx": ["gfx906", "gfx908", "gfx90a", "gfx942", "gfx1030", "gfx1100", "gfx1101", "gfx1102", "gfx1200", "gfx1201"]},
    "metal": {"backend": "metal"},
}


class BuildError(AccelstackError):
    """A ggml build could not be made; the message names the missing tool or the failing step."""


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


def build_cache_dir() -> Path:
    env = os.environ.get("ACCELSTACK_BUILD_CACHE")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("accelstack", appauthor=False)) / "builds"


def sha256_file(path: Path) -> str:
    from ..artifacts.cache import hash_file

    return hash_file(path).hexdigest()


def cached_sha256(path: Path) -> str:
    """sha256 of a build-cache file, remembered in ``<file>.sha256`` with its size and mtime.

    A cache hit is on the path of every `accelstack install` that builds locally; re-hashing
    the 20 MB source and the 19 MB wheel each time would dominate a no-op run.
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


def fetch_sdist(dest: Path, version: str = SDIST_VERSION, progress: ProgressCallback = null_progress) -> Path:
    """The bindings' source distribution, from the package registry (cached in ``dest``)."""
    dest.mkdir(parents=True, exist_ok=True)
    found = sorted(dest.glob(f"stable_diffusion_cpp_python-{version}.tar.gz"))
    if found:
        return found[0]
    progress(ProgressEvent("message", "build", message=f"downloading {SDIST_PACKAGE}=={version} source"))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--disable-pip-version-check",
           "-d", str(dest), f"{SDIST_PACKAGE}=={version}"]
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    found = sorted(dest.glob(f"stable_diffusion_cpp_python-{version}.tar.gz"))
    if res.returncode != 0 or not found:
        raise BuildError(f"could not download the {SDIST_PACKAGE} {version} source: {res.stdout.strip()[-500:]}",
                         hint="pass --sdist PATH to build from a local source distribution")
    return found[0]


def missing_toolchain(variant: str) -> List[str]:
    return [tool for tool in TOOLCHAINS.get(variant, []) if shutil.which(tool) is None]


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
) -> BuildResult:
    """Build (or reuse) the wheel for ``variant``; copy it to ``out_dir`` if given."""
    if variant not in VARIANTS:
        raise BuildError(f"unknown backend variant {variant!r}", hint=f"choose one of: {', '.join(VARIANTS)}")
    cache = Path(cache_dir) if cache_dir else build_cache_dir()
    sdist = Path(sdist) if sdist else fetch_sdist(cache / "sdist", progress=progress)
    if not sdist.is_file():
        raise BuildError(f"source distribution {sdist} does not exist", hint="pass the path of a stable_diffusion_cpp_python-*.tar.gz")
    cmake_args = VARIANTS[variant] + list(extra_cmake_args or [])
    source_sha = cached_sha256(sdist)
    key = cache_key(source_sha, variant, cmake_args)
    slot = cache / key
    slot.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock

    with FileLock(str(slot) + ".lock"):
        record = slot / "build.json"
        if record.is_file():
            result = BuildResult(**json.loads(record.read_text()))
            if Path(result.wheel).is_file() and cached_sha256(Path(result.wheel)) == result.sha256:
                result.cache_hit = True
                progress(ProgressEvent("message", "build", task=variant, message=f"reusing cached build {key}"))
                return _export(result, out_dir)
        missing = missing_toolchain(variant)
        if missing:
            raise BuildError(
                f"cannot build the {variant} variant here: {', '.join(missing)} not found",
                hint={"cuda": "install the CUDA toolkit (nvcc)", "vulkan": "install the Vulkan SDK / glslc",
                      "rocm": "install ROCm with hipcc", "metal": "build on macOS with Xcode"}.get(variant, "install CMake and a C++ compiler"),
            )
        result = _compile(variant, sdist, source_sha, cmake_args, key, slot, jobs or os.cpu_count() or 2, progress)
        record.write_text(json.dumps(asdict(result), indent=2))
        return _export(result, out_dir)


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
    (out / f"{dest.name}.build.json").write_text(json.dumps(asdict(exported), indent=2))
    return exported


def _compile(variant: str, sdist: Path, source_sha: str, cmake_args: List[str], key: str, slot: Path, jobs: int,
             progress: ProgressCallback) -> BuildResult:
    start = time.perf_counter()
    wheel_dir = Path(tempfile.mkdtemp(prefix="wheel-", dir=slot))
    env = {**os.environ, "CMAKE_ARGS": " ".join(cmake_args), "CMAKE_BUILD_PARALLEL_LEVEL": str(jobs)}
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-v",
           "--config-settings=wheel.py-api=py3", "-w", str(wheel_dir), str(sdist)]
    progress(ProgressEvent("start", "build", task=variant, message=f"compiling {variant} ({' '.join(cmake_args)})"))
    log_path = slot / "build.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            step = _STEP.match(line.strip())  # ninja "[12/51] ..." or make "[ 42%] Building ..."
            if step:
                done, total = (int(step.group(1)), int(step.group(2))) if step.group(2) else (int(step.group(3)), 100)
                progress(ProgressEvent("advance", "build", task=variant, done=done, total=total))
        rc = proc.wait()
    wheels = sorted(wheel_dir.glob("*.whl"))
    if rc != 0 or not wheels:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-15:]
        progress(ProgressEvent("end", "build", task=variant, ok=False))
        raise BuildError(f"building the {variant} variant failed (exit {rc}); last lines:\n" + "\n".join(tail),
                         hint=f"the full log is {log_path}")
    final = slot / wheels[0].name
    os.replace(wheels[0], final)
    shutil.rmtree(wheel_dir, ignore_errors=True)
    seconds = time.perf_counter() - start
    progress(ProgressEvent("end", "build", task=variant, ok=True, done=100, total=100))
    return BuildResult(
        variant=variant,
        wheel=str(final),
        sha256=sha256_file(final),
        size=final.stat().st_size,
        cmake_args=cmake_args,
        source_sha256=source_sha,
        key=key,
        properties=dict(PROPERTIES[variant]),
        seconds=round(seconds, 1),
        platform_tag=final.name.rsplit("-", 1)[-1][: -len(".whl")],
    )
