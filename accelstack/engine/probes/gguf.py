"""A probe written as GGUF, its large matrices block-quantized to Q4_0: for the families no safetensors probe fits.

Some families cannot be reduced: stable-diffusion.cpp fixes Z-Image's DiT at 30 + 4 blocks of 3840
(src/z_image.hpp ``ZImageParams``: 6.15 G parameters, 12.3 GB as the f16 every safetensors probe is
widened to on load). Stored as Q4_0, the form users with small GPUs run such a model in (GGUF files
of Q4_0 and the k-quants), it is 3.5 GB on disk and in memory, and every matrix product runs the
quantized kernels the runtime runs for them.

The values follow :mod:`accelstack.engine.probes.weights`' rule: each tensor is windows of a seeded
pool at pseudo-random offsets. A Q4_0 pool is made from the same base pool: blocks of 32 values
``(q - 8) * d``, one scale ``d`` per pool so the values' standard deviation is the rule's, the
4-bit ``q`` in 1..15 (symmetric around 8: a mean of zero, as the rule's values have). Tensors that
are not quantized (norms, biases, convolutions, small or unaligned matrices) are stored F16 from the
F16 pools.

The file is GGUF version 3 as ggml reads it (ggml/src/gguf.cpp): header, string metadata, tensor
infos (dimensions innermost first), data aligned to 32 bytes. Names must fit the runtime's 128-byte buffer (``GGML_MAX_NAME``).
"""
from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..models.gguf_check import GGML_MAX_NAME, GGUF_DEFAULT_ALIGNMENT, GGUF_STRING
from .architecture import Shape, value_rule
from .weights import POOL, Pools, const_bytes, window_offset

__all__ = ["Q4_BLOCK", "Q4_BLOCK_BYTES", "Q4Pools", "gguf_size", "write_gguf", "quantized_prefixes", "unquantized"]

GGUF_MAGIC, GGUF_VERSION = b"GGUF", 3
TYPE_F16, TYPE_Q4_0 = 1, 2  # ggml_type ids (include/ggml.h)
Q4_BLOCK, Q4_BLOCK_BYTES = 32, 18  # block_q4_0: an f16 scale and 16 bytes of 4-bit values
Q4_POOL_BLOCKS = POOL // Q4_BLOCK
Quantized = Callable[[str, Shape], bool]


class Q4Pools:
    """Per seed: one doubled pool of Q4_0 blocks per standard deviation (a window is one slice). The 4-bit
    values are the same for every deviation; only the blocks' scale ``d`` differs."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._packed: Optional[Any] = None  # the blocks' 16 bytes of values, once
        self._spread = 1.0  # the values' standard deviation, in units of d
        self._pools: Dict[float, memoryview] = {}

    def get(self, std: float) -> memoryview:
        pool = self._pools.get(std)
        if pool is None:
            pool = self._pools[std] = self._encode(std)
        return pool

    def _encode(self, std: float) -> memoryview:
        import numpy as np

        from .weights import base_pool

        if self._packed is None:
            q = np.clip(np.rint(base_pool(self.seed)[:Q4_POOL_BLOCKS * Q4_BLOCK] * 2.0), -7, 7)  # symmetric: never nibble 0
            self._spread = float(q.std())
            nibbles = (q + 8).astype(np.uint8).reshape(Q4_POOL_BLOCKS, Q4_BLOCK)
            self._packed = nibbles[:, :16] | (nibbles[:, 16:] << 4)  # qs[j]: value j low, value j + 16 high
        blocks = np.empty((Q4_POOL_BLOCKS, Q4_BLOCK_BYTES), dtype=np.uint8)
        blocks[:, :2] = np.frombuffer(np.float16(std / self._spread).tobytes(), dtype=np.uint8)
        blocks[:, 2:] = self._packed
        raw = blocks.tobytes()
        return memoryview(raw + raw)


Entry = Tuple[str, str, Shape]  # (prefix, name without it, shape): values follow the name, the type the whole name


def _entries(parts: Dict[str, Dict[str, Shape]]) -> List[Entry]:
    entries = [(prefix, name, shape) for prefix, tensors in parts.items() for name, shape in tensors.items()]
    if len({prefix + name for prefix, name, _ in entries}) != len(entries):
        raise ValueError("two tensors of the probe have the same prefixed name")
    return entries


def _q4(entry: Entry, quantized: Quantized) -> bool:
    prefix, name, shape = entry
    return len(shape) == 2 and shape[-1] % Q4_BLOCK == 0 and value_rule(name, shape)[0] == "random" \
        and quantized(prefix + name, shape)


def _nbytes(entry: Entry, quantized: Quantized) -> int:
    count = math.prod(entry[2])
    return count // Q4_BLOCK * Q4_BLOCK_BYTES if _q4(entry, quantized) else 2 * count


def _pad(n: int) -> int:
    return -n % GGUF_DEFAULT_ALIGNMENT


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _header(entries: List[Entry], meta: Dict[str, str], quantized: Quantized) -> bytes:
    out = [GGUF_MAGIC, struct.pack("<IQQ", GGUF_VERSION, len(entries), len(meta))]
    for key, value in meta.items():
        out += [_string(f"accelstack.{key}"), struct.pack("<I", GGUF_STRING), _string(value)]
    offset = 0
    for entry in entries:
        prefix, name, shape = entry
        full = prefix + name
        if len(full.encode()) >= GGML_MAX_NAME:
            raise ValueError(f"tensor name {full!r} does not fit the runtime's {GGML_MAX_NAME}-byte name buffer")
        kind = TYPE_Q4_0 if _q4(entry, quantized) else TYPE_F16
        out += [_string(full), struct.pack("<I", len(shape)), *(struct.pack("<Q", d) for d in reversed(shape)),
                struct.pack("<IQ", kind, offset)]
        n = _nbytes(entry, quantized)
        offset += n + _pad(n)
    head = b"".join(out)
    return head + b"\0" * _pad(len(head))


def gguf_size(parts: Dict[str, Dict[str, Shape]], meta: Dict[str, str], quantized: Quantized) -> int:
    """The size of :func:`write_gguf`'s file, before writing it (the disk-space check)."""
    entries = _entries(parts)
    sizes = [_nbytes(entry, quantized) for entry in entries]
    return len(_header(entries, meta, quantized)) + sum(n + _pad(n) for n in sizes)


def write_gguf(path: Path, parts: Dict[str, Dict[str, Shape]], pools: Pools, meta: Dict[str, str],
               tick: Callable[[int], None], quantized: Quantized) -> int:
    """Write ``{prefix: {name: shape}}`` as one GGUF file: the tensors ``quantized`` names (2-D, rows a
    multiple of 32, random) as Q4_0, the others F16 from ``pools`` (F16); ``tick(n)`` after each."""
    if pools.dtype != "F16":
        raise ValueError("a GGUF probe stores its unquantized tensors as F16")
    q4 = Q4Pools(pools.seed)
    entries = _entries(parts)
    head = _header(entries, meta, quantized)  # a name the runtime cannot hold is refused before the file exists
    written = 0
    with open(path, "wb", buffering=0) as fh:
        fh.write(head)
        for entry in entries:
            _prefix, name, shape = entry
            count = math.prod(shape)
            kind, value = value_rule(name, shape)
            n = _nbytes(entry, quantized)
            if _q4(entry, quantized):
                _windows(fh, q4.get(value), Q4_POOL_BLOCKS * Q4_BLOCK_BYTES, n, pools.seed, name, Q4_POOL_BLOCKS,
                         Q4_BLOCK_BYTES)
            elif kind == "const":
                fh.write(const_bytes(value, count, "F16"))
            else:
                _windows(fh, pools.get(value), POOL * 2, n, pools.seed, name, POOL, 2)
            fh.write(b"\0" * _pad(n))
            written += count
            tick(count)
    return written


def _windows(fh: Any, pool: memoryview, window_bytes: int, remaining: int, seed: int, name: str,
             units: int, unit_bytes: int) -> None:
    """``remaining`` bytes of consecutive windows of ``pool`` (``units`` items of ``unit_bytes``), each
    starting at the hashed offset of (seed, name, window)."""
    window = 0
    while remaining:
        take = min(remaining, window_bytes)
        start = window_offset(seed, name, window) % units * unit_bytes
        fh.write(pool[start:start + take])
        remaining -= take
        window += 1


def unquantized(parts: Dict[str, Dict[str, Shape]], quantized: Quantized) -> Dict[str, Dict[str, Shape]]:
    """``parts`` without the tensors :func:`write_gguf` stores Q4_0: those whose F16 pools it reads."""
    return {prefix: {name: shape for name, shape in tensors.items() if not _q4((prefix, name, shape), quantized)}
            for prefix, tensors in parts.items()}


def quantized_prefixes(prefixes: Sequence[str]) -> Quantized:
    """A :data:`Quantized` rule: the matrices under any of ``prefixes``."""
    return lambda name, shape: any(name.startswith(p) for p in prefixes)
