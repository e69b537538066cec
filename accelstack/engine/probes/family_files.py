"""Where a family's probe lives: probe_model's cache and temporary folders, for the other families.

The rules are the SD 1.x probe's (:mod:`accelstack.engine.probes.model`), made by the same code from
a :class:`~.probe_model.ProbeRecipe`: a kept cache entry ``<family>-f<format>-s<seed>/``, or one
temporary folder per process ``.tmp-<family>-f<format>-s<seed>-XXXX/`` (removed at exit or on
``release()``), its ``.owner`` file naming the process, and the sweep of the folders whose process
is gone. The files are the same two: ``probe.safetensors`` and ``probe.json`` (written last, with
the family), so the worker loads a family probe's folder as it loads the SD 1.x one.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Optional

from ...events import ProgressCallback, null_progress
from . import model as probe_model
from .families import DEFAULT_FAMILY, family_spec
from .model import ProbeModel, ProbeRecipe

__all__ = ["FAMILY_PROBE_NAME", "FAMILY_POOLS_NAME", "FAMILY_FORMAT_VERSION", "family_dir_name", "ensure_family_probe"]

FAMILY_FORMAT_VERSION = 2  # bump when the files a family probe's seed produces change (2: Qwen-Image's real MLP width)
# a family probe's names in the probe cache: <family>-f<format>-s<seed>/ and pools-<family>-f<format>-s<seed>-<dtype>.bin
FAMILY_PROBE_NAME = re.compile(r"^(?P<family>[a-z0-9][a-z0-9-]*)-f(?P<format>\d+)-s\d+\Z")
FAMILY_POOLS_NAME = re.compile(r"^pools-(?P<family>[a-z0-9][a-z0-9-]*)-f(?P<format>\d+)-s\d+-[A-Za-z0-9_]+\.bin\Z")


def family_dir_name(family: str, seed: int) -> str:
    """``<family>-f<format>-s<seed>`` (the SD 1.x probe keeps probe_model's ``sd1-f<format>-s<seed>``)."""
    if family == DEFAULT_FAMILY:
        return probe_model.probe_dir_name(seed)
    return f"{family}-f{FAMILY_FORMAT_VERSION}-s{seed}"


def ensure_family_probe(family: str, seed: int, cache_root: Path, progress: ProgressCallback = null_progress, *,
                        keep: bool = False, on_synthesis: Optional[Callable[[str], None]] = None) -> ProbeModel:
    """The probe model of ``family`` for ``seed``, with :func:`~.probe_model.ensure_probe_model`'s
    semantics (kept cache entry or one temporary folder per process, owner file, sweep of the folders
    of processes that are gone, ``on_synthesis``); ``sd1`` is that function's probe itself."""
    spec = family_spec(family)
    if spec.family == DEFAULT_FAMILY:
        return probe_model.ensure_probe_model(seed, cache_root, progress, keep=keep, on_synthesis=on_synthesis)
    probe_model.check_seed(seed)
    meta = {"format": "pt", "generator": "accelstack probe", "family": spec.family, "seed": str(seed),
            "probe_format": str(FAMILY_FORMAT_VERSION)}
    recipe = ProbeRecipe(family_dir_name(spec.family, seed), f"{spec.family} probe model", spec.parts, meta,
                         {"sdcpp_version": spec.sdcpp_version}, FAMILY_FORMAT_VERSION,
                         None if spec.quantized else f"pools-{spec.family}-f{FAMILY_FORMAT_VERSION}-s{seed}-{probe_model.DTYPE}.bin",
                         spec.family, spec.quantized)
    return probe_model.ensure_probe(recipe, seed, cache_root, progress, keep=keep, on_synthesis=on_synthesis)
