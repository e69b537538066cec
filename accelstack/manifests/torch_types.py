"""The torch compatibility matrix's typed form: releases, their variants and platform builds.

:mod:`.torch_matrix` reads the matrix document (``data/torch.json``) into these, checking every
field and parsing once each version and specifier the resolver compares.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from ..domain import Backend, Stack
from .envelope import Envelope

__all__ = ["BUILTIN", "COMPANIONS", "DEFAULT_TORCH_TIERS", "ENGINE_PACKAGES", "PLATFORMS", "TORCH_BACKENDS", "CudaToolkit",
           "Extra", "GfxOverride", "PlatformBuild", "Release", "TorchMatrix", "Variant"]

TORCH_BACKENDS: Tuple[Backend, ...] = ("cuda", "rocm", "xpu", "mps", "directml", "cpu")
PLATFORMS = ("linux-x86_64", "linux-arm64", "windows-x86_64", "windows-arm64", "macos-arm64", "macos-x86_64", "wsl-x86_64")
COMPANIONS = ("torchvision", "torchaudio")
# What accelstack's torch engine (engine/worker/torch_backend.py) imports next to torch: a torch runtime
# generates images only with them. accelerate is not imported, but without it diffusers loads a
# model's weights twice over in memory. The floors are the oldest releases with the APIs used
# (exponential sigmas in the schedulers, from_single_file, CLIPTextModel's config).
ENGINE_PACKAGES = ("diffusers>=0.31", "transformers>=4.41", "safetensors>=0.4.3", "accelerate>=0.31")
DEFAULT_TORCH_TIERS = [["cuda", "rocm", "xpu", "mps"], ["directml"], ["cpu"]]
BUILTIN = "torch.json"


@dataclass
class CudaToolkit:
    cuda: str
    driver: Dict[str, str]  # "linux"/"windows" -> minimum driver version (NVIDIA release notes Table 3)
    sources: List[str] = field(default_factory=list)
    version: Version = field(default=Version("0"), repr=False, compare=False)

    def min_driver(self, os_name: str) -> Optional[Version]:
        text = self.driver.get(os_name, "")
        return Version(text) if text else None


@dataclass
class PlatformBuild:
    """One variant as published for one platform."""

    sm: List[str] = field(default_factory=list)
    ptx: List[str] = field(default_factory=list)
    gfx: List[str] = field(default_factory=list)
    # gfx targets the publisher builds but does not release-test on this platform (offered with a warning)
    gfx_build_only: List[str] = field(default_factory=list)
    # ranking rule with its reason: this build ranks after any other build of its backend that holds the
    # GPU's target natively (AMD's index on Linux yields to PyTorch's own ROCm wheels), "" for none
    defer_to_native: str = ""
    macos_min: str = ""
    windows_min_build: int = 0
    glibc: str = ""
    index: str = ""
    unverified: str = ""  # why this platform's publication is not confirmed ("" = confirmed)


@dataclass
class Variant:
    name: str
    backend: Backend
    platforms: Dict[str, PlatformBuild]
    cuda: str = ""
    rocm: str = ""
    gfx_override: bool = False
    broken_gfx: Dict[str, str] = field(default_factory=dict)
    index: str = ""  # "" -> the matrix index_url template; "pypi"; or a URL
    package: str = ""  # a requirement installed instead of torch (torch-directml pins its own torch)
    pins: str = ""  # the torch version that package pins
    python: str = ""  # overrides the release's Python range
    glibc: str = ""
    sources: List[str] = field(default_factory=list)
    comment: str = ""
    unverified: str = ""  # why the publication of this index variant is not confirmed ("" = confirmed)
    # AMD's multi-arch index (TheRock): the pip extra that picks a GPU's kernels, "device-{gfx}" ->
    # torch[device-gfx1100] and torchvision[device-gfx1100]; "" for every other variant
    device_extra: str = ""
    hip_runtime: str = ""  # the HIP runtime major the build loads on Windows ("7": amdhip64_7.dll)
    driver_update: str = ""  # what to do when the driver lacks that runtime
    python_spec: Optional[SpecifierSet] = field(default=None, repr=False, compare=False)
    cuda_version: Optional[Version] = field(default=None, repr=False, compare=False)


@dataclass
class Extra:
    package: str
    install: str  # "optional" (offered, not installed) | "auto" (torch pulls it in)
    spec: str = ""
    backends: List[str] = field(default_factory=list)
    platforms: List[str] = field(default_factory=list)
    why: str = ""
    sources: List[str] = field(default_factory=list)


@dataclass
class Release:
    torch: str  # the release line, "2.14"
    versions: List[str]  # published versions known to the matrix
    python: str
    variants: List[Variant]
    companions: Dict[str, str] = field(default_factory=dict)  # package -> its release line
    glibc: str = ""
    extras: List[Extra] = field(default_factory=list)
    sources: List[str] = field(default_factory=list)
    comment: str = ""
    version: Version = field(default=Version("0"), repr=False, compare=False)
    python_spec: SpecifierSet = field(default_factory=SpecifierSet, repr=False, compare=False)
    known_versions: List[Version] = field(default_factory=list, repr=False, compare=False)
    by_name: Dict[str, Variant] = field(default_factory=dict, repr=False, compare=False)

    def variant(self, name: str) -> Optional[Variant]:
        return self.by_name.get(name)


@dataclass
class GfxOverride:
    target: str
    value: str
    sources: List[str] = field(default_factory=list)


@dataclass
class TorchMatrix:
    envelope: Envelope
    releases: List[Release]  # newest first
    cuda_toolkits: List[CudaToolkit]
    index_url: str = "https://download.pytorch.org/whl/{variant}"
    pypi_url: str = "https://pypi.org/simple"
    backend_tiers: List[List[str]] = field(default_factory=lambda: [list(t) for t in DEFAULT_TORCH_TIERS])
    gfx_overrides: Dict[str, GfxOverride] = field(default_factory=dict)
    gfx_override_refused: Dict[str, str] = field(default_factory=dict)
    xpu_match: List[str] = field(default_factory=list)
    xpu_supported_text: str = ""
    sources: Dict[str, str] = field(default_factory=dict)
    snapshot: str = ""
    stale: bool = False  # expired bundled data, used anyway (the plan says so)
    engine_packages: List[str] = field(default_factory=lambda: list(ENGINE_PACKAGES))  # the torch engine's, from PyPI

    @property
    def kind(self) -> Stack:
        return "torch"

    def toolkit(self, cuda: str) -> Optional[CudaToolkit]:
        for t in self.cuda_toolkits:
            if t.cuda == cuda:
                return t
        return None

    def variant_names(self, backend: str) -> List[str]:
        """Every variant name of ``backend``, newest toolkit first, then by first appearance."""
        seen: Dict[str, Tuple[Version, int]] = {}
        order = 0
        for rel in self.releases:
            for v in rel.variants:
                if v.backend == backend and v.name not in seen:
                    key = v.cuda_version or (Version(v.rocm) if v.rocm else Version("0"))
                    seen[v.name] = (key, -order)
                    order += 1
        return sorted(seen, key=lambda n: seen[n], reverse=True)
