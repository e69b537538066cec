"""The backend variants a ggml runtime is built in: CMake options, the tools a build needs, and the
properties a manifest entry of the variant requires of a target machine."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Dict, List

# The GPU targets a CUDA and a ROCm build carry, written once: the CMake options compile for them
# and the manifest properties promise them to target machines, so the two cannot drift apart.
CUDA_SM = ["61", "70", "75", "80", "86", "89", "90", "120"]
CUDA_PTX_ONLY = {"61", "70", "75"}  # older GPUs get PTX the driver compiles (keeps the wheel small)
ROCM_GFX = ["gfx906", "gfx908", "gfx90a", "gfx942", "gfx1030", "gfx1100", "gfx1101", "gfx1102", "gfx1200", "gfx1201"]
_CUDA_ARCHITECTURES = ";".join(f"{sm}-virtual" if sm in CUDA_PTX_ONLY else sm for sm in CUDA_SM)

# CMake options per backend variant. GGML_NATIVE=OFF keeps -march=native out (builds must run on
# other machines); ggml then enables the x86-64-v3 set (AVX, AVX2, FMA, F16C, BMI2) unless told otherwise.
VARIANTS: Dict[str, List[str]] = {
    "cpu": ["-DGGML_NATIVE=OFF"],
    "cpu-noavx2": [
        "-DGGML_NATIVE=OFF", "-DGGML_AVX=OFF", "-DGGML_AVX2=OFF", "-DGGML_FMA=OFF",
        "-DGGML_F16C=OFF", "-DGGML_BMI2=OFF", "-DGGML_SSE42=ON",
    ],
    "cuda": ["-DGGML_NATIVE=OFF", "-DSD_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={_CUDA_ARCHITECTURES}"],
    "vulkan": ["-DGGML_NATIVE=OFF", "-DSD_VULKAN=ON"],
    "rocm": ["-DGGML_NATIVE=OFF", "-DSD_HIPBLAS=ON", f"-DGPU_TARGETS={';'.join(ROCM_GFX)}"],
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
# What to install when a variant's tools are missing (a sentence for a person).
TOOLCHAIN_HINTS: Dict[str, str] = {
    "cuda": "install the CUDA toolkit (nvcc), CMake and a C++ compiler",
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
    "cuda": {"backend": "cuda", "sm": list(CUDA_SM)},
    "vulkan": {"backend": "vulkan"},
    "rocm": {"backend": "rocm", "gfx": list(ROCM_GFX)},
    "metal": {"backend": "metal"},
}


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
