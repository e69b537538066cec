"""What accelstack knows about a torchruntime GPU record, and whether a platform's wheels run on it.

A record (vendor id, device id, name) is identified through accelstack's tables: the NVIDIA compute
capability by marketing or chip name, the AMD gfx target by PCI device id or name. A platform
answer ("cu128", "rocm6.2") runs on a GPU when some release of that variant in accelstack's torch
matrix, for this platform and Python (and the caller's torch pins), has kernels for it: an sm of
the same major at or below its compute capability (or PTX), its gfx target, or the gfx override
``torch.json`` allows for it. A GPU the tables do not know is no evidence either way.
"""
from __future__ import annotations

import functools
from typing import Any, Iterable, List, Optional, Sequence, Tuple

from packaging.requirements import InvalidRequirement, Requirement

from ...hardware.report import HardwareReport
from ...hardware.tables import amd_gfx_target, nvidia_compute_capability, pci_lookup
from ...manifests.torch_matrix import builtin_torch_matrix
from ...manifests.torch_types import Release, TorchMatrix, Variant
from .consts import AMD, NVIDIA

__all__ = ["matrix", "platform_key", "gpu_cc", "gpu_gfx", "gfx_version", "runs_on", "verdict", "own_choice", "index_name"]

# torchruntime's platform words -> the matrix's platform keys
_PLATFORMS = {("Linux", "x86_64"): "linux-x86_64", ("Linux", "aarch64"): "linux-arm64", ("Windows", "amd64"): "windows-x86_64",
              ("Darwin", "arm64"): "macos-arm64", ("Darwin", "x86_64"): "macos-x86_64"}
_BACKEND_VENDOR = {"cuda": NVIDIA, "rocm": AMD}
_TORCH = ("torch",)  # the distribution whose pins pick the release line


@functools.lru_cache(maxsize=1)
def matrix() -> TorchMatrix:
    """The torch matrix shipped with accelstack (its facts do not change within a process)."""
    return builtin_torch_matrix()


def platform_key(os_name: str, arch: str) -> str:
    return _PLATFORMS.get((os_name, arch), "")


def _report_gpu(gpu: Any) -> Any:
    """The detected GPU behind a record from ``get_gpus`` (it carries its report), if any."""
    report = getattr(gpu, "report", None)
    if not isinstance(report, HardwareReport):
        return None
    device_id = str(getattr(gpu, "device_id", "")).lower()
    return next((g for g in report.gpus if g.pci_device_id.lower() == device_id and g.name == gpu.device_name), None)


def _names(gpu: Any) -> List[str]:
    names = [str(getattr(gpu, "device_name", ""))]
    known = pci_lookup(str(getattr(gpu, "vendor_id", "")), str(getattr(gpu, "device_id", "")))
    if known:
        names.append(known[0])
    return names


def gpu_cc(gpu: Any) -> str:
    """An NVIDIA record's compute capability ("8.6"), "" when accelstack's tables do not know it."""
    detected = _report_gpu(gpu)
    if detected is not None and detected.compute_capability:
        return str(detected.compute_capability)
    return next((cc for cc in map(nvidia_compute_capability, _names(gpu)) if cc), "")


def gpu_gfx(gpu: Any) -> str:
    """An AMD record's gfx target ("gfx1030"), "" when accelstack's tables do not know it."""
    detected = _report_gpu(gpu)
    if detected is not None and detected.gfx_target:
        return str(detected.gfx_target)
    return next((g for g in (amd_gfx_target(str(getattr(gpu, "device_id", "")), n) for n in _names(gpu)) if g), "")


def gfx_version(gfx: str) -> str:
    """The HSA version a gfx target is ("gfx90c" -> "9.0.12", "gfx1103" -> "11.0.3")."""
    digits = gfx[3:]
    if len(digits) < 3:
        return ""
    major, minor, step = digits[:-2], digits[-2], digits[-1]
    try:
        return f"{int(major)}.{int(minor, 16)}.{int(step, 16)}"
    except ValueError:
        return ""


def _cc_key(cc: str) -> Tuple[int, int]:
    major, _, minor = cc.partition(".")
    return int(major or 0), int(minor or 0)


def _allowed(release: Release, packages: Sequence[str]) -> bool:
    """Whether the caller's torch pins leave some version of ``release``."""
    for text in packages:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.name.lower() in _TORCH and req.specifier and not any(req.specifier.contains(v, prereleases=True) for v in release.versions):
            return False
    return True


def _published(name: str, platform: str, py: str, packages: Sequence[str]) -> Iterable[Tuple[Release, Variant]]:
    for release in matrix().releases:
        variant = release.variant(name)
        if variant is None or platform not in variant.platforms:
            continue
        spec = variant.python_spec or release.python_spec
        if (py and not spec.contains(py, prereleases=True)) or not _allowed(release, packages):
            continue
        yield release, variant


def _kernels(variant: Variant, platform: str, gpu: Any) -> Optional[bool]:
    """Whether ``variant`` has code for ``gpu`` here; None when accelstack does not know the GPU."""
    build = variant.platforms[platform]
    if variant.backend == "cuda":
        cc = gpu_cc(gpu)
        if not cc:
            return None
        have = _cc_key(cc)
        return any(_cc_key(s)[0] == have[0] and _cc_key(s) <= have for s in build.sm) or any(_cc_key(p) <= have for p in build.ptx)
    if variant.backend == "rocm":
        gfx = gpu_gfx(gpu)
        if not gfx:
            return None
        override = matrix().gfx_overrides.get(gfx)
        return gfx in build.gfx or bool(variant.gfx_override and override is not None and override.target in build.gfx)
    return None


def runs_on(name: str, gpu: Any, platform: str, py: str, packages: Sequence[str] = ()) -> Optional[bool]:
    """Whether some published build of ``name`` runs on ``gpu``; None when the GPU is not known."""
    answers = [_kernels(v, platform, gpu) for _, v in _published(name, platform, py, packages)]
    if not answers:  # the variant is not in accelstack's matrix: only an unknown GPU leaves it standing
        return None if _kernels_unknown(name, gpu) else False
    if any(a is None for a in answers):
        return None
    return any(answers)


def _kernels_unknown(name: str, gpu: Any) -> bool:
    if name.startswith(("cu", "nightly/cu")):
        return not gpu_cc(gpu)
    if name.startswith(("rocm", "nightly/rocm")):
        return not gpu_gfx(gpu)
    return True


def verdict(name: str, gpus: Sequence[Any], platform: str, py: str, packages: Sequence[str] = ()) -> bool:
    """Keep ``name`` for these GPUs? Yes unless every GPU of its vendor that accelstack knows lacks its kernels."""
    vendor = _BACKEND_VENDOR.get(_backend(name))
    if vendor is None:
        return True
    mine = [g for g in gpus if str(getattr(g, "vendor_id", "")).lower() == vendor]
    answers = [runs_on(name, g, platform, py, packages) for g in mine]
    return not answers or any(a is None or a for a in answers)


def _backend(name: str) -> str:
    bare = name.split("/")[-1]
    return "cuda" if bare.startswith("cu") else "rocm" if bare.startswith("rocm") else bare


def index_name(variant: Variant) -> bool:
    """Whether a variant's name is an index of download.pytorch.org (or PyPI's own torch), as torchruntime's are."""
    return variant.index in ("", "pypi")


def own_choice(name: str, gpus: Sequence[Any], platform: str, py: str, packages: Sequence[str] = ()) -> str:
    """The newest build of ``name``'s backend (a PyTorch index name) with kernels for all of these GPUs
    (as torchruntime looks for one build that serves every card), else for one of them; "cpu" if none."""
    backend = _backend(name)
    vendor = _BACKEND_VENDOR.get(backend, "")
    mine = [g for g in gpus if str(getattr(g, "vendor_id", "")).lower() == vendor]
    candidates = [(release, variant) for release in matrix().releases if _allowed(release, packages) for variant in release.variants
                  if variant.backend == backend and index_name(variant) and platform in variant.platforms
                  and (not py or (variant.python_spec or release.python_spec).contains(py, prereleases=True))]
    for wanted in (all, any):
        found = next((v.name for _, v in candidates if wanted(_kernels(v, platform, g) is not False for g in mine)
                      and any(_kernels(v, platform, g) for g in mine)), "")
        if found:
            return found
    return "cpu"
