"""The probe model's values and files: a hashed pool of normal-like values, written as safetensors.

Instead of sampling 1.07 billion values, a *pool* of ``POOL`` (a prime, about 1 M)
standard-normal-like values is made once per seed, one copy of it in the stored dtype is kept per distinct scale
(about 20), and each tensor is filled with consecutive *windows* of its scale's pool that start
at pseudo-random offsets derived from ``sha256(seed, tensor name, window index)``. Writing a
tensor is then only ``write()`` calls of slices of a ready buffer: the cost is the disk's.
See :mod:`accelstack.engine.probes.model` for why the values still run.
"""
from __future__ import annotations

import hashlib
import json
import math
import struct
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from ...limits import MalformedInput, parse_json
from .architecture import Shape, value_rule

__all__ = ["POOL", "DTYPES", "Pools", "base_pool", "encode", "safetensors_header", "write_part", "write_parts",
           "scales_in_order", "pack_pools", "unpack_pools", "POOLS_MAGIC", "window_offset", "const_bytes"]

POOL = 1_048_573  # a prime, so windows never line up with power-of-two row lengths
# How values are stored. F16 is what a model ships as. F8_E5M2 is the high byte of an f16 (rounded to
# nearest): the same range, 2 mantissa bits; stable-diffusion.cpp widens it back to f16 as it loads, so
# the model in memory and every kernel that runs are those of an f16 model, from half the bytes.
DTYPES = {"F16": 2, "F8_E5M2": 1}


def _numpy() -> Any:
    """NumPy, imported when values are first encoded: a probe written from kept pools needs none
    (its import is a tenth of that whole synthesis)."""
    import numpy

    return numpy


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
    np = _numpy()
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


def window_offset(seed: int, name: str, window: int) -> int:
    digest = hashlib.sha256(f"{seed}\0{name}\0{window}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % POOL


class Pools:
    """Per seed and dtype: one doubled copy of the base pool per scale, so any window is a contiguous slice.

    :meth:`prefetch` encodes the scales a writer will need, in its order, on a helper thread: NumPy
    releases the GIL, so on two cores the encoding (about 15 ms per scale, 26 scales for SD 1.x) runs
    while the writer's ``write()`` calls copy the previous tensors into the page cache. The bytes are
    the same either way.
    """

    def __init__(self, seed: int, dtype: str = "F16") -> None:
        if dtype not in DTYPES:
            raise ValueError(f"unknown probe dtype {dtype!r}")
        self.seed = seed
        self.dtype = dtype
        self._base: Optional[Any] = None  # the float64 pool, made on first use
        self._scaled: Dict[float, memoryview] = {}
        self._pending: Dict[float, Future[memoryview]] = {}

    def prefetch(self, stds: Sequence[float]) -> None:
        """Start encoding the pools of ``stds`` (in that order) on a helper thread; :meth:`get` waits
        for one that is not ready yet. Call :meth:`close` when done (it cancels what is left)."""
        wanted = [std for std in dict.fromkeys(stds) if std not in self._scaled and std not in self._pending]
        if not wanted:
            return
        if self._base is None:
            self._base = base_pool(self.seed)
        executor = ThreadPoolExecutor(1, thread_name_prefix="probe-pools")
        for std in wanted:
            self._pending[std] = executor.submit(self._encode, std)
        executor.shutdown(wait=False)  # its thread ends after the last one

    def close(self) -> None:
        """Cancel the encodings not started yet (a writer that failed does not wait for them)."""
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()

    def _encode(self, std: float) -> memoryview:
        np = _numpy()
        if self._base is None:
            self._base = base_pool(self.seed)
        scaled = encode(self._base * std, self.dtype)
        return memoryview(np.concatenate([scaled, scaled]).tobytes())

    def preload(self, encoded: Dict[float, bytes]) -> None:
        """Use pools encoded earlier (:func:`unpack_pools`) instead of encoding them again (no
        NumPy needed then)."""
        for std, raw in encoded.items():
            self._scaled[std] = memoryview(raw + raw)

    def encoded(self, std: float) -> bytes:
        """The pool of ``std`` as stored (one copy, not doubled)."""
        return bytes(self.get(std)[:POOL * DTYPES[self.dtype]])

    def get(self, std: float) -> memoryview:
        view = self._scaled.get(std)
        if view is None:
            future = self._pending.pop(std, None)
            view = self._scaled[std] = future.result() if future is not None else self._encode(std)
        return view


def encode(values: Any, dtype: str = "F16") -> Any:
    """``values`` (float64) as a NumPy array of ``dtype``'s bytes: ``<f2``, or ``u1`` for F8_E5M2."""
    np = _numpy()
    half = np.asarray(values, dtype=np.float64).astype("<f2")
    if dtype == "F16":
        return half
    bits = half.view("<u2").astype(np.uint32)
    rounded = (bits + 0x7F + ((bits >> 8) & 1)) >> 8  # round to nearest, ties to even
    return rounded.astype(np.uint8)


def const_bytes(value: float, count: int, dtype: str = "F16") -> bytes:
    """``count`` copies of ``value`` encoded as :func:`encode` does, without NumPy (norm scales and
    biases: a synthesis from cached pools needs no NumPy at all)."""
    half = struct.pack("<e", value)
    if dtype == "F16":
        return half * count
    bits = struct.unpack("<H", half)[0]
    return bytes([(bits + 0x7F + ((bits >> 8) & 1)) >> 8]) * count


def safetensors_header(tensors: Dict[str, Shape], meta: Dict[str, str], dtype: str = "F16") -> bytes:
    """The length-prefixed JSON header of a safetensors file holding ``tensors``, all of ``dtype``."""
    entries: Dict[str, object] = {"__metadata__": meta}
    offset = 0
    for name, shape in tensors.items():
        n = math.prod(shape) * DTYPES[dtype]
        entries[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(entries, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % 8)  # data starts 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw


def write_part(path: Path, tensors: Dict[str, Shape], pools: Pools, meta: Dict[str, str],
               tick: Callable[[int], None], prefix: str = "") -> int:
    """Write one safetensors file of ``tensors`` (names prefixed with ``prefix``) in the pools'
    dtype; ``tick(n)`` after each tensor of n values."""
    return write_parts(path, {prefix: tensors}, pools, meta, tick)


def write_parts(path: Path, parts: Dict[str, Dict[str, Shape]], pools: Pools, meta: Dict[str, str],
                tick: Callable[[int], None]) -> int:
    """Write ``{prefix: {name: shape}}`` as one safetensors file whose tensors are named
    ``prefix + name``. A tensor's values depend on its name without the prefix, so a part has the
    same bytes in one file as in a file of its own."""
    size = DTYPES[pools.dtype]
    window_bytes = POOL * size
    written = 0
    stored = {prefix + name: shape for prefix, tensors in parts.items() for name, shape in tensors.items()}
    if len(stored) != sum(len(t) for t in parts.values()):
        raise ValueError("two tensors of the probe have the same prefixed name")
    with open(path, "wb", buffering=0) as fh:
        head = safetensors_header(stored, meta, pools.dtype)
        fh.write(head)
        for tensors in parts.values():
            for name, shape in tensors.items():
                count = math.prod(shape)
                kind, value = value_rule(name, shape)
                if kind == "const":
                    fh.write(const_bytes(value, count, pools.dtype))
                else:
                    pool = pools.get(value)
                    remaining, window = count * size, 0
                    while remaining:
                        take = min(remaining, window_bytes)
                        start = window_offset(pools.seed, name, window) * size
                        fh.write(pool[start:start + take])
                        remaining -= take
                        window += 1
                written += count
                tick(count)
    return written


def scales_in_order(parts: Dict[str, Dict[str, Shape]]) -> List[float]:
    """The scales of the random tensors of ``parts``, in the order :func:`write_parts` needs them."""
    return [value for tensors in parts.values() for name, shape in tensors.items()
            for kind, value in [value_rule(name, shape)] if kind == "random"]


# -- the encoded pools, kept between runs ----------------------------------------------------------
# Encoding 26 pools takes 0.3-0.4 s of CPU (float64 -> f16 -> F8 rounding of 1 M values each) and the
# writer waits on it: a file of them (26 MB) halves synthesis (0.45-0.7 s to 0.25 s here). It holds a
# JSON header (seed, dtype, pool size, the scales in order, the sha256 of the data) and the pools;
# anything that does not match exactly is ignored and the pools are encoded again.
POOLS_MAGIC = b"accelstack probe pools 1\n"
MAX_POOLS_HEADER = 1 << 16


def pack_pools(pools: Pools, stds: Sequence[float]) -> bytes:
    """``pools``' encodings of ``stds`` (in that order) as one file's bytes."""
    data = b"".join(pools.encoded(std) for std in stds)
    head = json.dumps({"seed": pools.seed, "dtype": pools.dtype, "pool": POOL, "scales": list(stds),
                       "sha256": hashlib.sha256(data).hexdigest()}).encode()
    return POOLS_MAGIC + struct.pack("<I", len(head)) + head + data


def unpack_pools(raw: bytes, seed: int, dtype: str, stds: Sequence[float]) -> Optional[Dict[float, bytes]]:
    """The pools of ``stds`` from :func:`pack_pools`'s bytes, or None unless they are exactly the
    pools for this seed, dtype and pool size, whole and unchanged."""
    start = len(POOLS_MAGIC) + 4
    if not raw.startswith(POOLS_MAGIC) or len(raw) < start:
        return None
    (n,) = struct.unpack("<I", raw[len(POOLS_MAGIC):start])
    if n > MAX_POOLS_HEADER or len(raw) < start + n:
        return None
    try:
        head = parse_json(raw[start:start + n], what="the probe's pools file", max_bytes=MAX_POOLS_HEADER, max_depth=3)
    except MalformedInput:
        return None
    size = POOL * DTYPES.get(dtype, 0)
    data = memoryview(raw)[start + n:]
    if (not isinstance(head, dict) or head.get("seed") != seed or head.get("dtype") != dtype
            or head.get("pool") != POOL or not isinstance(head.get("scales"), list)
            or len(data) != size * len(head["scales"]) or not set(stds) <= set(head["scales"])
            or head.get("sha256") != hashlib.sha256(data).hexdigest()):
        return None
    where = {std: i for i, std in enumerate(head["scales"]) if isinstance(std, float)}
    if not set(stds) <= set(where):
        return None
    return {std: bytes(data[where[std] * size:(where[std] + 1) * size]) for std in dict.fromkeys(stds)}
