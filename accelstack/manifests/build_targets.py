"""What a local ggml build for a machine makes: the publisher variant and its GPU architectures.

The resolver decides both when no published build fits (``BuildSpec.variant``, ``BuildSpec.archs``),
so the plan says what an install would compile and the core's local build reads them off the plan
instead of applying the hardware rules again. The rules: an x86-64 CPU without AVX2 gets the SSE4.2
build (``cpu-noavx2``); a GPU CUDA 13 no longer compiles for (Maxwell, Pascal, Volta: the build
spec's ``cuda_toolkit`` "12.x") or a driver older than CUDA 13.0 (``cuda_max``; without one, a
driver below CUDA 13's family floor) gets ``cuda12``; a CUDA build compiles only its GPUs'
architectures ("86", as CMake names them; none when a compute capability is unknown: every one of
the variant), a ROCm build names its GPUs' gfx targets.
"""
from __future__ import annotations

import re
from typing import Dict, List, Sequence

from ..hardware.report import HardwareReport
from .hw_rules import hw_rules
from .machine import cc_parts, version_or_none

__all__ = ["CUDA13_VERSION", "BUILD_VARIANTS", "build_variant", "needs_cuda12", "build_archs"]

# the CUDA toolkit the ``cuda`` variant is built with (publisher.variants pins its packages): 13.0 is
# what drivers 580 and newer support; a newer toolkit would demand a newer driver
CUDA13_VERSION = "13.0"
# the variants of the publisher's builds (publisher.variants.VARIANTS) that a backend's own name does not say
BUILD_VARIANTS = ("cpu-noavx2", "cuda12")


def build_variant(backend: str, properties: Dict[str, str], report: HardwareReport) -> str:
    """The publisher variant a local build for ``backend`` compiles on the machine ``report`` describes."""
    if backend == "cpu" and report.os.arch == "x86_64" and not report.cpu.has("avx2"):
        return "cpu-noavx2"
    if backend == "cuda" and needs_cuda12(properties, report):
        return "cuda12"
    return backend


def needs_cuda12(properties: Dict[str, str], report: HardwareReport) -> bool:
    """Whether the CUDA 13 build cannot serve the GPU of a build spec with ``properties``: its last
    toolkit is CUDA 12 (``cuda_toolkit`` "12.x"), or its driver's CUDA is older than 13.0
    (``cuda_max``; without one, a driver below CUDA 13's family floor, R580)."""
    toolkit = re.match(r"^(\d+)", properties.get("cuda_toolkit", ""))
    cuda13 = version_or_none(CUDA13_VERSION)
    if toolkit is not None and cuda13 is not None and int(toolkit.group(1)) < cuda13.major:
        return True
    cuda_max = version_or_none(properties.get("cuda_max", ""))
    if cuda_max is not None and cuda13 is not None:
        return cuda_max < cuda13
    driver = version_or_none(properties.get("nvidia_driver", ""))
    driver_os = "windows" if report.os.name == "windows" or report.os.wsl else "linux"  # WSL2: the host's driver
    floor = version_or_none(hw_rules().floor(cuda13.major if cuda13 else 13, driver_os))
    # a number below 100 is an L4T release (Jetson), not a desktop driver the floor describes
    return driver is not None and driver.major >= 100 and floor is not None and driver < floor


def build_archs(backend: str, gpus: Sequence[int], properties: Dict[str, str], report: HardwareReport) -> List[str]:
    """The GPU architectures a local build for ``backend`` on the GPUs ``gpus`` compiles: CUDA's
    CMake architectures ("86", each one costs more than an hour on a small machine; none when a
    compute capability is unknown), ROCm's gfx targets; none for the other backends."""
    if backend == "rocm":
        named = [g.gfx_target for g in report.gpus if g.index in gpus and g.vendor == "amd" and g.gfx_target]
        return sorted(set(named)) or ([properties["gfx"]] if properties.get("gfx") else [])
    if backend != "cuda":
        return []
    ccs = [g.compute_capability for g in report.gpus if g.index in gpus and g.vendor == "nvidia"]
    if not ccs:
        ccs = [properties.get("sm", "")]
    archs: List[str] = []
    for cc in ccs:
        parts = cc_parts(cc)
        if parts is None:
            return []
        arch = f"{parts[0]}{parts[1]}"
        if arch not in archs:
            archs.append(arch)
    return sorted(archs, key=int)
