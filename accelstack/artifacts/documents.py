"""Small documents whose hash is not known in advance (manifests and their signatures).

They are trusted only after the caller checks them (the manifest's Ed25519 signature), so here
we only cap their size and use the same transport rules as for artifacts (https, loopback, file).
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Optional

from ..limits import MAX_JSON_BYTES
from .errors import FetchError
from .transport import Transport

MAX_DOCUMENT = MAX_JSON_BYTES  # the manifest parser refuses anything larger anyway


def _read_local(p: Path, max_bytes: int) -> bytes:
    """At most ``max_bytes + 1`` bytes of the regular file ``p``: opened without blocking, so a
    FIFO named as a manifest is refused instead of waiting forever for a writer."""
    fd = os.open(str(p), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FetchError(f"{p} is not a regular file; not a manifest", url=str(p))
        return fh.read(max_bytes + 1)


def fetch_document(location: str, *, transport: Optional[Transport] = None, max_bytes: int = MAX_DOCUMENT) -> bytes:
    """The bytes at ``location`` (a URL, or a local path for a publisher's own directory)."""
    if "://" not in location:
        p = Path(location)
        try:
            data = _read_local(p, max_bytes)
        except FileNotFoundError:
            raise FetchError(f"{p} does not exist", status=404, url=location) from None
        except OSError as exc:
            raise FetchError(f"cannot read {p} ({exc.strerror or exc})", url=location) from None
        if len(data) > max_bytes:
            raise FetchError(f"{p} is larger than {max_bytes} bytes; not a manifest", url=location)
        return data
    own = transport is None
    transport = transport or Transport()
    try:
        with transport.open(location) as stream:
            parts = []
            size = 0
            for chunk in stream.chunks():
                size += len(chunk)
                if size > max_bytes:
                    raise FetchError(f"{location} is larger than {max_bytes} bytes; not a manifest", url=location)
                parts.append(chunk)
            return b"".join(parts)
    finally:
        if own:
            transport.close()


def fetch_optional_document(location: str, *, transport: Optional[Transport] = None) -> Optional[bytes]:
    """Like :func:`fetch_document`, but ``None`` when the server says 404 (an absent signature)."""
    try:
        return fetch_document(location, transport=transport)
    except FetchError as exc:
        if exc.status == 404:
            return None
        raise
