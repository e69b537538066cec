"""Where a family's probe lives: probe_model's cache and temporary folders, for the other families.

The rules are the SD 1.x probe's (:mod:`accelstack.engine.probe_model`), reused, not copied: a kept
cache entry ``<family>-f<format>-s<seed>/``, or one temporary folder per process
``.tmp-<family>-f<format>-s<seed>-XXXX/`` registered with probe_model's list of this process's
temporaries (removed at exit or on ``release()``), its ``.owner`` file naming the process, and the
sweep of the folders whose process is gone. The files are the same two: ``probe.safetensors`` and
``probe.json`` (written last), so the worker loads a family probe's folder as it loads the SD 1.x one.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

from filelock import FileLock

from .. import fsio
from ..errors import Action
from ..events import ProgressCallback, ProgressEvent, null_progress
from ..limits import read_capped
from ..serde import size_text
from . import probe_model
from .errors import ProbeModelError
from .probe_families import DEFAULT_FAMILY, FamilyProbeSpec, family_spec
from .probe_model import ProbeModel
from .probe_weights import DTYPES, Pools, scales_in_order, write_parts

__all__ = ["FAMILY_FORMAT_VERSION", "family_dir_name", "ensure_family_probe"]

FAMILY_FORMAT_VERSION = 1  # bump when the files a family probe's seed produces change


def family_dir_name(family: str, seed: int) -> str:
    """``<family>-f<format>-s<seed>`` (the SD 1.x probe keeps probe_model's ``sd1-f<format>-s<seed>``)."""
    if family == DEFAULT_FAMILY:
        return probe_model.probe_dir_name(seed)
    return f"{family}-f{FAMILY_FORMAT_VERSION}-s{seed}"


def _load_family_marker(folder: Path, family: str) -> Optional[ProbeModel]:
    try:
        data = json.loads(read_capped(folder / probe_model.MARKER, 64 << 10))
        if (data.get("family") != family or data["format_version"] != FAMILY_FORMAT_VERSION
                or (folder / probe_model.WEIGHTS).stat().st_size != data["size"]):
            return None
        return ProbeModel(path=str(folder), seed=data["seed"], format_version=data["format_version"],
                          parameters=data["parameters"], size_bytes=data["size"], cached=True,
                          dtype=data.get("dtype", probe_model.DTYPE))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _reuse_family_temporary(root: Path, name: str, family: str) -> Optional[ProbeModel]:
    """This process's temporary probe ``name`` in ``root`` when still whole (probe_model's registry)."""
    with probe_model._TEMP_LOCK:
        mine = [p for path, p in probe_model._TEMPORARY.items()
                if Path(path).parent == root and Path(path).name.startswith(f"{probe_model.TEMP_PREFIX}{name}-")]
    for probe in mine:
        if _load_family_marker(Path(probe.path), family) is not None:
            return dataclasses.replace(probe, cached=True, seconds=0.0)
        probe_model._forget(probe.path)
    return None


def ensure_family_probe(family: str, seed: int, cache_root: Path, progress: ProgressCallback = null_progress, *,
                        keep: bool = False, on_synthesis: Optional[Callable[[str], None]] = None) -> ProbeModel:
    """The probe model of ``family`` for ``seed``, with :func:`~.probe_model.ensure_probe_model`'s
    semantics (kept cache entry or one temporary folder per process, owner file, sweep of the folders
    of processes that are gone, ``on_synthesis``); ``sd1`` is that function's probe itself."""
    spec = family_spec(family)
    if spec.family == DEFAULT_FAMILY:
        return probe_model.ensure_probe_model(seed, cache_root, progress, keep=keep, on_synthesis=on_synthesis)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0 or seed >= 2 ** 32:
        raise ProbeModelError(f"probe seed must be an integer in [0, 2**32), got {seed!r}")
    root = Path(cache_root)
    name = family_dir_name(spec.family, seed)
    folder = root / name
    found = _load_family_marker(folder, spec.family)
    if found is not None:
        return found
    try:
        root.mkdir(parents=True, exist_ok=True)
        if not keep:
            with probe_model._SYNTH_LOCK:
                reused = _reuse_family_temporary(root, name, spec.family)
                if reused is not None:
                    return reused
                probe_model._sweep(root)
                return _synthesize(spec, root, name, None, seed, progress, on_synthesis)
        probe_model._sweep(root)
        with FileLock(str(folder) + ".lock"):
            found = _load_family_marker(folder, spec.family)
            if found is not None:
                return found
            return _synthesize(spec, root, name, folder, seed, progress, None)
    except OSError as exc:
        raise ProbeModelError(f"cannot write the {spec.family} probe model under {root}: {exc.strerror or exc}",
                              hint="free disk space or use a writable cache directory", action=Action.FREE_DISK) from None


def _synthesize(spec: FamilyProbeSpec, root: Path, name: str, folder: Optional[Path], seed: int,
                progress: ProgressCallback, on_synthesis: Optional[Callable[[str], None]]) -> ProbeModel:
    """Write ``spec``'s probe into a new temporary folder in ``root`` (renamed to ``folder`` when kept):
    the steps of probe_model's synthesis, with this family's parts and marker."""
    start = time.perf_counter()
    parts = spec.parts()
    dtype = probe_model.DTYPE
    total = sum(math.prod(s) for t in parts.values() for s in t.values())
    need = DTYPES[dtype] * total + (1 << 20)
    free = shutil.disk_usage(root).free
    if free < need + (256 << 20):
        raise ProbeModelError(f"not enough disk space for the {spec.family} probe model at {root}: {size_text(need)} "
                              f"needed, {size_text(free)} free", hint="free disk space or use a cache directory on a "
                              "bigger disk", action=Action.FREE_DISK)
    tmp = Path(tempfile.mkdtemp(prefix=f"{probe_model.TEMP_PREFIX}{name}-", dir=root))
    tmp.chmod(0o755)
    probe = ProbeModel(path=str(tmp), seed=seed, format_version=FAMILY_FORMAT_VERSION, parameters=total, size_bytes=0,
                       temporary=folder is None, dtype=dtype, _owner_pid=os.getpid())
    if folder is None:
        with probe_model._TEMP_LOCK:
            probe_model._TEMPORARY[str(tmp)] = probe  # removed at exit (probe_model's atexit), whatever happens
    task = f"{spec.family} probe model (seed {seed})"
    done = [0]
    progress(ProgressEvent("start", "probe", task=task, total=total, extra={"unit": "B"},
                           message=f"synthesizing the {spec.family} probe model ({size_text(need)}, removed after)"))

    def tick(n: int) -> None:
        done[0] += n
        progress(ProgressEvent("advance", "probe", task=task, done=done[0], total=total, extra={"unit": "B"}))

    try:
        fsio.write_text(tmp / probe_model.OWNER, probe_model._owner_text(), durable=False)
        if on_synthesis is not None and folder is None:
            on_synthesis(str(tmp / probe_model.WEIGHTS))
        pools = Pools(seed, dtype)
        scales = scales_in_order(parts)
        pools_file = root / f"pools-{spec.family}-f{FAMILY_FORMAT_VERSION}-s{seed}-{dtype}.bin"
        reused = probe_model._read_pools(pools_file, seed, scales)
        if reused is not None:
            pools.preload(reused)
        else:
            pools.prefetch(scales)
        partial = tmp / probe_model.PARTIAL_WEIGHTS
        meta = {"format": "pt", "generator": "accelstack probe", "family": spec.family, "seed": str(seed),
                "probe_format": str(FAMILY_FORMAT_VERSION)}
        try:
            write_parts(partial, parts, pools, meta, tick)
        finally:
            pools.close()
        os.replace(partial, tmp / probe_model.WEIGHTS)
        if reused is None:
            probe_model._write_pools(pools_file, pools, scales)
        size = (tmp / probe_model.WEIGHTS).stat().st_size
        marker = {"family": spec.family, "seed": seed, "format_version": FAMILY_FORMAT_VERSION, "parameters": total,
                  "size": size, "dtype": dtype, "prefixes": list(parts), "sdcpp_version": spec.sdcpp_version,
                  "method": "windows of a hashed Irwin-Hall pool, see accelstack.engine.probe_model"}
        fsio.write_text(tmp / probe_model.MARKER, json.dumps(marker, indent=2), durable=False)
        probe.size_bytes = size
        if folder is not None:
            (tmp / probe_model.OWNER).unlink()
            if folder.exists():
                shutil.rmtree(folder)
            os.replace(tmp, folder)
            probe.path = str(folder)
    except BaseException:
        progress(ProgressEvent("end", "probe", task=task, ok=False, done=done[0], total=total))
        probe_model._forget(str(tmp))
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    probe.seconds = round(time.perf_counter() - start, 3)
    progress(ProgressEvent("end", "probe", task=task, ok=True, done=total, total=total))
    return probe
