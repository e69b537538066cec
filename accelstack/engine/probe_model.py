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

The folder is cached under ``<cache>/probe/sd1-f<FORMAT>-s<seed>/`` (``ACCELSTACK_PROBE_CACHE``
replaces ``<cache>/probe``; ``<cache>`` is ``ACCELSTACK_CACHE``, else the user cache dir), built in a temporary sibling and renamed into place, so a crash never leaves
a half-written probe that looks complete.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import struct
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

from ..events import ProgressCallback, ProgressEvent, null_progress
from .errors import ProbeModelError

FORMAT_VERSION = 1  # bump when the bytes a seed produces change
DEFAULT_SEED = 1234
POOL = 1_048_573  # a prime, so windows never line up with power-of-two row lengths
MARKER = "probe.json"
FILES = {
    "text_encoder": "text_encoder/model.safetensors",
    "unet": "unet/diffusion_pytorch_model.safetensors",
    "vae": "vae/diffusion_pytorch_model.safetensors",
}

Shape = Tuple[int, ...]


# --------------------------------------------------------------------------- architecture
def _linear(out: Dict[str, Shape], name: str, n_out: int, n_in: int, bias: bool = True) -> None:
    out[f"{name}.weight"] = (n_out, n_in)
    if bias:
        out[f"{name}.bias"] = (n_out,)


def _conv(out: Dict[str, Shape], name: str, n_out: int, n_in: int, k: int) -> None:
    out[f"{name}.weight"] = (n_out, n_in, k, k)
    out[f"{name}.bias"] = (n_out,)


def _norm(out: Dict[str, Shape], name: str, n: int) -> None:
    out[f"{name}.weight"] = (n,)
    out[f"{name}.bias"] = (n,)


def _resnet(out: Dict[str, Shape], name: str, n_in: int, n_out: int, temb: Optional[int]) -> None:
    _norm(out, f"{name}.norm1", n_in)
    _conv(out, f"{name}.conv1", n_out, n_in, 3)
    if temb:
        _linear(out, f"{name}.time_emb_proj", n_out, temb)
    _norm(out, f"{name}.norm2", n_out)
    _conv(out, f"{name}.conv2", n_out, n_out, 3)
    if n_in != n_out:
        _conv(out, f"{name}.conv_shortcut", n_out, n_in, 1)


def _transformer(out: Dict[str, Shape], name: str, c: int, context: int) -> None:
    _norm(out, f"{name}.norm", c)
    _conv(out, f"{name}.proj_in", c, c, 1)
    b = f"{name}.transformer_blocks.0"
    for attn, kv in (("attn1", c), ("attn2", context)):
        _linear(out, f"{b}.{attn}.to_q", c, c, bias=False)
        _linear(out, f"{b}.{attn}.to_k", c, kv, bias=False)
        _linear(out, f"{b}.{attn}.to_v", c, kv, bias=False)
        _linear(out, f"{b}.{attn}.to_out.0", c, c)
    _linear(out, f"{b}.ff.net.0.proj", 8 * c, c)  # GEGLU: value and gate
    _linear(out, f"{b}.ff.net.2", c, 4 * c)
    for i in (1, 2, 3):
        _norm(out, f"{b}.norm{i}", c)
    _conv(out, f"{name}.proj_out", c, c, 1)


def _unet() -> Dict[str, Shape]:
    out: Dict[str, Shape] = {}
    chans, temb, ctx, layers = (320, 640, 1280, 1280), 1280, 768, 2
    _conv(out, "conv_in", chans[0], 4, 3)
    _linear(out, "time_embedding.linear_1", temb, chans[0])
    _linear(out, "time_embedding.linear_2", temb, temb)
    skips = [chans[0]]
    prev = chans[0]
    for i, c in enumerate(chans):
        for j in range(layers):
            _resnet(out, f"down_blocks.{i}.resnets.{j}", prev if j == 0 else c, c, temb)
            if i < 3:
                _transformer(out, f"down_blocks.{i}.attentions.{j}", c, ctx)
            skips.append(c)
        if i < 3:
            _conv(out, f"down_blocks.{i}.downsamplers.0.conv", c, c, 3)
            skips.append(c)
        prev = c
    _resnet(out, "mid_block.resnets.0", chans[-1], chans[-1], temb)
    _transformer(out, "mid_block.attentions.0", chans[-1], ctx)
    _resnet(out, "mid_block.resnets.1", chans[-1], chans[-1], temb)
    rev = list(reversed(chans))
    prev = rev[0]
    for i, c in enumerate(rev):
        for j in range(layers + 1):
            skip = skips.pop()
            _resnet(out, f"up_blocks.{i}.resnets.{j}", (prev if j == 0 else c) + skip, c, temb)
            if i > 0:
                _transformer(out, f"up_blocks.{i}.attentions.{j}", c, ctx)
        if i < 3:
            _conv(out, f"up_blocks.{i}.upsamplers.0.conv", c, c, 3)
        prev = c
    _norm(out, "conv_norm_out", chans[0])
    _conv(out, "conv_out", 4, chans[0], 3)
    return out


def _vae_mid(out: Dict[str, Shape], name: str, c: int) -> None:
    _resnet(out, f"{name}.resnets.0", c, c, None)
    a = f"{name}.attentions.0"
    _norm(out, f"{a}.group_norm", c)
    for proj in ("to_q", "to_k", "to_v", "to_out.0"):
        _linear(out, f"{a}.{proj}", c, c)
    _resnet(out, f"{name}.resnets.1", c, c, None)


def _vae() -> Dict[str, Shape]:
    out: Dict[str, Shape] = {}
    chans, layers, latent = (128, 256, 512, 512), 2, 4
    _conv(out, "encoder.conv_in", chans[0], 3, 3)
    prev = chans[0]
    for i, c in enumerate(chans):
        for j in range(layers):
            _resnet(out, f"encoder.down_blocks.{i}.resnets.{j}", prev if j == 0 else c, c, None)
        if i < 3:
            _conv(out, f"encoder.down_blocks.{i}.downsamplers.0.conv", c, c, 3)
        prev = c
    _vae_mid(out, "encoder.mid_block", chans[-1])
    _norm(out, "encoder.conv_norm_out", chans[-1])
    _conv(out, "encoder.conv_out", 2 * latent, chans[-1], 3)
    _conv(out, "quant_conv", 2 * latent, 2 * latent, 1)
    _conv(out, "post_quant_conv", latent, latent, 1)
    _conv(out, "decoder.conv_in", chans[-1], latent, 3)
    _vae_mid(out, "decoder.mid_block", chans[-1])
    rev = list(reversed(chans))
    prev = rev[0]
    for i, c in enumerate(rev):
        for j in range(layers + 1):
            _resnet(out, f"decoder.up_blocks.{i}.resnets.{j}", prev if j == 0 else c, c, None)
        if i < 3:
            _conv(out, f"decoder.up_blocks.{i}.upsamplers.0.conv", c, c, 3)
        prev = c
    _norm(out, "decoder.conv_norm_out", chans[0])
    _conv(out, "decoder.conv_out", 3, chans[0], 3)
    return out


def _text_encoder() -> Dict[str, Shape]:
    out: Dict[str, Shape] = {}
    d, layers, vocab, positions = 768, 12, 49408, 77
    out["text_model.embeddings.token_embedding.weight"] = (vocab, d)
    out["text_model.embeddings.position_embedding.weight"] = (positions, d)
    for i in range(layers):
        p = f"text_model.encoder.layers.{i}"
        _norm(out, f"{p}.layer_norm1", d)
        _norm(out, f"{p}.layer_norm2", d)
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            _linear(out, f"{p}.self_attn.{proj}", d, d)
        _linear(out, f"{p}.mlp.fc1", 4 * d, d)
        _linear(out, f"{p}.mlp.fc2", d, 4 * d)
    _norm(out, "text_model.final_layer_norm", d)
    return out


def sd1_tensors() -> Dict[str, Dict[str, Shape]]:
    """Every tensor of an SD 1.x model in the diffusers layout: ``{part: {name: shape}}``."""
    return {"text_encoder": _text_encoder(), "unet": _unet(), "vae": _vae()}


def value_rule(name: str, shape: Shape) -> Tuple[str, float]:
    """How a tensor is filled: ``("const", v)`` or ``("random", std)``."""
    if len(shape) == 1:
        return ("const", 0.0) if name.endswith(".bias") else ("const", 1.0)
    if "embedding" in name:
        return ("random", 0.02)
    fan_in = math.prod(shape[1:])
    return ("random", 1.0 / math.sqrt(fan_in))


# --------------------------------------------------------------------------- values
def _splitmix64(counter, np):
    """The splitmix64 finalizer on a uint64 array (wrapping arithmetic is the point)."""
    z = counter + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def base_pool(seed: int, size: int = POOL):
    """``size`` float64 values, mean 0, variance 1: Irwin-Hall sums of 12 uniforms from a hash.

    Each 64-bit hash gives two 24-bit uniforms; sums of such dyadic numbers are exact in float64,
    so the result is bit-identical everywhere.
    """
    import numpy as np

    with np.errstate(over="ignore"):
        acc = np.zeros(size, dtype=np.float64)
        base = np.uint64((seed & 0xFFFFFFFF) << 32)
        idx = np.arange(size, dtype=np.uint64)
        for k in range(6):
            h = _splitmix64(base + idx * np.uint64(8) + np.uint64(k), np)
            acc += (h >> np.uint64(40)).astype(np.float64)
            acc += ((h >> np.uint64(8)) & np.uint64(0xFFFFFF)).astype(np.float64)
    acc *= 1.0 / (1 << 24)
    acc -= 6.0
    return acc


def _offset(seed: int, name: str, window: int) -> int:
    digest = hashlib.sha256(f"{seed}\0{name}\0{window}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % POOL


class _Pools:
    """One doubled f16 copy of the base pool per scale, so any window is a contiguous slice."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._base = None
        self._scaled: Dict[float, memoryview] = {}

    def get(self, std: float) -> memoryview:
        import numpy as np

        view = self._scaled.get(std)
        if view is None:
            if self._base is None:
                self._base = base_pool(self.seed)
            scaled = (self._base * std).astype("<f2")
            doubled = np.concatenate([scaled, scaled])
            view = self._scaled[std] = memoryview(doubled.tobytes())
        return view


def _const_bytes(value: float, count: int) -> bytes:
    import numpy as np

    return np.full(count, value, dtype="<f2").tobytes()


def _header(tensors: Dict[str, Shape], meta: Dict[str, str]) -> bytes:
    entries: Dict[str, object] = {"__metadata__": meta}
    offset = 0
    for name, shape in tensors.items():
        n = math.prod(shape) * 2
        entries[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(entries, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % 8)  # data starts 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw


def _write_part(path: Path, tensors: Dict[str, Shape], pools: _Pools, meta: Dict[str, str],
                tick) -> int:
    window_bytes = POOL * 2
    written = 0
    with open(path, "wb", buffering=0) as fh:
        head = _header(tensors, meta)
        fh.write(head)
        for name, shape in tensors.items():
            count = math.prod(shape)
            kind, value = value_rule(name, shape)
            if kind == "const":
                fh.write(_const_bytes(value, count))
            else:
                pool = pools.get(value)
                remaining, window = count * 2, 0
                while remaining:
                    take = min(remaining, window_bytes)
                    start = _offset(pools.seed, name, window) * 2
                    fh.write(pool[start:start + take])
                    remaining -= take
                    window += 1
            written += count
            tick(count)
    return written


# --------------------------------------------------------------------------- cache
PROBE_CACHE_ENV = "ACCELSTACK_PROBE_CACHE"


def probe_cache_root() -> Path:
    """``$ACCELSTACK_PROBE_CACHE``, else ``probe`` in the cache dir (``ACCELSTACK_CACHE``, else the
    user cache dir). The separate variable lets tests and CI share one probe across caches."""
    env = os.environ.get(PROBE_CACHE_ENV)
    if env:
        return Path(env).expanduser()
    from ..artifacts.cache import default_cache_dir

    return default_cache_dir() / "probe"


Architecture = Dict[str, Dict[str, Shape]]


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
    and experiments with smaller models; it gets its own cache folder.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0 or seed >= 2 ** 32:
        raise ProbeModelError(f"probe seed must be an integer in [0, 2**32), got {seed!r}")
    parts = architecture if architecture is not None else sd1_tensors()
    if set(parts) != set(FILES):
        raise ProbeModelError(f"a probe architecture needs exactly the parts {', '.join(FILES)}, got {', '.join(parts)}")
    root = Path(cache_root) if cache_root is not None else probe_cache_root()
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
                              hint="free disk space (it needs about 2.2 GB) or point ACCELSTACK_CACHE "
                              "at a writable disk") from None


def _synthesize(folder: Path, seed: int, parts: Architecture, progress: ProgressCallback) -> ProbeModel:
    start = time.perf_counter()
    total = sum(math.prod(s) for t in parts.values() for s in t.values())
    free = shutil.disk_usage(folder.parent).free
    need = 2 * total + (1 << 20)
    if free < need + (256 << 20):  # keep a margin: a full disk breaks more than this probe
        raise ProbeModelError(
            f"not enough disk space for the probe model at {folder.parent}: {need / 1e9:.1f} GB needed, "
            f"{free / 1e9:.1f} GB free", hint="free disk space or point ACCELSTACK_CACHE at a bigger disk")
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-" + folder.name + "-", dir=folder.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the probe is a shareable cache entry
    done = [0]
    task = f"probe model (seed {seed})"
    progress(ProgressEvent("start", "probe", task=task, total=total))

    def tick(n: int) -> None:
        done[0] += n
        progress(ProgressEvent("advance", "probe", task=task, done=done[0], total=total))

    try:
        pools = _Pools(seed)
        sizes = {}
        for part, tensors in parts.items():
            path = tmp / FILES[part]
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_part(path, tensors, pools, _meta(part, seed), tick)
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
