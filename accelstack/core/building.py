"""The publisher's side: compile a ggml runtime wheel for one backend variant (``accelstack build
ggml``), then publish a directory of such builds as one signed manifest (``accelstack manifest build``).

The builder takes the caller's settings (the build cache, the source's download timeout, the
CUDA architectures), so nothing below looks them up.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..fsio import copy_file
from ..publisher.build import COMPILE_TIMEOUT, CUDA_COMPILE_TIMEOUT_PER_ARCH, VARIANTS, build_ggml
from ..publisher.build_cache import BuildResult
from ..publisher.publish import build_manifest, flat_assets, write_signed_manifest
from ..publisher.variants import CUDA_ARCHS_ENV, CUDA_VARIANTS, parse_cuda_archs

__all__ = ["COMPILE_TIMEOUT", "CUDA_COMPILE_TIMEOUT_PER_ARCH", "CUDA_ARCHS_ENV", "CUDA_VARIANTS", "VARIANTS",
           "BuildResult", "build_ggml", "parse_cuda_archs", "manifest_for_builds", "write_manifest_dir"]


def manifest_for_builds(directory: Path, base_url: str, *, source: str, version: int, expires_days: int,
                        flat: bool = False, changed: Optional[List[str]] = None) -> Dict[str, Any]:
    """The manifest document for every build under ``directory`` (made by ``accelstack build ggml
    --out DIR/...``), each URL under ``base_url``; ``changed`` receives a line for each wheel that
    differs from its build record."""
    return build_manifest(directory, base_url, source=source, version=version, expires_days=expires_days,
                          changed=changed, flat=flat)


def write_manifest_dir(directory: Path, doc: Dict[str, Any], key: Optional[bytes], *,
                       flat: bool = False) -> Tuple[Path, List[str]]:
    """Write ``doc`` as ``directory``'s manifest (signed with ``key``, a PEM private key; unsigned
    without one) and, with ``flat``, a copy of each wheel under its one-level name beside it.
    Returns the manifest and every file to upload."""
    path = write_signed_manifest(directory, doc, key)
    assets = [str(path)] + ([str(path) + ".sig"] if key else [])
    if flat:
        for wheel, name in flat_assets(directory):
            target = directory / name
            copy_file(wheel, target)  # the copy appears whole, or not at all
            assets.append(str(target))
    return path, assets
