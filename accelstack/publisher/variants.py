"""The backend variants a ggml runtime is built in: CMake options, the tools a build needs, and the
properties a manifest entry of the variant requires of a target machine."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..manifests.build_targets import CUDA13_VERSION

__all__ = [
    "CUDA12_HINT", "CUDA12_RUNTIME", "CUDA12_SM", "CUDA13_RUNTIME", "CUDA13_SM", "CUDA13_TOOLCHAIN", "CUDA13_VERSION",
    "CUDA_ARCHS_ENV", "CUDA_SM", "CUDA_VARIANTS", "DEFAULT_TOOLCHAIN_HINT", "PROPERTIES", "ROCM_GFX", "TOOLCHAINS",
    "TOOLCHAIN_HINTS", "TOOLKIT_ROOTS", "VARIANTS", "VULKAN_HEADERS_HINT", "VULKAN_HEADERS_MARK", "CudaToolkit",
    "compiled_cuda_archs", "configured_cuda_archs", "cuda_architectures", "cuda_cmake_args", "cuda_targets",
    "cuda_toolkit_candidates", "find_cuda_toolkit", "missing_toolchain", "nvcc_version", "parse_cuda_archs",
    "properties_for", "vulkan_headers_ok",
]

# The GPU targets a CUDA and a ROCm build carry, written once: the CMake options compile for them
# and the manifest properties are derived from those options (compiled_cuda_archs), so the two
# cannot drift apart. CUDA 13 dropped Maxwell, Pascal and Volta (sm_75 is its oldest); the CUDA 12
# build is the one for those GPUs and for drivers older than 580.
CUDA13_SM = ["75", "80", "86", "89", "90", "100", "120"]
CUDA12_SM = ["61", "70", "75", "80", "86", "89", "90"]
CUDA_SM = CUDA13_SM  # the ``cuda`` variant's
ROCM_GFX = ["gfx906", "gfx908", "gfx90a", "gfx942", "gfx1030", "gfx1100", "gfx1101", "gfx1102", "gfx1200", "gfx1201"]
CUDA_VARIANTS = ("cuda", "cuda12")
CUDA_ARCHS_ENV = "ACCELSTACK_CUDA_ARCHS"  # Settings.cuda_archs: "90" or "86,90", a publisher's build for fewer GPUs


def _arch_specific(sm: str) -> bool:
    """Whether ggml compiles ``sm`` as architecture-specific code (its CMakeLists turns every 12X
    into 12Xa: Blackwell's FP4 instructions are not forward compatible)."""
    return re.match(r"^12[0-9]$", sm) is not None


def cuda_architectures(sms: Sequence[str]) -> str:
    """The CMAKE_CUDA_ARCHITECTURES value for SASS of every ``sms`` plus PTX of the newest one the
    driver can JIT for newer GPUs (an arch-specific 12Xa PTX could not): that arch is given
    without a suffix, which compiles both from one front-end pass, so the PTX costs no compile time."""
    archs = sorted({str(s).strip() for s in sms if str(s).strip()}, key=int)
    portable = [s for s in archs if not _arch_specific(s)]
    ptx = portable[-1] if portable else ""
    return ";".join(s if s == ptx else f"{s}-real" for s in archs)


def compiled_cuda_archs(cmake_args: Sequence[str]) -> Tuple[List[str], List[str]]:
    """The device code the CMake options compile: (SASS, PTX) as compute capabilities ("8.6",
    "12.0a"), after ggml's own rewrite of 12X to 12Xa. Empty without CMAKE_CUDA_ARCHITECTURES."""
    value = ""
    for arg in cmake_args:  # the last one given wins, as in CMake
        m = re.match(r"^-DCMAKE_CUDA_ARCHITECTURES(?::[A-Za-z]+)?=(.*)$", arg)
        if m:
            value = m.group(1)
    sass: List[str] = []
    ptx: List[str] = []
    for item in filter(None, (a.strip() for a in value.split(";"))):
        m = re.match(r"^(\d+)([af]?)(?:-(real|virtual))?$", item)
        if not m:
            continue
        num, suffix, kind = m.group(1), m.group(2), m.group(3)
        if _arch_specific(num) and not suffix:
            suffix = "a"
        cc = f"{num[:-1]}.{num[-1]}{suffix}"
        if kind in (None, "real") and cc not in sass:
            sass.append(cc)
        if kind in (None, "virtual") and cc not in ptx:
            ptx.append(cc)
    return sass, ptx


def parse_cuda_archs(raw: str, what: str = CUDA_ARCHS_ENV) -> List[str]:
    """The architectures ``raw`` names ("90", "sm_86,sm_90", "8.6"), as CMake numbers ("86");
    ValueError naming ``what`` (the variable or option it came from) when one is not an architecture.
    One parser for the variable and ``build ggml --cuda-arch``, so both accept the same spellings."""
    archs = [a.strip().lower().replace("sm_", "").replace(".", "") for a in re.split(r"[,;\s]+", raw) if a.strip()]
    bad = [a for a in archs if not re.match(r"^\d{2,3}$", a)]
    if bad or not archs:
        raise ValueError(f"{what}={raw!r}: give compute capabilities such as 90 or 86,90")
    return archs


def configured_cuda_archs(value: str) -> Optional[List[str]]:
    """The architectures ``Settings.cuda_archs`` (``ACCELSTACK_CUDA_ARCHS``) names ("90",
    "sm_86,sm_90"), or None when it is empty; ValueError when it names something else."""
    raw = (value or "").strip()
    return parse_cuda_archs(raw, CUDA_ARCHS_ENV) if raw else None


def cuda_targets(variant: str, cuda_archs: Optional[Sequence[str]] = None, configured: str = "") -> List[str]:
    """The architectures a build of CUDA ``variant`` compiles: ``cuda_archs``, else what
    ``configured`` (``Settings.cuda_archs``) names, else every one the variant's toolkit supports."""
    if cuda_archs:
        return [str(a) for a in cuda_archs]
    try:
        named = configured_cuda_archs(configured)
    except ValueError:  # the build itself says what is wrong with it
        named = None
    return named or list(CUDA13_SM if variant == "cuda" else CUDA12_SM)


def cuda_cmake_args(variant: str, archs: Optional[Sequence[str]] = None) -> List[str]:
    """The CMake options of a CUDA variant, for ``archs`` (default: every architecture its toolkit supports)."""
    default = CUDA13_SM if variant == "cuda" else CUDA12_SM
    # the runtime is linked shared (libcudart.so.N from NVIDIA's wheel), not also statically
    return ["-DGGML_NATIVE=OFF", "-DSD_CUDA=ON", "-DCMAKE_CUDA_RUNTIME_LIBRARY=Shared",
            f"-DCMAKE_CUDA_ARCHITECTURES={cuda_architectures(archs or default)}"]


# CMake options per backend variant. GGML_NATIVE=OFF keeps -march=native out (builds must run on
# other machines); ggml then enables the x86-64-v3 set (AVX, AVX2, FMA, F16C, BMI2) unless told otherwise.
VARIANTS: Dict[str, List[str]] = {
    "cpu": ["-DGGML_NATIVE=OFF"],
    "cpu-noavx2": [
        "-DGGML_NATIVE=OFF", "-DGGML_AVX=OFF", "-DGGML_AVX2=OFF", "-DGGML_FMA=OFF",
        "-DGGML_F16C=OFF", "-DGGML_BMI2=OFF", "-DGGML_SSE42=ON",
    ],
    "cuda": cuda_cmake_args("cuda"),  # CUDA 13, compiled with NVIDIA's toolchain packages from PyPI
    "cuda12": cuda_cmake_args("cuda12"),  # CUDA 12, compiled with a system CUDA 12 toolkit
    "vulkan": ["-DGGML_NATIVE=OFF", "-DSD_VULKAN=ON"],
    "rocm": ["-DGGML_NATIVE=OFF", "-DSD_HIPBLAS=ON", f"-DGPU_TARGETS={';'.join(ROCM_GFX)}"],
    "metal": ["-DSD_METAL=ON", "-DGGML_METAL_EMBED_LIBRARY=ON"],
}
# Added to every variant built on Linux. There the runtime is one position-independent shared library
# (ggml linked in), and GCC and Clang must assume that another library may replace any function it
# exports (ELF interposition): they neither inline such a function nor call it directly, even from its
# own file. stable-diffusion.cpp widens F8_E5M2 weights one element at a time through one
# (src/model.cpp f8_e5m2_to_f16): through the PLT that took 1.7 s of a 1.2 GB model's load here, 0.7 s
# inlined as in the static sd-cli (benchmarks/bench_engine.py --family qwen-image). Nothing interposes
# on the runtime (the bindings load it with ctypes), so the promise costs nothing. Given as CMake's
# flags, they replace CFLAGS/CXXFLAGS from the environment, which the cache key does not see anyway.
LINUX_CMAKE_ARGS = ["-DCMAKE_C_FLAGS=-fno-semantic-interposition", "-DCMAKE_CXX_FLAGS=-fno-semantic-interposition"]
# What each variant needs on the build machine, checked before a long build starts.
TOOLCHAINS: Dict[str, List[str]] = {
    "cpu": ["cmake", "c++"],
    "cpu-noavx2": ["cmake", "c++"],
    "cuda": ["cmake", "c++"],  # nvcc comes from PyPI into the build cache (see CUDA13_TOOLCHAIN)
    "cuda12": ["cmake", "c++"],  # plus a CUDA 12 toolkit, found by find_cuda_toolkit
    "vulkan": ["cmake", "c++", "glslc"],
    "rocm": ["cmake", "hipcc"],
    "metal": ["cmake", "xcrun"],
}
# What to install when a variant's tools are missing (a sentence for a person).
TOOLCHAIN_HINTS: Dict[str, str] = {
    "cuda": "install CMake and a C++ compiler (GCC 6 to 15 or Clang 7 to 20); NVIDIA's CUDA 13 compiler is "
            "downloaded from PyPI into the build cache",
    "cuda12": "install CMake, a C++ compiler and a CUDA 12 toolkit",
    "vulkan": "install the Vulkan SDK (glslc, headers 1.3.255 or newer), CMake and a C++ compiler; on Debian or "
              "Ubuntu the packages libvulkan-dev, glslc and mesa-vulkan-drivers, and the repository's "
              "scripts/setup-vulkan.sh for new enough headers",
    "rocm": "install ROCm with hipcc, and CMake",
    "metal": "build on macOS with Xcode and CMake",
}
DEFAULT_TOOLCHAIN_HINT = "install CMake and a C++ compiler"
# The properties a manifest entry carries for the variant (what the target machine must have).
PROPERTIES: Dict[str, Dict[str, object]] = {
    "cpu": {"backend": "cpu", "cpu_features": ["avx2", "fma", "f16c"]},
    "cpu-noavx2": {"backend": "cpu", "cpu_features": ["sse4.2"]},
    "cuda": {"backend": "cuda"},  # sm, ptx and cuda: properties_for (from the options and the toolkit)
    "cuda12": {"backend": "cuda"},
    "vulkan": {"backend": "vulkan"},
    "rocm": {"backend": "rocm", "gfx": list(ROCM_GFX)},
    "metal": {"backend": "metal"},
}


def properties_for(variant: str, cmake_args: Sequence[str], cuda_version: str = "") -> Dict[str, object]:
    """The manifest properties of a build of ``variant`` made with ``cmake_args``: for CUDA the
    SASS (``sm``) and PTX (``ptx``) those options compile and the CUDA version (``cuda``, the
    toolkit's major.minor) the driver must support. One source: what is promised is what was built."""
    props = dict(PROPERTIES[variant])
    if variant in CUDA_VARIANTS:
        sass, ptx = compiled_cuda_archs(cmake_args)
        props["sm"] = sass
        props["ptx"] = ptx
        if cuda_version:
            props["cuda"] = cuda_version
    return props


# NVIDIA's CUDA 13.0 toolchain on PyPI (exact versions: the build venv and its cache key follow
# them). 13.0 (CUDA13_VERSION: the resolver decides with it which GPUs need cuda12) is what drivers
# 580 and newer support; a newer toolkit would demand a newer driver.
CUDA13_TOOLCHAIN: Dict[str, str] = {
    "nvidia-cuda-nvcc": "13.0.88",  # nvcc, ptxas, fatbinary, nvlink, cudafe++
    "nvidia-nvvm": "13.0.88",  # cicc, libdevice
    "nvidia-cuda-crt": "13.0.88",  # nvcc's crt headers
    "nvidia-cuda-cccl": "13.0.85",  # CUB, Thrust, libcu++
    "nvidia-cuda-runtime": "13.0.96",  # cudart (headers, libcudart.so.13, cuda.h)
    "nvidia-cublas": "13.0.2.14",  # cuBLAS 13.0 U2
    "nvidia-cuda-cuobjdump": "13.2.51",  # lists a build's SASS/PTX (the oldest on PyPI reads 13.0 fatbins)
}
# The toolchain packages whose libraries the built runtime loads (the manifest's cuda_libs).
CUDA13_RUNTIME = ("nvidia-cuda-runtime", "nvidia-cublas")
CUDA12_RUNTIME = ("nvidia-cuda-runtime-cu12", "nvidia-cublas-cu12")
CUDA12_HINT = ("install NVIDIA's CUDA 12 toolkit (12.8 recommended; nvcc 12.x) from "
               "https://developer.nvidia.com/cuda-toolkit-archive or your distribution's NVIDIA repository "
               "(e.g. apt install cuda-toolkit-12-8) and set CUDA_HOME to it; PyPI has no CUDA 12 nvcc "
               "(nvidia-cuda-nvcc-cu12 carries only ptxas), and CUDA 13 cannot build for Maxwell, Pascal or Volta")


@dataclass
class CudaToolkit:
    """A CUDA toolkit a build can use: its nvcc, the folder it lives in, its version (major.minor)."""

    nvcc: str
    root: str  # the toolkit's folder (bin/, include/, lib or lib64/); "" when nvcc is a wrapper elsewhere
    version: str  # "12.8"
    source: str = ""  # where it was found: CUDA_HOME, PATH, /usr/local/cuda-12.8, the build venv

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])


_NVCC_RELEASE = re.compile(r"release (\d+)\.(\d+)")


def nvcc_version(nvcc: str, timeout: float = 30.0) -> Optional[str]:
    """The major.minor ``nvcc --version`` reports ("12.8"), or None when it does not run or say."""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    m = _NVCC_RELEASE.search(out.stdout + out.stderr)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def _toolkit_root(nvcc: Path) -> str:
    root = nvcc.resolve().parent.parent
    return str(root) if (root / "include" / "cuda_runtime.h").is_file() else ""


TOOLKIT_ROOTS = (Path("/usr/local"), Path("/opt"))  # where toolkits install themselves as cuda, cuda-12.8


def cuda_toolkit_candidates(env: Mapping[str, str], roots: Sequence[Path] = TOOLKIT_ROOTS) -> List[Tuple[str, Path]]:
    """Every nvcc a system may hold, with where it was found: CUDA_HOME, CUDA_PATH (and Windows'
    CUDA_PATH_V12_8 style), nvcc on PATH, ``<root>/cuda*`` of ``roots``. Duplicates removed.
    ``env`` holds those variables (``Settings.cuda_env``)."""
    exe = "nvcc.exe" if os.name == "nt" else "nvcc"
    found: List[Tuple[str, Path]] = []
    for name in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] + sorted(k for k in env if k.startswith("CUDA_PATH_V")):
        if env.get(name):
            found.append((name, Path(env[name]) / "bin" / exe))
    on_path = shutil.which("nvcc", path=env.get("PATH", ""))
    if on_path:
        found.append(("PATH", Path(on_path)))
    for base in roots:
        for d in sorted(Path(base).glob("cuda*"), reverse=True) if Path(base).is_dir() else []:
            found.append((str(d), d / "bin" / exe))
    out, seen = [], set()
    for where, nvcc in found:
        real = str(nvcc.resolve()) if nvcc.is_file() else ""
        if real and real not in seen:
            seen.add(real)
            out.append((where, nvcc))
    return out


def find_cuda_toolkit(major: int, env: Mapping[str, str], roots: Sequence[Path] = TOOLKIT_ROOTS) -> Tuple[Optional[CudaToolkit], List[str]]:
    """The newest system CUDA toolkit of ``major`` (by ``nvcc --version``), and a line for every
    other one seen (to say what was found when none fits)."""
    best: Optional[CudaToolkit] = None
    others: List[str] = []
    for where, nvcc in cuda_toolkit_candidates(env, roots):
        version = nvcc_version(str(nvcc))
        if version is None:
            others.append(f"{nvcc} ({where}) does not report a version")
            continue
        if int(version.split(".")[0]) != major:
            others.append(f"CUDA {version} at {nvcc} ({where})")
            continue
        kit = CudaToolkit(nvcc=str(nvcc), root=_toolkit_root(nvcc), version=version, source=where)
        if best is None or [int(n) for n in version.split(".")] > [int(n) for n in best.version.split(".")]:
            best = kit
    return best, others


def missing_toolchain(variant: str) -> List[str]:
    """The tools ``variant`` needs that are not on PATH (empty: the build can start)."""
    return [tool for tool in TOOLCHAINS.get(variant, []) if shutil.which(tool) is None]


# ggml-vulkan uses vk::LayerSettingEXT (Vulkan-Hpp 1.3.255+); Debian 12's libvulkan-dev is 1.3.239.
VULKAN_HEADERS_MARK = "LayerSettingEXT"
VULKAN_HEADERS_HINT = ("put Vulkan headers 1.3.255 or newer where the build finds them: the Vulkan SDK, a newer "
                       "libvulkan-dev, or (Debian 12) the repository's scripts/setup-vulkan.sh, which extracts "
                       "Debian 13's headers into the build cache's vulkan-headers folder")


def vulkan_headers_ok(include: Path) -> bool:
    """Whether the Vulkan headers in ``include`` are new enough for ggml-vulkan."""
    try:
        with open(Path(include) / "vulkan" / "vulkan_structs.hpp", encoding="utf-8", errors="replace") as fh:
            return any(VULKAN_HEADERS_MARK in line for line in fh)
    except OSError:
        return False
