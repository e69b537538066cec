"""The GGUF check: its header read the way ggml reads it, every count bounded by the file's size.

stable-diffusion.cpp's fallback GGUF reader allocates whatever a header claims (2^62 tensors, a
2^62-byte name): the counts, names, dimensions, types, alignment and tensor offsets are checked
here, reading at most ``MAX_MODEL_HEADER_BYTES`` of the header.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO, Dict, List, Tuple

from ...limits import MAX_MODEL_HEADER_BYTES, sizes_apart
from ...serde import size_text
from .reader import INT64_MAX, TensorInfo, damaged, fail, remembered_index

__all__ = ["gguf_tensors", "gguf_index", "GGML_TYPES", "GGML_TYPE_NAMES", "GGUF_VERSIONS"]

# GGUF: ggml type id -> (elements per block, bytes per block), from ggml 0.4.7's type traits.
GGML_TYPES: Dict[int, Tuple[int, int]] = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 36),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
    16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82),
    23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2),
    34: (256, 54), 35: (256, 66), 39: (32, 17), 40: (64, 36)}
# ggml type id -> its name, from ggml 0.4.7's include/ggml.h (enum ggml_type).
GGML_TYPE_NAMES: Dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1", 10: "Q2_K", 11: "Q3_K",
    12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S",
    20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64",
    29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4", 40: "NVFP4"}
GGUF_VERSIONS = (2, 3)  # ggml refuses 1; the fallback reader would take anything
GGUF_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # KV type -> bytes
GGUF_STRING, GGUF_ARRAY, GGUF_UINT32 = 8, 9, 4
# The runtime's tensor name buffer (with its NUL): stable-diffusion.cpp's CMakeLists.txt compiles itself and
# ggml with add_definitions(-DGGML_MAX_NAME=128) (ggml.h's default is 64), so ggml's gguf.cpp takes names
# of up to 127 bytes; SD 1.x/XL checkpoints converted to GGUF keep names longer than 63.
GGML_MAX_NAME = 128
GGML_MAX_DIMS = 4
GGUF_MAX_KEY = 4096  # the fallback reader's own key limit
GGUF_DEFAULT_ALIGNMENT = 32
# Smallest possible entries, to bound the counts a header claims by the file's size.
GGUF_MIN_TENSOR_INFO = 8 + 1 + 4 + 8 + 4 + 8  # name length, 1-byte name, n_dims, one dim, type, offset
GGUF_MIN_KV = 8 + 1 + 4 + 1  # key length, 1-byte key, type, 1-byte value


class _Cursor:
    """Reads little-endian values from the in-memory header, never past its end."""

    def __init__(self, data: bytes, path: Path, complete: bool) -> None:
        self.data, self.pos, self.path, self.complete = data, 0, path, complete

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            if self.complete:
                raise damaged(self.path, "GGUF", "its header runs past the end of the file (truncated?)")
            raise fail(self.path, f"its GGUF header is larger than the {size_text(MAX_MODEL_HEADER_BYTES)} accepted")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def u32(self) -> int:
        return int(struct.unpack("<I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack("<Q", self.take(8))[0])

    def string(self, limit: int, what: str) -> bytes:
        n = self.u64()
        if n > limit:
            raise damaged(self.path, "GGUF", f"{what} is {n} bytes long, more than the {limit} allowed")
        return self.take(n)


def gguf_tensors(path: Path, fh: BinaryIO, size: int) -> int:
    return len(gguf_index(path, fh, size))


def gguf_index(path: Path, fh: BinaryIO, size: int) -> List[TensorInfo]:
    """Every tensor the header declares (shapes turned to PyTorch order), each checked (once per
    process while the file is unchanged); ``fh`` is at the file's start."""
    return remembered_index(path, fh, lambda: _read_index(path, fh, size))


def _read_index(path: Path, fh: BinaryIO, size: int) -> List[TensorInfo]:
    data = fh.read(MAX_MODEL_HEADER_BYTES)
    cur = _Cursor(data, path, complete=size <= MAX_MODEL_HEADER_BYTES)
    cur.take(4)  # the magic
    version = cur.u32()
    if version not in GGUF_VERSIONS:
        raise fail(path, f"GGUF version {version} is not supported (only {' and '.join(map(str, GGUF_VERSIONS))})")
    n_tensors, n_kv = cur.u64(), cur.u64()
    room = max(0, size - 24)
    if n_tensors > room // GGUF_MIN_TENSOR_INFO:
        raise damaged(path, "GGUF", f"it claims {n_tensors} tensors, more than a {size_text(size)} file can hold")
    if n_kv > room // GGUF_MIN_KV:
        raise damaged(path, "GGUF", f"it claims {n_kv} metadata entries, more than a {size_text(size)} file can hold")
    alignment = GGUF_DEFAULT_ALIGNMENT
    for _ in range(n_kv):
        key = cur.string(GGUF_MAX_KEY, "a metadata key")
        kind = cur.u32()
        if key == b"general.alignment":
            value = cur.u32() if kind == GGUF_UINT32 else 0
            if value <= 0 or value & (value - 1):
                raise damaged(path, "GGUF", "general.alignment is not a power of two (as a uint32)")
            alignment = value
            continue
        _skip_gguf_value(cur, kind, nested=False)
    tensors: List[Tuple[int, int]] = []
    infos: List[TensorInfo] = []
    for _ in range(n_tensors):
        name = cur.string(GGML_MAX_NAME - 1, "a tensor name")
        shown = repr(name[:GGML_MAX_NAME].decode("utf-8", "replace"))
        n_dims = cur.u32()
        if not 1 <= n_dims <= GGML_MAX_DIMS:
            raise damaged(path, "GGUF", f"tensor {shown} has {n_dims} dimensions (1 to {GGML_MAX_DIMS} allowed)")
        dims = [cur.u64() for _ in range(n_dims)]
        ggml_type, offset = cur.u32(), cur.u64()
        if any(d > INT64_MAX for d in dims):
            raise damaged(path, "GGUF", f"tensor {shown} has a negative dimension")
        if ggml_type not in GGML_TYPES:
            raise damaged(path, "GGUF", f"tensor {shown} has an unknown type {ggml_type}")
        block, block_bytes = GGML_TYPES[ggml_type]
        if dims[0] % block:
            raise damaged(path, "GGUF", f"tensor {shown}: its first dimension {dims[0]} is not a multiple of its "
                           f"type's block of {block}")
        elements = 1
        for d in dims:
            elements *= d
        if elements > INT64_MAX:
            raise damaged(path, "GGUF", f"tensor {shown} has more elements than ggml can count")
        if offset % alignment:
            raise damaged(path, "GGUF", f"tensor {shown} is not aligned to {alignment} bytes")
        tensors.append((offset, elements // block * block_bytes))
        infos.append(TensorInfo(name.decode("utf-8", "replace"), tuple(reversed(dims)), GGML_TYPE_NAMES[ggml_type]))
    data_start = -(-cur.pos // alignment) * alignment
    for offset, nbytes in tensors:
        end = data_start + offset + nbytes
        if end > size:
            needed, held = sizes_apart(end, size)
            raise damaged(path, "GGUF", f"a tensor's data ({size_text(nbytes)}) lies outside the file: it ends "
                           f"{needed} in, and the file is {held}; the file is probably truncated")
    if not infos:  # as for safetensors: nothing to load (stable-diffusion.cpp would fail later, vaguely)
        raise fail(path, "the GGUF file holds no tensors")
    return infos


def _skip_gguf_value(cur: _Cursor, kind: int, nested: bool) -> None:
    if kind in GGUF_SCALARS:
        cur.take(GGUF_SCALARS[kind])
    elif kind == GGUF_STRING:
        cur.string(len(cur.data), "a metadata string")
    elif kind == GGUF_ARRAY and not nested:
        elem, count = cur.u32(), cur.u64()
        if elem in GGUF_SCALARS:
            cur.take(count * GGUF_SCALARS[elem] if count <= len(cur.data) else -1)
        elif elem == GGUF_STRING:
            if count > (len(cur.data) - cur.pos) // 8:
                cur.take(-1)
            for _ in range(count):
                cur.string(len(cur.data), "a metadata string")
        else:
            raise damaged(cur.path, "GGUF", f"a metadata array has elements of type {elem} (arrays of arrays "
                           "are not read)")
    else:
        raise damaged(cur.path, "GGUF", f"a metadata value has an unknown type {kind}")
