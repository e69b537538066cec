"""The safetensors check: its JSON header, each tensor as stable-diffusion.cpp will read it.

stable-diffusion.cpp converts the header's JSON values with exceptions nobody catches (a shape that
is not a list, a dtype that is not text), so every entry is checked here against the file's size,
reading the header only (at most ``MAX_MODEL_HEADER_BYTES``).
"""
from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import BinaryIO, Dict, List

from ...limits import MAX_MODEL_HEADER_BYTES, MalformedInput, parse_json, sizes_apart, too_large
from ...serde import size_text
from .reader import INT64_MAX, TensorInfo, damaged, fail, is_int, open_regular, remembered_index

__all__ = ["safetensors_tensors", "safetensors_index", "MAX_HEADER", "SAFETENSORS_DTYPES", "SD_MAX_DIMS"]

MAX_HEADER = 100 << 20  # safetensors caps its JSON header at 100 MB (we read at most MAX_MODEL_HEADER_BYTES)

# safetensors dtypes stable-diffusion.cpp reads (U8 tensors it skips), with their item sizes.
SAFETENSORS_DTYPES = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1, "I32": 4, "I64": 8,
                      "U8": 1}
SD_MAX_DIMS = 5  # stable-diffusion.cpp folds a 5-dim safetensors tensor into 4
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # may start a lone surrogate (\ud800); rare in real headers


def safetensors_tensors(path: Path) -> int:
    return len(safetensors_index(path))


def safetensors_index(path: Path) -> List[TensorInfo]:
    """Every tensor the header declares, each checked as stable-diffusion.cpp will read it (once per
    process while the file is unchanged)."""
    fh, size = open_regular(path)
    with fh:
        return remembered_index(path, fh, lambda: _read_index(path, fh, size))


def _read_index(path: Path, fh: BinaryIO, size: int) -> List[TensorInfo]:
    head = fh.read(8)
    if len(head) < 8:
        raise fail(path, f"not a safetensors file: only {size} bytes")
    (n,) = struct.unpack("<Q", head)
    if n == 0 or n > MAX_HEADER or 8 + n > size:
        why = "its header length is 0" if n == 0 else \
            too_large("its header length", n, MAX_HEADER, "safetensors allows") if n > MAX_HEADER else \
            too_large("its header length", n, size - 8, "the file holds after it")
        raise fail(path, f"not a valid safetensors file: {why} (the file is truncated or not safetensors)")
    if n > MAX_MODEL_HEADER_BYTES:
        raise fail(path, too_large("its safetensors header", n, MAX_MODEL_HEADER_BYTES))
    raw = fh.read(n)
    if raw[:1] != b"{":
        raise fail(path, "not a valid safetensors file: its header is not JSON")
    try:
        header = parse_json(raw, what="its safetensors header", max_bytes=MAX_MODEL_HEADER_BYTES, max_depth=4)
    except MalformedInput:
        raise fail(path, "not a valid safetensors file: its header is not JSON") from None
    if not isinstance(header, dict):
        raise fail(path, "not a valid safetensors file: its header is not a JSON object")
    if _SURROGATE_ESCAPE.search(raw):
        _check_text(path, header)
    data_len = size - 8 - n
    tensors: List[TensorInfo] = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        _check_safetensor(path, name, info, data_len)
        assert isinstance(info, dict)  # _check_safetensor refused anything else
        tensors.append(TensorInfo(name, tuple(info["shape"]), info["dtype"]))
    if not tensors:
        raise fail(path, "the safetensors file holds no tensors")
    return tensors


def _check_text(path: Path, header: Dict[str, object]) -> None:
    """No lone UTF-16 surrogate (a JSON escape such as \\ud800 with no partner): stable-diffusion.cpp's
    JSON parser and the safetensors library both refuse the whole header, and such text cannot be
    written as UTF-8 (a strict JSON reader of our output would refuse it too)."""
    for name in header:
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise damaged(path, "safetensors", f"tensor name {name[:60]!r} holds a lone UTF-16 surrogate, which "
                          "stable-diffusion.cpp's JSON parser refuses") from None
    try:
        json.dumps(header, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise damaged(path, "safetensors", "its header holds a lone UTF-16 surrogate, which stable-diffusion.cpp's "
                      "JSON parser refuses") from None


def _check_safetensor(path: Path, name: str, info: object, data_len: int) -> None:
    """One tensor entry, as stable-diffusion.cpp will read it (it throws on wrong JSON types)."""
    shown = repr(name[:60])
    if not isinstance(info, dict):
        raise damaged(path, "safetensors", f"the entry of tensor {shown} is not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPES:
        raise damaged(path, "safetensors", f"tensor {shown} has dtype {str(dtype)[:20]!r}, which stable-diffusion.cpp "
                       f"does not read (it reads {', '.join(SAFETENSORS_DTYPES)})")
    if (not isinstance(shape, list) or len(shape) > SD_MAX_DIMS
            or not all(is_int(d) and 0 <= d <= INT64_MAX for d in shape)):
        raise damaged(path, "safetensors", f"tensor {shown} has an invalid shape (it must be a list of at most "
                       f"{SD_MAX_DIMS} non-negative integers)")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(is_int(o) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data_len):
        raise damaged(path, "safetensors", f"tensor {shown} lies outside the file ({size_text(data_len)} of data); "
                       "the file is probably truncated")
    elements = 1
    for d in shape:
        elements *= d
        if elements > data_len:  # stays small: no product of huge dimensions is ever formed
            break
    needed, held = elements * SAFETENSORS_DTYPES[dtype], offsets[1] - offsets[0]
    if needed != held:
        if elements > data_len:  # the loop stopped early: more than the whole file holds
            raise damaged(path, "safetensors", f"tensor {shown} has shape {shape[:SD_MAX_DIMS]} of {dtype}, more than "
                           f"the file's {size_text(data_len)} of data")
        need_text, held_text = sizes_apart(needed, held)
        raise damaged(path, "safetensors", f"tensor {shown} has shape {shape[:SD_MAX_DIMS]} of {dtype}, which needs "
                       f"{need_text} of data, but the file gives it {held_text}")
