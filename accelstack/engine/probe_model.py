"""The probe model: a Stable Diffusion 1.x model with random weights, made here from a seed.

``verify`` must prove that a runtime generates without downloading a 2 GB model, so we
synthesize one: the full SD 1.x architecture (UNet 860 M, VAE 84 M, CLIP-L text encoder 123 M
parameters) in the diffusers folder layout that stable-diffusion.cpp loads::

    <dir>/unet/diffusion_pytorch_model.safetensors
    <dir>/vae/diffusion_pytorch_model.safetensors
    <dir>/text_encoder/model.safetensors
    <dir>/probe.json                      written last: the folder is complete

The tensor names and shapes are produced by :func:`sd1_tensors` from the architecture's
hyper-parameters (tests compare them with the reference list in ``shared/reference``).

How it is fast (1.07 billion f16 values in a few seconds instead of 34 s of ``normal()``)
----------------------------------------------------------------------------------------
Values follow the rule that makes a random SD 1.x model load *and* run to a finite,
non-constant image: norm scales 1, biases 0, weights ~ N(0, 1) / sqrt(fan_in), embeddings
~ N(0, 1) x 0.02. Instead of sampling every value, we sample a *pool* of ``POOL`` (a prime,
about 1 M) standard-normal-like values once, keep one f16 copy of the pool per distinct scale
(there are about 20), and fill each tensor with consecutive *windows* of its scale's pool that
start at pseudo-random offsets derived from ``sha256(seed, tensor name, window index)``. Writing
a tensor is then only ``write()`` calls of slices of a ready buffer: the cost is the disk's.

Why the values still run: every weight has the same marginal distribution (zero mean, unit
variance before scaling, so activations keep their scale through the layers, the LeCun rule) as
independent sampling would give; windows start at unrelated offsets of a prime-length pool, so
rows and channels are not copies of each other in any systematic way; the pool's values are
Irwin-Hall sums of 12 uniforms (mean 0, variance 1, bounded by +-6), so there are no extreme
outliers that could overflow f16. The pool comes from a splitmix64 counter hash with exact
integer and float arithmetic, so a seed gives the same bytes on every machine and NumPy version.

The shapes live in :mod:`accelstack.engine.probe_architecture`, the values and the file writing
in :mod:`accelstack.engine.probe_weights`; this module keeps the cache. The folder is cached
under ``<probe cache>/sd1-f<FORMAT>-s<seed>/`` (the caller's ``cache_root``, else
``Settings.resolve().probe_cache``), built in a temporary sibling and renamed into place, so a
crash never leaves a half-written probe that looks complete.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

from ..errors import Action
from ..events import ProgressCallback, ProgressEvent, null_progress
from ..settings import Settings
from .errors import ProbeModelError
from .probe_architecture import Architecture, sd1_tensors
from .probe_weights import Pools, write_part

__all__ = ["FORMAT_VERSION", "DEFAULT_SEED", "MARKER", "FILES", "ProbeModel", "ensure_probe_model", "probe_dir_name"]

log = logging.getLogger(__name__)

FORMAT_VERSION = 1  # bump when the bytes a seed produces change
DEFAULT_SEED = 1234
MARKER = "probe.json"
FILES = {
    "text_encoder": "text_encoder/model.safetensors",
    "unet": "unet/diffusion_pytorch_model.safetensors",
    "vae": "vae/diffusion_pytorch_model.safetensors",
}


def probe_dir_name(seed: int, architecture: Optional[Architecture] = None) -> str:
    """``sd1-f<format>-s<seed>``; a non-default architecture adds a hash of its shapes."""
    name = f"sd1-f{FORMAT_VERSION}-s{seed}"
    if architecture is not None and architecture != sd1_tensors():
        digest = hashlib.sha256(json.dumps(architecture, sort_keys=True).encode()).hexdigest()[:10]
        name = f"custom-{digest}-f{FORMAT_VERSION}-s{seed}"
    return name


@dataclass
class ProbeModel:
    """A synthesized probe model folder (pass ``path`` as the model path)."""

    path: str
    seed: int
    format_version: int
    parameters: int
    size_bytes: int
    seconds: float = 0.0  # synthesis time; 0 when it came from the cache
    cached: bool = False


def _meta(part: str, seed: int) -> Dict[str, str]:
    return {"format": "pt", "generator": "accelstack probe", "part": part, "seed": str(seed),
            "probe_format": str(FORMAT_VERSION)}


def _load_marker(folder: Path) -> Optional[ProbeModel]:
    marker = folder / MARKER
    try:
        data = json.loads(marker.read_text())
        for part, rel in FILES.items():
            if (folder / rel).stat().st_size != data["sizes"][part]:
                return None
        return ProbeModel(path=str(folder), seed=data["seed"], format_version=data["format_version"],
                          parameters=data["parameters"], size_bytes=sum(data["sizes"].values()), cached=True)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def ensure_probe_model(seed: int = DEFAULT_SEED, cache_root: Optional[Path] = None,
                       progress: ProgressCallback = null_progress,
                       architecture: Optional[Architecture] = None) -> ProbeModel:
    """The probe model for ``seed``: from the cache, or synthesized now (a few seconds).

    ``architecture`` (``{part: {name: shape}}``, default :func:`sd1_tensors`) exists for tests
    and experiments with smaller models; it gets its own cache folder. ``cache_root`` defaults
    to ``Settings.resolve().probe_cache``.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0 or seed >= 2 ** 32:
        raise ProbeModelError(f"probe seed must be an integer in [0, 2**32), got {seed!r}")
    parts = architecture if architecture is not None else sd1_tensors()
    if set(parts) != set(FILES):
        raise ProbeModelError(f"a probe architecture needs exactly the parts {', '.join(FILES)}, got {', '.join(parts)}")
    root = Path(cache_root) if cache_root is not None else Settings.resolve().probe_cache
    folder = root / probe_dir_name(seed, architecture)
    found = _load_marker(folder)
    if found is not None:
        return found
    try:
        root.mkdir(parents=True, exist_ok=True)
        from filelock import FileLock

        with FileLock(str(folder) + ".lock"):
            found = _load_marker(folder)  # another process may have made it meanwhile
            if found is not None:
                return found
            return _synthesize(folder, seed, parts, progress)
    except OSError as exc:
        raise ProbeModelError(f"cannot write the probe model under {root}: {exc.strerror or exc}",
                              hint="free disk space (it needs about 2.2 GB) or use a writable cache directory",
                              action=Action.FREE_DISK) from None


def _synthesize(folder: Path, seed: int, parts: Architecture, progress: ProgressCallback) -> ProbeModel:
    start = time.perf_counter()
    log.info("synthesizing the probe model (seed %d) in %s", seed, folder)
    total = sum(math.prod(s) for t in parts.values() for s in t.values())
    free = shutil.disk_usage(folder.parent).free
    need = 2 * total + (1 << 20)
    if free < need + (256 << 20):  # keep a margin: a full disk breaks more than this probe
        raise ProbeModelError(
            f"not enough disk space for the probe model at {folder.parent}: {need / 1e9:.1f} GB needed, "
            f"{free / 1e9:.1f} GB free", hint="free disk space or use a cache directory on a bigger disk",
            action=Action.FREE_DISK)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-" + folder.name + "-", dir=folder.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the probe is a shareable cache entry
    done = [0]
    task = f"probe model (seed {seed})"
    progress(ProgressEvent("start", "probe", task=task, total=total))

    def tick(n: int) -> None:
        done[0] += n
        progress(ProgressEvent("advance", "probe", task=task, done=done[0], total=total))

    try:
        pools = Pools(seed)
        sizes = {}
        for part, tensors in parts.items():
            path = tmp / FILES[part]
            path.parent.mkdir(parents=True, exist_ok=True)
            write_part(path, tensors, pools, _meta(part, seed), tick)
            sizes[part] = path.stat().st_size
        marker = {"seed": seed, "format_version": FORMAT_VERSION, "parameters": total, "sizes": sizes,
                  "method": "windows of a hashed Irwin-Hall pool, see accelstack.engine.probe_model"}
        (tmp / MARKER).write_text(json.dumps(marker, indent=2))
        if folder.exists():  # an incomplete or stale folder (no valid marker): replace it
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    except BaseException:
        progress(ProgressEvent("end", "probe", task=task, ok=False, done=done[0], total=total))
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    seconds = time.perf_counter() - start
    progress(ProgressEvent("end", "probe", task=task, ok=True, done=total, total=total))
    return ProbeModel(path=str(folder), seed=seed, format_version=FORMAT_VERSION, parameters=total,
                      size_bytes=sum(sizes.values()), seconds=round(seconds, 3), cached=False)
