"""Hand-made tar files for the bundle reader's tests (issue 29): members written as accelstack
never writes them, a sparse member (a few bytes in the file, gigabytes once extracted) and a
gzip-compressed tar, which ``tarfile`` cannot write itself."""
from __future__ import annotations

import gzip
import io
import tarfile
from typing import Iterable, Optional, Tuple

__all__ = ["Member", "sparse_header", "tar_bytes", "gzipped"]

Member = Tuple[str, bytes, Optional[int]]  # name, the bytes stored, the sparse member's full size (None: regular)


def _octal(value: int, width: int) -> bytes:
    return (b"%0*o" % (width - 1, value)) + b"\0"


def sparse_header(name: str, stored: int, full: int) -> bytes:
    """The 512-byte header of an old-GNU sparse member: ``stored`` bytes in the archive, placed at
    the end of a file ``full`` bytes long (the rest a hole: zeros, free in the archive)."""
    info = tarfile.TarInfo(name)
    info.size, info.mode = stored, 0o644
    block = bytearray(info.tobuf(tarfile.GNU_FORMAT))[:512]
    block[156:157] = tarfile.GNUTYPE_SPARSE
    block[386:398] = _octal(full - stored, 12)  # the one data region: its offset...
    block[398:410] = _octal(stored, 12)  # ...and its length
    block[482:483] = b"\0"  # no extension blocks
    block[483:495] = _octal(full, 12)  # the size once extracted
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def tar_bytes(members: Iterable[Member]) -> bytes:
    """An uncompressed tar of ``members``, in order."""
    out = io.BytesIO()
    for name, data, full in members:
        if full is None:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            out.write(info.tobuf(tarfile.GNU_FORMAT))
        else:
            out.write(sparse_header(name, len(data), full))
        out.write(data + b"\0" * (-len(data) % 512))
    out.write(b"\0" * 1024)
    return out.getvalue()


def gzipped(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=9)
