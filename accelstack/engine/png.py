"""PNG files with the generation parameters in a ``tEXt`` chunk (``iTXt`` for text beyond Latin-1),
with the standard library only.

Image-generation tools conventionally store the parameters under the keyword ``parameters``
(A1111 style: prompt, ``Negative prompt: ...``, then ``Steps: 20, Sampler: ..., Seed: ...``),
so other tools show them. Writing needs only zlib; the reader exists so that tests and
``verify`` can check what was written without Pillow (which only the worker has).
"""
from __future__ import annotations

import errno
import io
import os
import re
import stat
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from .. import fsio
from .errors import OutputPathError, OutputWriteError

__all__ = ["PngError", "PngImage", "encode_png", "write_png", "decode_png", "read_png", "read_input_png", "to_rgb",
           "parameters_text", "SIGNATURE", "MAX_INPUT_SIDE", "MAX_INPUT_BYTES"]

SIGNATURE = b"\x89PNG\r\n\x1a\n"
_WIDE_GRAY = ("I", "I;16", "I;16B", "I;16L", "I;16N")  # Pillow's modes of a 16-bit gray PNG
_OBJECT = re.compile(r"\s*<[\w.]+ object at 0x[0-9a-fA-F]+>")  # a Python object's repr in an exception's text


class PngError(ValueError):
    """Not a PNG this module can read (8-bit, non-interlaced gray/RGB/RGBA)."""


@dataclass
class PngImage:
    width: int
    height: int
    channels: int
    pixels: bytes  # row-major, ``channels`` bytes per pixel
    text: Dict[str, str] = field(default_factory=dict)

    def rgb(self) -> bytes:
        """The pixels as RGB (drops alpha, expands gray)."""
        if self.channels == 3:
            return self.pixels
        if self.channels == 4:
            out = bytearray(self.width * self.height * 3)
            out[0::3], out[1::3], out[2::3] = self.pixels[0::4], self.pixels[1::4], self.pixels[2::4]
            return bytes(out)
        if self.channels == 1:
            return bytes(b for v in self.pixels for b in (v, v, v))
        raise PngError(f"cannot convert {self.channels} channels to RGB")


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def encode_png(width: int, height: int, rgb: bytes, text: Union[Dict[str, str], None] = None, level: int = 6) -> bytes:
    """Encode 8-bit RGB pixels (filter type 0 on every row) with optional text entries (``tEXt``, or
    ``iTXt`` for text beyond Latin-1)."""
    if len(rgb) != width * height * 3:
        raise ValueError(f"expected {width * height * 3} bytes of RGB for {width}x{height}, got {len(rgb)}")
    stride = width * 3
    raw = b"".join(b"\x00" + rgb[y * stride:(y + 1) * stride] for y in range(height))
    parts = [SIGNATURE, _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))]
    for key, value in (text or {}).items():
        keyword = key.encode("latin-1", "replace")[:79] + b"\x00"
        try:  # tEXt, which every reader knows, holds Latin-1 only
            parts.append(_chunk(b"tEXt", keyword + value.encode("latin-1")))
        except UnicodeEncodeError:  # a prompt in Chinese, an emoji: iTXt, UTF-8 (uncompressed, no language), as Pillow does
            parts.append(_chunk(b"iTXt", keyword + b"\x00\x00\x00\x00" + value.encode("utf-8", "replace")))
    parts.append(_chunk(b"IDAT", zlib.compress(raw, level)))
    parts.append(_chunk(b"IEND", b""))
    return b"".join(parts)


def write_png(path: Union[str, Path], width: int, height: int, rgb: bytes,
              text: Union[Dict[str, str], None] = None) -> Path:
    """Write atomically (a temporary file renamed into place), making missing folders. An OSError is
    a typed error naming the path: :class:`OutputWriteError` when the disk is full,
    :class:`OutputPathError` (a usage error) for a path that cannot take a file."""
    target = Path(path)
    data = encode_png(width, height, rgb, text)
    try:
        return fsio.write_bytes(target, data, make_parents=True)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            raise OutputWriteError(f"cannot write the image to {target}: {reason}",
                                   hint="free some space or choose another output path") from None
        raise OutputPathError(f"cannot write the image to {target}: {reason}",
                              hint="choose an output path in a folder you can write to") from None


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def decode_png(data: bytes) -> PngImage:
    """Decode an 8-bit, non-interlaced grayscale/RGB/RGBA PNG (all five row filters)."""
    if not data.startswith(SIGNATURE):
        raise PngError("not a PNG file")
    pos, width, height, channels = 8, 0, 0, 0
    idat: List[bytes] = []
    text: Dict[str, str] = {}
    while pos + 8 <= len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if len(body) != length:
            raise PngError("truncated PNG chunk")
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, color, _comp, _filt, interlace = struct.unpack(">IIBBBBB", body)
            channels = {0: 1, 2: 3, 6: 4}.get(color, 0)
            if depth != 8 or not channels or interlace:
                raise PngError(f"unsupported PNG (bit depth {depth}, color type {color}, interlace {interlace})")
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"tEXt":
            key, _, value = body.partition(b"\x00")
            text[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"iTXt":
            key, _, rest = body.partition(b"\x00")
            flag = rest[0]
            _lang, _, rest = rest[2:].partition(b"\x00")
            _tkey, _, value = rest.partition(b"\x00")
            text[key.decode("latin-1")] = (zlib.decompress(value) if flag else value).decode("utf-8", "replace")
        elif kind == b"IEND":
            break
    if not width or not idat:
        raise PngError("PNG without IHDR or IDAT")
    raw = zlib.decompress(b"".join(idat))
    bpp, stride = channels, width * channels
    if len(raw) != height * (stride + 1):
        raise PngError("PNG image data has the wrong length")
    out = bytearray(height * stride)
    prev = bytearray(stride)
    for y in range(height):
        ftype = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if ftype == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif ftype == 2:
            for i in range(stride):
                line[i] = (line[i] + prev[i]) & 0xFF
        elif ftype == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif ftype == 4:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                upleft = prev[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + _paeth(left, prev[i], upleft)) & 0xFF
        elif ftype != 0:
            raise PngError(f"unknown PNG row filter {ftype}")
        out[y * stride:(y + 1) * stride] = line
        prev = line
    return PngImage(width, height, channels, bytes(out), text)


def read_png(path: Union[str, Path]) -> PngImage:
    return decode_png(Path(path).read_bytes())


# Caps of an input image (img2img, ControlNet): the request's sides are at most 4096 (protocol.MAX_SIDE),
# and a PNG of 4096 x 4096 RGBA with no compression at all is 64 MiB + one filter byte a row.
MAX_INPUT_SIDE = 4096
MAX_INPUT_BYTES = 80 * 1024 * 1024


def input_png_size(path: Union[str, Path]) -> Optional[Tuple[int, int]]:
    """(width, height) from a PNG's IHDR, or None when ``path`` is not a readable regular PNG file
    (:func:`read_input_png` says why, later): reads 24 bytes, never blocks on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        head = os.read(fd, 24)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(head) < 24 or not head.startswith(SIGNATURE) or head[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", head[16:24])
    return int(width), int(height)


def read_input_png(path: Union[str, Path], max_side: int = MAX_INPUT_SIDE, max_bytes: int = MAX_INPUT_BYTES) -> PngImage:
    """An input image, bounded: only a regular file (a FIFO is refused without blocking), at most
    ``max_bytes`` read, the sides checked from IHDR before anything is inflated (a 20000 x 20000
    header is refused at once), then decoded to RGB.
    :class:`PngError` says what is wrong; :class:`OSError` when it cannot be read."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PngError("it is not a regular file (a pipe, device or folder)")
        if st.st_size > max_bytes:
            raise PngError(f"it is {st.st_size} bytes; input images of at most {max_bytes // (1024 * 1024)} MiB are read")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            data = fh.read(max_bytes + 1)
    finally:
        if fd >= 0:
            os.close(fd)
    if not data.startswith(SIGNATURE):
        raise PngError("not a PNG file")
    if len(data) < 33 or data[12:16] != b"IHDR":
        raise PngError("a PNG must start with its IHDR chunk")
    width, height = struct.unpack(">II", data[16:24])
    if not (1 <= width <= max_side and 1 <= height <= max_side):
        raise PngError(f"it is {width}x{height}; input images of at most {max_side}x{max_side} are read")
    return _decode_with_pillow(data, width, height)


def _decode_with_pillow(data: bytes, width: int, height: int) -> PngImage:
    """Pillow (a dependency of the package, in C) decodes every PNG variant (16-bit, palette,
    interlaced) at C speed; the sides were checked above, and Pillow caps text chunks itself
    (PngImagePlugin.MAX_TEXT_CHUNK), so its work is bounded by the checked size."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data), formats=["PNG"]) as img:
            if img.size != (width, height):
                raise PngError("the PNG's size is not the one its header says")
            return PngImage(width, height, 3, to_rgb(img).tobytes())
    except PngError:
        raise
    except UnidentifiedImageError:  # its message quotes our BytesIO object: nothing a user can act on
        raise PngError("damaged PNG: Pillow cannot read its chunks (a checksum that does not match, a cut "
                       "or damaged header)") from None
    except (OSError, ValueError, SyntaxError, EOFError, IndexError, struct.error, zlib.error,
            Image.DecompressionBombError) as exc:  # what Pillow raises for a damaged file
        raise PngError(f"damaged or unreadable PNG ({_OBJECT.sub('', str(exc))[:120]})") from None


def to_rgb(img: Any) -> Any:
    """A Pillow image as RGB. 16-bit gray (a depth map's usual format: Pillow's I;16, I;16B, or I) is
    scaled to 8 bits first (the high byte, as Pillow reads 16-bit RGB(A)): convert("RGB") clips its
    values, so all but the darkest 1/256 of a gradient came out white."""
    if img.mode in _WIDE_GRAY:
        img = img.convert("I").point(lambda v: v / 256).convert("L")
    return img.convert("RGB")


def parameters_text(prompt: str, negative_prompt: str, fields: Dict[str, object]) -> str:
    """The conventional ``parameters`` value: prompt, negative prompt, then ``Key: value`` pairs."""
    lines = [prompt]
    if negative_prompt:
        lines.append(f"Negative prompt: {negative_prompt}")
    lines.append(", ".join(f"{k}: {v}" for k, v in fields.items() if v not in (None, "")))
    return "\n".join(lines)
