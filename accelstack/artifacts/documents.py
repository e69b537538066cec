"""Small documents whose hash is not known in advance (manifests and their signatures, a package
index's pages).

Each fetch has an overall deadline from its cap (or the length the server announces) and the
transport's minimum rate, at most the document timeout beyond connecting (:mod:`.transport`): a
server that drips a manifest is given up in seconds to tens of seconds, not waited for forever.

They are trusted only after the caller checks them (the manifest's Ed25519 signature, the sha256
an index lists against the file's own), so here we only cap their size and use the same transport
rules as for artifacts (https, loopback, file, the system trust store).
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..limits import MAX_JSON_BYTES
from ..serde import size_text
from ..settings import Timeouts
from .errors import FetchError
from .streams import Stream
from .transport import Transport

__all__ = ["MAX_DOCUMENT", "MAX_PAGE", "Page", "fetch_document", "fetch_optional_document", "fetch_page"]

MAX_DOCUMENT = MAX_JSON_BYTES  # the manifest parser refuses anything larger anyway
MAX_PAGE = 64 * 1024 * 1024  # a package index's page of a package with thousands of files


def _read_local(p: Path, max_bytes: int) -> bytes:
    """At most ``max_bytes + 1`` bytes of the regular file ``p``: opened without blocking, so a
    FIFO named as a manifest is refused instead of waiting forever for a writer."""
    fd = os.open(str(p), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FetchError(f"{p} is not a regular file; not a manifest", url=str(p))
        return fh.read(max_bytes + 1)


def fetch_document(location: str, *, transport: Optional[Transport] = None, max_bytes: int = MAX_DOCUMENT,
                   timeouts: Optional[Timeouts] = None) -> bytes:
    """The bytes at ``location`` (a URL, or a local path for a publisher's own directory).
    ``timeouts`` (``Settings.timeouts``) set the deadlines of a transport made here."""
    if "://" not in location:
        p = Path(location)
        try:
            data = _read_local(p, max_bytes)
        except FileNotFoundError:
            raise FetchError(f"{p} does not exist", status=404, url=location) from None
        except OSError as exc:
            raise FetchError(f"cannot read {p} ({exc.strerror or exc})", url=location) from None
        if len(data) > max_bytes:
            raise FetchError(f"{p} is larger than {size_text(max_bytes)}; not a manifest", url=location)
        return data
    own = transport is None
    transport = transport or Transport.from_timeouts(timeouts)
    try:
        with transport.open(location, expect=max_bytes, document=True) as stream:
            return _read_bounded(stream, location, max_bytes, "not a manifest")
    finally:
        if own:
            transport.close()


@dataclass(frozen=True)
class Page:
    """A document a server described: its bytes, its Content-Type, and the URL it was served from
    after redirects (what its relative links are relative to)."""

    url: str
    data: bytes
    content_type: str


def fetch_page(url: str, *, accept: str = "", transport: Optional[Transport] = None,
               max_bytes: int = MAX_PAGE, timeouts: Optional[Timeouts] = None) -> Page:
    """The page at ``url`` (a package index's simple-API page), asking for the kinds ``accept``
    names; at most ``max_bytes``. :class:`FetchError` when it cannot be read (404 has ``status``)."""
    own = transport is None
    transport = transport or Transport.from_timeouts(timeouts)
    try:
        with transport.open(url, accept=accept, expect=max_bytes, document=True) as stream:
            data = _read_bounded(stream, url, max_bytes, "not an index page")
            return Page(stream.url, data, stream.content_type)
    finally:
        if own:
            transport.close()


def _read_bounded(stream: Stream, location: str, max_bytes: int, what: str) -> bytes:
    """The body of ``stream``; :class:`FetchError` as soon as it passes ``max_bytes``."""
    parts = []
    size = 0
    for chunk in stream.chunks():
        size += len(chunk)
        if size > max_bytes:
            raise FetchError(f"{location} is larger than {size_text(max_bytes)}; {what}", url=location)
        parts.append(chunk)
    return b"".join(parts)


def fetch_optional_document(location: str, *, transport: Optional[Transport] = None,
                            timeouts: Optional[Timeouts] = None) -> Optional[bytes]:
    """Like :func:`fetch_document`, but ``None`` when the server says 404 (an absent signature)."""
    try:
        return fetch_document(location, transport=transport, timeouts=timeouts)
    except FetchError as exc:
        if exc.status == 404:
            return None
        raise
