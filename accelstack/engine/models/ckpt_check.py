"""The torch checkpoint check: a zip archive's directory and its pickles, or a legacy pickle stream.

stable-diffusion.cpp's zip reader trusts the archive's directory: the end records are checked
against the file before :mod:`zipfile` reads it, entries must lie inside the file, and the
pickles are decoded as opcodes only (nothing is unpickled), within ``MAX_CKPT_PICKLE_BYTES``.
"""
from __future__ import annotations

import io
import pickletools
import struct
import zipfile
import zlib
from pathlib import Path
from typing import BinaryIO, List, Tuple

from ...limits import MAX_CKPT_PICKLE_BYTES, MAX_MODEL_HEADER_BYTES, MAX_ZIP_ENTRIES, too_large
from ...serde import size_text
from ..errors import ModelLoadError
from .reader import damaged, fail

__all__ = ["zip_checkpoint", "check_pickles", "read_pickle", "TORCH_LEGACY_PICKLES", "MAX_PICKLE_OPS", "ZIP_ERRORS"]

TORCH_LEGACY_PICKLES = 5  # magic number, protocol, sys info, the state, storage keys
# opcodes decoded from one file's pickles: an SD 1.x checkpoint's data.pkl has ~60 thousand, and 64 MB of
# one-byte opcodes would be 64 million (seconds of decoding for nothing)
MAX_PICKLE_OPS = 5_000_000
READ_CHUNK = 1 << 20  # an archive entry is inflated this much at a time
# what zipfile raises on a broken archive (a CRC that does not match, a local header that lies)
ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError, OSError, ValueError,
              struct.error, OverflowError, KeyError, RuntimeError, UnicodeDecodeError, zlib.error)
ZIP_EOCD, ZIP64_LOCATOR, ZIP64_EOCD = b"PK\x05\x06", b"PK\x06\x07", b"PK\x06\x06"


def _zip_directory(path: Path, fh: BinaryIO, size: int) -> Tuple[int, int, int]:
    """(entries, central directory offset, its size) from the end records, checked against the
    file before :mod:`zipfile` reads the directory (it would read whatever size is claimed)."""
    tail_len = min(size, 22 + 65535)
    fh.seek(size - tail_len)
    tail = fh.read(tail_len)
    at = tail.rfind(ZIP_EOCD)
    if at < 0 or at + 22 > len(tail):
        raise damaged(path, "checkpoint", "it starts like a zip archive but has no zip directory")
    entries, cd_size, cd_offset = struct.unpack("<6xHII", tail[at + 4:at + 20])
    if entries == 0xFFFF or 0xFFFFFFFF in (cd_size, cd_offset):  # zip64: the real values are elsewhere
        loc = tail.rfind(ZIP64_LOCATOR, 0, at)
        if loc < 0 or loc + 20 > len(tail):
            raise damaged(path, "checkpoint", "its zip64 directory locator is missing")
        (eocd64,) = struct.unpack("<Q", tail[loc + 8:loc + 16])
        if eocd64 + 56 > size:
            raise damaged(path, "checkpoint", "its zip64 directory lies outside the file")
        fh.seek(eocd64)
        rec = fh.read(56)
        if rec[:4] != ZIP64_EOCD:
            raise damaged(path, "checkpoint", "its zip64 directory record is missing")
        entries, cd_size, cd_offset = struct.unpack("<QQQ", rec[32:56])
    if entries > MAX_ZIP_ENTRIES:
        raise damaged(path, "checkpoint", f"its zip directory lists {entries} entries, more than the "
                       f"{MAX_ZIP_ENTRIES} accepted")
    if cd_offset + cd_size > size or cd_size > MAX_MODEL_HEADER_BYTES:
        raise damaged(path, "checkpoint", "its zip directory lies outside the file")
    return entries, cd_offset, cd_size


def check_pickles(path: Path, data: bytes, count: int, complete: bool) -> None:
    """``count`` consecutive pickles in ``data`` decode as opcodes (nothing is unpickled), at most
    ``MAX_PICKLE_OPS`` of them in all."""
    stream = io.BytesIO(data)
    ops = 0
    try:
        for _ in range(count):
            for _op in pickletools.genops(stream):
                ops += 1
                if ops > MAX_PICKLE_OPS:
                    raise fail(path, f"its pickled data has more than {MAX_PICKLE_OPS:,} opcodes (a checkpoint's "
                               "has some tens of thousands): it is not a checkpoint stable-diffusion.cpp reads")
    except (ValueError, KeyError, struct.error, UnicodeDecodeError, OverflowError, IndexError, TypeError):
        if not complete:
            raise fail(path, f"its pickled header is larger than the {size_text(MAX_CKPT_PICKLE_BYTES)} accepted") from None
        raise damaged(path, "checkpoint", "its pickled data is not a valid pickle") from None


def read_pickle(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    """The entry ``info`` inflated a chunk at a time, never more than ``MAX_CKPT_PICKLE_BYTES`` + 1
    bytes: its declared size is only the archive's word (``ZipFile.read`` inflates the whole stream
    in one call, gigabytes from a zip bomb declaring 1 KB, before its CRC check fails)."""
    if info.file_size > MAX_CKPT_PICKLE_BYTES:
        raise fail(path, too_large("its data.pkl", info.file_size, MAX_CKPT_PICKLE_BYTES))
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise damaged(path, "checkpoint", "its data.pkl uses a compression stable-diffusion.cpp cannot read")
    chunks: List[bytes] = []
    held = 0
    with archive.open(info) as member:
        while held <= MAX_CKPT_PICKLE_BYTES:
            chunk = member.read(min(READ_CHUNK, MAX_CKPT_PICKLE_BYTES + 1 - held))
            if not chunk:
                break
            chunks.append(chunk)
            held += len(chunk)
    if held > MAX_CKPT_PICKLE_BYTES:
        raise fail(path, too_large("its data.pkl", held, MAX_CKPT_PICKLE_BYTES))
    return b"".join(chunks)


def zip_checkpoint(path: Path, fh: BinaryIO, size: int) -> None:
    """The archive's directory, entries and data.pkl check out (its names are read by ckpt_index)."""
    _zip_directory(path, fh, size)
    fh.seek(0)
    try:
        with zipfile.ZipFile(fh) as archive:
            infos = archive.infolist()
            for info in infos:
                if info.header_offset + info.compress_size > size or not info.filename:
                    raise damaged(path, "checkpoint", "a zip entry lies outside the file")
            pickles = [info for info in infos if "data.pkl" in info.filename]
            if not pickles:
                raise fail(path, "it is a zip archive but not a torch checkpoint (it has no data.pkl)")
            for info in pickles:
                check_pickles(path, read_pickle(path, archive, info), 1, complete=True)
    except ModelLoadError:
        raise
    except ZIP_ERRORS as exc:
        raise damaged(path, "checkpoint", f"its zip archive is broken ({str(exc)[:100]})") from None
