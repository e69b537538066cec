"""The probe model: a Stable Diffusion 1.x model with random weights, made here from a seed.

``verify`` must prove that a runtime generates without downloading a 2 GB model, so we
synthesize one: the full SD 1.x architecture (UNet 860 M, VAE 84 M, CLIP-L text encoder 123 M
parameters) in one folder that stable-diffusion.cpp loads::

    <dir>/probe.safetensors    the three parts, under the prefixes unet., vae., te.
    <dir>/probe.json           written last: the folder is complete

One file, not the diffusers folder of three (see :mod:`accelstack.engine.probes.layout` for why):
stable-diffusion.cpp gives a diffusers folder's files exactly these prefixes as it reads them, so
both load the same tensors through the same name conversion.

The tensor names and shapes are produced by :func:`sd1_tensors` from the architecture's
hyper-parameters (tests compare them with the reference list in ``shared/reference``).

How it is fast, and why the values still run
--------------------------------------------
1.07 billion f16 values in a few seconds instead of 34 s of ``normal()``: each tensor is windows of a
seeded pool of standard-normal-like values (:mod:`accelstack.engine.probes.weights`). The values follow
the rule that makes a random SD 1.x model load *and* run to a finite, non-constant image: norm scales 1,
biases 0, weights ~ N(0, 1) / sqrt(fan_in) (the LeCun rule: activations keep their scale through the
layers), embeddings ~ N(0, 1) x 0.02. Windows start at unrelated offsets of a prime-length pool, so rows
are not copies of each other in any systematic way; the pool's values are Irwin-Hall sums of 12 uniforms
(bounded by +-6: nothing overflows f16) from exact integer arithmetic, the same bytes everywhere.

Stored as F8_E5M2 (since format 2), synthesized per use, removed after
----------------------------------------------------------------------
Each value is stored as the high byte of its f16 (F8_E5M2: the f16 range, 2 mantissa bits);
stable-diffusion.cpp widens it back to f16 as it loads, so the model in memory, every kernel and
the check are those of an f16 SD 1.x model, from 1.07 GB written instead of 2.1 GB. No stored
form is small (ggml cannot block-quantize convolutions, 63 % of the weights), while synthesis is a
second or two: so by default (``keep=False``) the probe is written into a temporary folder
``<probe cache>/.tmp-sd1-f3-s<seed>-XXXX/`` (an ``.owner`` file names the process), reused by later
calls in the same process, removed when that process exits or on :meth:`ProbeModel.release`; a
killed process's folder is swept by the next call. ``keep=True`` keeps it as the cache entry
``<probe cache>/sd1-f3-s<seed>/`` (built in a temporary sibling and renamed into place, so a crash
never leaves a half-written probe that looks complete). The other families' probes are made by the
same code from their :class:`ProbeRecipe` (:mod:`accelstack.engine.probes.family_files`).
"""
from __future__ import annotations

import atexit
import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from ... import fsio
from ...errors import Action
from ...events import ProgressCallback, ProgressEvent, null_progress
from ...limits import read_capped
from ...serde import size_text
from ..errors import ProbeModelError
from . import layout as probe_layout
from .architecture import Architecture, Shape, sd1_tensors
from .gguf import gguf_size, quantized_prefixes, unquantized, write_gguf
from .owner import OWNER, has_owner, is_probe_folder, owner_text, temporary_probe_holder, temporary_probe_in_use
from .weights import DTYPES, POOL, Pools, pack_pools, scales_in_order, unpack_pools, write_parts

__all__ = ["PROBE_NAME", "TEMPORARY_NAME", "POOLS_NAME", "FORMAT_VERSION", "DEFAULT_SEED", "DTYPE", "MARKER", "WEIGHTS", "OWNER", "PARTS", "TEMP_PREFIX", "ProbeModel",
           "ProbeRecipe", "ensure_probe", "check_seed", "ensure_probe_model", "probe_dir_name", "pools_file_name", "temporary_probe_in_use", "temporary_probe_holder"]

log = logging.getLogger(__name__)

FORMAT_VERSION = 3  # bump when the files a seed produces change (2: values stored as F8_E5M2; 3: one file)
DTYPE = "F8_E5M2"
DEFAULT_SEED = 1234
MARKER = probe_layout.MARKER
WEIGHTS = probe_layout.WEIGHTS  # written as <name>.part inside a new private folder of the synthesis, then renamed
TEMP_PREFIX = ".tmp-"
# the probe cache's names (probe_dir_name, TEMP_PREFIX, pools_name): sd1-f<N>-s<seed>/ (custom-<10 hex>-… for
# test architectures), the temporary .tmp-…/ folders synthesis works in, pools-f<N>-s<seed>-<dtype>.bin
PROBE_NAME = re.compile(r"^(sd1|custom-[0-9a-f]{10})-f\d+-s\d+\Z")
TEMPORARY_NAME = re.compile(r"^\.tmp-[A-Za-z0-9_.-]+\Z")
POOLS_NAME = re.compile(r"^pools-f\d+-s\d+-[A-Za-z0-9_]+\.bin\Z")
MAX_POOLS_BYTES = 64 * POOL * DTYPES[DTYPE] + (1 << 16)  # the pools file: SD 1.x has 26 scales
PARTS = tuple(probe_layout.PREFIXES)  # the parts an architecture has, in the file's order


def probe_dir_name(seed: int, architecture: Optional[Architecture] = None) -> str:
    """``sd1-f<format>-s<seed>``; a non-default architecture adds a hash of its shapes."""
    name = f"sd1-f{FORMAT_VERSION}-s{seed}"
    if architecture is not None and architecture != sd1_tensors():
        digest = hashlib.sha256(json.dumps(architecture, sort_keys=True).encode()).hexdigest()[:10]
        name = f"custom-{digest}-f{FORMAT_VERSION}-s{seed}"
    return name


@dataclass
class ProbeModel:
    """A synthesized probe model folder; ``model`` is the file to load (an engine also takes ``path``)."""

    path: str
    seed: int
    format_version: int
    parameters: int
    size_bytes: int
    seconds: float = 0.0  # synthesis time; 0 when it came from the cache
    cached: bool = False
    temporary: bool = False  # removed when this process exits (or on release())
    dtype: str = DTYPE
    weights: str = WEIGHTS  # the weights file's name in the folder (probe.gguf: a quantized family probe)
    _owner_pid: int = field(default=0, repr=False, compare=False)

    @property
    def model(self) -> str:
        """The weights file, what stable-diffusion.cpp loads."""
        return os.path.join(self.path, self.weights)

    def release(self) -> None:
        """Remove a temporary probe now (a kept one stays); later calls synthesize it again."""
        if self.temporary:
            _forget(self.path)


# -- temporary folders: one per process, probe cache and model; removed at exit -----------------------
_TEMPORARY: Dict[str, ProbeModel] = {}  # folder path -> probe, for this process
_TEMP_LOCK = threading.Lock()
_SYNTH_LOCK = threading.Lock()


def _forget(path: str) -> None:
    with _TEMP_LOCK:
        probe = _TEMPORARY.pop(path, None)
    if probe is not None and probe._owner_pid == os.getpid():  # never a parent's folder, after a fork
        shutil.rmtree(path, ignore_errors=True)


@atexit.register
def _remove_temporaries() -> None:
    for path in list(_TEMPORARY):
        _forget(path)


def _sweep(root: Path) -> List[str]:
    """Remove temporary probe folders in ``root`` whose process is gone; return their names."""
    removed: List[str] = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(TEMP_PREFIX) or entry.is_symlink() or not entry.is_dir() or not has_owner(entry):
            continue  # without an owner record it is not a probe's folder (a person's, or one a kill left empty)
        if str(entry) in _TEMPORARY or temporary_probe_in_use(entry):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        log.info("removed the temporary probe %s of a process that is gone", entry)
        removed.append(entry.name)
    return removed


def _meta(seed: int) -> Dict[str, str]:
    return {"format": "pt", "generator": "accelstack probe", "seed": str(seed), "probe_format": str(FORMAT_VERSION),
            "parts": ",".join(f"{part}={prefix}" for part, prefix in probe_layout.PREFIXES.items())}


@dataclass(frozen=True)
class ProbeRecipe:
    """What one probe is, for :func:`ensure_probe`: the SD 1.x probe and each family's (probe_family_files)."""

    name: str  # the folder name in the probe cache (a temporary one adds TEMP_PREFIX and a suffix)
    label: str  # "probe model", "flux probe model": in progress events and messages
    parts: Callable[[], Dict[str, Dict[str, Shape]]]  # {prefix: {tensor name: shape}}, in the file's order
    meta: Dict[str, str]  # the safetensors header's __metadata__
    marker: Dict[str, Any]  # written into the marker beside the common fields
    format_version: int
    pools_file: Optional[str] = None  # the probe cache's file of this recipe's encoded pools; None: not kept
    family: Optional[str] = None  # the marker's "family" (None: the SD 1.x probe's marker, which has none)
    quantized: Tuple[str, ...] = ()  # tensor-name prefixes stored Q4_0: then a GGUF file (engine.probes.gguf)

    @property
    def weights(self) -> str:
        return probe_layout.GGUF_WEIGHTS if self.quantized else WEIGHTS

    @property
    def dtype(self) -> str:
        return "Q4_0+F16" if self.quantized else DTYPE


def _load_marker(folder: Path, recipe: ProbeRecipe) -> Optional[ProbeModel]:
    try:
        data = json.loads(read_capped(folder / MARKER, 64 << 10))
        if (data.get("family") != recipe.family or data["format_version"] != recipe.format_version
                or (folder / recipe.weights).stat().st_size != data["size"]):
            return None
        return ProbeModel(path=str(folder), seed=data["seed"], format_version=data["format_version"],
                          parameters=data["parameters"], size_bytes=data["size"], cached=True,
                          dtype=data.get("dtype", DTYPE), weights=recipe.weights)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def check_seed(seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0 or seed >= 2 ** 32:
        raise ProbeModelError(f"probe seed must be an integer in [0, 2**32), got {seed!r}")


def ensure_probe_model(seed: int, cache_root: Path, progress: ProgressCallback = null_progress,
                       architecture: Optional[Architecture] = None, *, keep: bool = False,
                       on_synthesis: Optional[Callable[[str], None]] = None) -> ProbeModel:
    """The probe model for ``seed``: reused, or synthesized now (under a second from the kept pools).

    ``keep=False`` (default): a kept folder if the probe cache has one, else one temporary folder
    per process, removed when it exits (see the module docstring). ``keep=True``: the kept cache
    entry, made now if missing. ``architecture`` (``{part: {name: shape}}``, default
    :func:`sd1_tensors`) exists for tests and experiments with smaller models; it gets its own
    folder. ``cache_root`` is the probe cache (the caller's ``Settings.probe_cache``).

    ``on_synthesis(path)`` is called when a temporary probe starts being written, with the path its
    weights file will have: the file is renamed into place whole, so a process started now can wait
    for it (``verify`` starts its worker there). It is not called when a probe is reused.
    """
    check_seed(seed)
    parts = architecture if architecture is not None else sd1_tensors()
    if set(parts) != set(PARTS):
        raise ProbeModelError(f"a probe architecture needs exactly the parts {', '.join(PARTS)}, got {', '.join(parts)}")
    recipe = ProbeRecipe(probe_dir_name(seed, architecture), "probe model",
                         lambda: {probe_layout.PREFIXES[part]: parts[part] for part in PARTS}, _meta(seed),
                         {"prefixes": probe_layout.PREFIXES}, FORMAT_VERSION,
                         pools_file_name(seed) if architecture is None else None)
    return ensure_probe(recipe, seed, cache_root, progress, keep=keep, on_synthesis=on_synthesis)


def ensure_probe(recipe: ProbeRecipe, seed: int, cache_root: Path, progress: ProgressCallback = null_progress, *,
                 keep: bool = False, on_synthesis: Optional[Callable[[str], None]] = None) -> ProbeModel:
    """``recipe``'s probe for ``seed``, with :func:`ensure_probe_model`'s semantics (a kept folder, else
    this process's temporary one, else synthesized now; the folders of processes that are gone swept)."""
    root = Path(cache_root)
    folder = root / recipe.name
    found = _load_marker(folder, recipe)
    if found is not None:
        return found
    try:
        root.mkdir(parents=True, exist_ok=True)
        if keep and (folder.is_symlink() or (folder.exists() and not is_probe_folder(folder, MARKER))):
            log.info("%s is not a probe folder accelstack made: a temporary probe is used instead", folder)
            keep = False  # never replaced: it is someone else's (issue 47)
        if not keep:
            with _SYNTH_LOCK:  # threads of one process (a server) share one temporary probe
                reused = _reuse_temporary(root, recipe)
                if reused is not None:
                    return reused
                _sweep(root)
                return _synthesize(recipe, root, None, seed, progress, on_synthesis)
        _sweep(root)
        from filelock import FileLock  # here: generating with a model file never takes the probe's lock

        with FileLock(str(folder) + ".lock"):
            found = _load_marker(folder, recipe)  # another process may have made it meanwhile
            if found is not None:
                return found
            return _synthesize(recipe, root, folder, seed, progress, None)
    except OSError as exc:
        raise ProbeModelError(f"cannot write the {recipe.label} under {root}: {exc.strerror or exc}",
                              hint="free disk space (verify needs the probe's size while it runs) or use a writable "
                              "cache directory", action=Action.FREE_DISK) from None


def pools_file_name(seed: int) -> str:
    """The probe cache's file of encoded value pools for ``seed`` (see :mod:`.probe_weights`)."""
    return f"pools-f{FORMAT_VERSION}-s{seed}-{DTYPE}.bin"


def _read_pools(path: Path, seed: int, scales: List[float]) -> Optional[Dict[float, bytes]]:
    try:  # a regular file only, not followed if a link, never blocking on a FIFO, and bounded
        raw = read_capped(path, MAX_POOLS_BYTES + 1)
    except OSError:
        return None
    if len(raw) > MAX_POOLS_BYTES:
        return None
    found = unpack_pools(raw, seed, DTYPE, scales)
    if found is None:
        log.info("ignoring %s: not the pools of this probe; encoding them again", path)
    return found


def _write_pools(path: Path, pools: Pools, scales: List[float]) -> None:
    """Keep the encoded pools for the next synthesis (a cache: failing to write it changes nothing)."""
    if not fsio.try_write_bytes(path, pack_pools(pools, list(dict.fromkeys(scales)))):
        log.info("could not keep the probe's pools in %s", path)


def _reuse_temporary(root: Path, recipe: ProbeRecipe) -> Optional[ProbeModel]:
    """This process's temporary probe of ``recipe`` in ``root``, when it is still whole."""
    with _TEMP_LOCK:
        mine = [p for path, p in _TEMPORARY.items()
                if Path(path).parent == root and Path(path).name.startswith(f"{TEMP_PREFIX}{recipe.name}-")]
    for probe in mine:
        if _load_marker(Path(probe.path), recipe) is not None:
            return dataclasses.replace(probe, cached=True, seconds=0.0)
        _forget(probe.path)  # damaged meanwhile: made again
    return None


def _synthesize(recipe: ProbeRecipe, root: Path, folder: Optional[Path], seed: int, progress: ProgressCallback,
                on_synthesis: Optional[Callable[[str], None]] = None) -> ProbeModel:
    """Write the probe into a new temporary folder in ``root``; rename it to ``folder`` when kept."""
    start = time.perf_counter()
    parts = recipe.parts()
    total = sum(math.prod(s) for t in parts.values() for s in t.values())
    quantized = quantized_prefixes(recipe.quantized) if recipe.quantized else None  # then a GGUF file
    free = shutil.disk_usage(root).free
    need = (gguf_size(parts, recipe.meta, quantized) if quantized else DTYPES[DTYPE] * total) + (1 << 20)
    if free < need + (256 << 20):  # keep a margin: a full disk breaks more than this probe
        raise ProbeModelError(
            f"not enough disk space for the {recipe.label} at {root}: {size_text(need)} needed, "
            f"{size_text(free)} free", hint="free disk space or use a cache directory on a bigger disk",
            action=Action.FREE_DISK)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{recipe.name}-", dir=root))
    tmp.chmod(0o755)  # mkdtemp makes it private; the probe is a shareable cache entry
    probe = ProbeModel(path=str(tmp), seed=seed, format_version=recipe.format_version, parameters=total, size_bytes=0,
                       temporary=folder is None, dtype=recipe.dtype, weights=recipe.weights, _owner_pid=os.getpid())
    if folder is None:
        with _TEMP_LOCK:
            _TEMPORARY[str(tmp)] = probe  # from now on removed at exit, whatever happens below
    log.info("synthesizing the %s (seed %d, %s) in %s", recipe.label, seed, recipe.dtype, tmp)
    done = [0]
    task = f"{recipe.label} (seed {seed})"
    progress(ProgressEvent("start", "probe", task=task, total=total, extra={"unit": "B"},
                           message=f"synthesizing the {recipe.label} ({size_text(need)}, removed after)"))

    def tick(n: int) -> None:
        done[0] += n
        progress(ProgressEvent("advance", "probe", task=task, done=done[0], total=total, extra={"unit": "B"}))

    try:
        fsio.write_text(tmp / OWNER, owner_text(), durable=False)
        if on_synthesis is not None and folder is None:
            on_synthesis(str(tmp / recipe.weights))  # the path the weights will appear at, whole
        pools = Pools(seed, "F16" if recipe.quantized else DTYPE)
        scales = scales_in_order(unquantized(parts, quantized) if quantized else parts)  # the F16/F8 pools read
        pools_file = root / recipe.pools_file if recipe.pools_file else None
        reused = _read_pools(pools_file, seed, scales) if pools_file is not None else None
        if reused is not None:
            pools.preload(reused)
        else:
            pools.prefetch(scales)  # encoded on a helper thread while the file is written
        partial = tmp / (recipe.weights + ".part")
        try:
            if quantized is not None:
                write_gguf(partial, parts, pools, recipe.meta, tick, quantized)
            else:
                write_parts(partial, parts, pools, recipe.meta, tick)
        finally:
            pools.close()
        os.replace(partial, tmp / recipe.weights)  # whole when it appears (a worker may be waiting for it)
        if pools_file is not None and reused is None:
            _write_pools(pools_file, pools, scales)
        size = (tmp / recipe.weights).stat().st_size
        marker = {"seed": seed, "format_version": recipe.format_version, "parameters": total, "size": size,
                  "dtype": recipe.dtype, "prefixes": list(parts), **recipe.marker,
                  "method": "windows of a hashed Irwin-Hall pool, see accelstack.engine.probes.model"}
        if recipe.family is not None:
            marker["family"] = recipe.family
        fsio.write_text(tmp / MARKER, json.dumps(marker, indent=2), durable=False)  # read whole or not at all
        probe.size_bytes = size
        if folder is not None:
            (tmp / OWNER).unlink()
            if folder.exists():  # an incomplete or stale folder (no valid marker): replace it
                shutil.rmtree(folder)
            os.replace(tmp, folder)
            probe.path = str(folder)
    except BaseException:
        progress(ProgressEvent("end", "probe", task=task, ok=False, done=done[0], total=total))
        _forget(str(tmp))
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    probe.seconds = round(time.perf_counter() - start, 3)
    progress(ProgressEvent("end", "probe", task=task, ok=True, done=total, total=total))
    return probe
