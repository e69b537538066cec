"""Fuzzing the input images of img2img and ControlNet (issue 26): :func:`read_input_png` on mutated
PNGs (flipped bytes, cut files, chunk lengths and IHDR sides of any value, random bytes) either
returns an RGB image of the sides its header says, within the caps, or raises ``PngError``, within a
time and memory bound; never another exception, never a hang."""
from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from accelstack.engine.png import MAX_INPUT_SIDE, PngError, encode_png, read_input_png

from .fuzzing import Counter, bounded, fuzz

STATS = {"images": Counter(), "decoded": Counter()}


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


GOOD = encode_png(16, 8, bytes(range(256)) * 1 + bytes(16 * 8 * 3 - 256))


@st.composite
def hostile_pngs(draw) -> bytes:
    kind = draw(st.sampled_from(["flip", "cut", "ihdr", "bytes", "bomb"]))
    if kind == "flip":
        data = bytearray(GOOD)
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(0, len(data) - 1))
            data[i] = draw(st.integers(0, 255))
        return bytes(data)
    if kind == "cut":
        return GOOD[:draw(st.integers(0, len(GOOD)))]
    if kind == "ihdr":
        w, h = draw(st.integers(0, 2 ** 32 - 1)), draw(st.integers(0, 2 ** 32 - 1))
        depth, color, interlace = draw(st.sampled_from([1, 2, 4, 8, 16, 255])), draw(st.integers(0, 7)), draw(st.integers(0, 2))
        ihdr = struct.pack(">IIBBBBB", w, h, depth, color, 0, 0, interlace)
        return GOOD[:8] + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(b"\x00" * 4096)) + _chunk(b"IEND", b"")
    if kind == "bomb":  # a small header over data that inflates far past what it promises
        ihdr = struct.pack(">IIBBBBB", 64, 64, 8, 2, 0, 0, 0)
        return GOOD[:8] + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(b"\x00" * (8 << 20))) + _chunk(b"IEND", b"")
    return draw(st.binary(max_size=512))


@fuzz(int(os.environ.get("FUZZ_PNG_EXAMPLES", "200")))
@given(data=hostile_pngs())
def test_hostile_input_pngs_decode_within_the_caps_or_raise_png_error(tmp_path_factory, data):
    path = Path(tmp_path_factory.mktemp("png")) / "in.png"
    path.write_bytes(data)
    STATS["images"]()
    with bounded("an input PNG"):
        try:
            img = read_input_png(path)
        except PngError:
            return
    STATS["decoded"]()
    assert 1 <= img.width <= MAX_INPUT_SIDE and 1 <= img.height <= MAX_INPUT_SIDE
    assert img.channels == 3 and len(img.pixels) == img.width * img.height * 3
