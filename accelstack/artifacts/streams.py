"""The bytes of one response: what :meth:`~accelstack.artifacts.transport.Transport.open` hands back.

A :class:`Stream` reads a body from a byte offset, raising
:class:`~accelstack.artifacts.errors.FetchError` (``transient`` set) when a read fails part way, so
the caller can resume from what it kept. ``file://`` URLs are a :class:`FileStream`; HTTP bodies an
:class:`HTTPStream`, which reads straight from the socket into the caller's buffer.

An HTTP body may have an overall deadline (:meth:`HTTPStream.start_deadline`, set by the
transport from the fetch's size and a minimum rate): a server that sends a byte now and then
never trips the read timeout, so the clock is checked before every read and a watchdog shuts the
socket down when the deadline passes, waking a read blocked on it. Either way the reader gets a
:class:`~accelstack.artifacts.errors.SlowTransferError` (never a short body taken for the whole).
"""
from __future__ import annotations

import http.client
import os
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Optional
from urllib.parse import urlsplit

import requests
import urllib3

from ..serde import size_text
from .errors import FetchError, SlowTransferError

__all__ = ["DEFAULT_CHUNK_SIZE", "FileStream", "HTTPStream", "Stream", "describe_error", "rate_text", "redact_url"]

DEFAULT_CHUNK_SIZE = 1 << 20


def redact_url(url: str) -> str:
    """The URL without user:password, for messages."""
    parts = urlsplit(url)
    if parts.username or parts.password:
        netloc = parts.hostname or ""
        if parts.port:
            netloc += f":{parts.port}"
        return parts._replace(netloc=netloc).geturl()
    return url


def rate_text(bytes_per_second: float) -> str:
    """``64 KiB/s``: a rate for people, in the units of :func:`~accelstack.serde.size_text`."""
    return size_text(bytes_per_second).replace(".0 ", " ") + "/s"


class Stream:
    """The body of one response, from byte ``start`` of the file.

    ``status`` is 200 (the whole file, ``start`` is 0) or 206 (from ``start``). ``length`` is
    the number of body bytes announced (Content-Length), ``total`` the size of the whole file
    where the server says it (Content-Range, or Content-Length of a 200); both may be ``None``.
    """

    url: str
    status: int
    start: int
    length: Optional[int]
    total: Optional[int]
    content_type: str = ""  # the server's Content-Type ("" for a file:// URL)
    deadline: Optional[float] = None  # time.monotonic() by which the whole body must be in (None: no deadline)

    def chunks(self, size: int = DEFAULT_CHUNK_SIZE) -> Iterator[bytes]:  # pragma: no cover - interface
        raise NotImplementedError

    def readinto(self, view: memoryview) -> int:  # pragma: no cover - interface
        """Read the next bytes into ``view``: at most one network read (what it gave, up to
        ``len(view)``), so a caller filling a buffer loses nothing already received when the
        next read fails. 0 at the end of the body."""
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover - interface
        pass

    def abort(self) -> None:
        """Close from another thread, waking a reader blocked on the network."""
        self.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FileStream(Stream):
    """A ``file://`` URL's bytes (a local mirror)."""

    def __init__(self, url: str, path: Path, offset: int) -> None:
        self.url = url
        try:
            self._fh: BinaryIO = open(path, "rb")
            size = os.fstat(self._fh.fileno()).st_size
        except FileNotFoundError:
            raise FetchError(f"{url}: no such file", status=404, url=url) from None
        except OSError as exc:
            raise FetchError(f"{url}: cannot read ({exc})", url=url) from None
        if offset > size:
            self._fh.close()
            raise FetchError(f"{url}: file has {size} bytes, cannot resume at {offset}", status=416, url=url)
        self._fh.seek(offset)
        self.status = 206 if offset else 200
        self.start = offset
        self.length = size - offset
        self.total = size

    def readinto(self, view: memoryview) -> int:
        try:
            return self._fh.readinto(view)  # type: ignore[attr-defined]  # a BufferedReader
        except OSError as exc:
            raise FetchError(f"{self.url}: read failed ({exc})", transient=True, url=self.url) from None

    def chunks(self, size: int = DEFAULT_CHUNK_SIZE) -> Iterator[bytes]:
        while True:
            try:
                data = self._fh.read(size)
            except OSError as exc:
                raise FetchError(f"{self.url}: read failed ({exc})", transient=True, url=self.url) from None
            if not data:
                return
            yield data

    def close(self) -> None:
        self._fh.close()


_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)


class HTTPStream(Stream):
    """The body of one ``requests`` response, read straight from its socket where it can be."""

    def __init__(self, url: str, response: Any) -> None:  # response: requests.Response
        self.url = url
        self._resp = response
        self.received = 0  # body bytes read so far
        self._opened = 0.0
        self._min_rate = 0.0
        self._guard = threading.Lock()  # the watchdog against close(): never shut down a socket reused since
        self._expired = False
        self._closed = False
        self._timer: Optional[threading.Timer] = None
        self.status = response.status_code
        self.content_type = str(response.headers.get("Content-Type", ""))
        length = response.headers.get("Content-Length")
        try:
            self.length = int(length) if length is not None else None
        except ValueError:
            self.length = None
        self.total = None
        self.start = 0
        if self.status == 206:
            match = _CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
            if not match:
                response.close()
                raise FetchError(
                    f"{redact_url(url)}: 206 reply without a valid Content-Range "
                    f"({response.headers.get('Content-Range')!r})",
                    transient=True,
                    url=url,
                )
            self.start = int(match.group(1))
            end = int(match.group(2))
            if match.group(3) != "*":
                self.total = int(match.group(3))
            if self.length is None:
                self.length = end - self.start + 1
        else:
            self.total = self.length
        # The fast path: straight from the socket's buffered reader into the caller's buffer, with
        # the body's length counted here (http.client's own reads would copy each read into a new
        # bytes object first). Only for a plain body; a chunked one goes through http.client.
        self._reader: Optional[Any] = None
        self._left: Optional[int] = None
        fp = getattr(response.raw, "_fp", None)  # urllib3 -> http.client.HTTPResponse
        sockfile = getattr(fp, "fp", None)
        if (isinstance(fp, http.client.HTTPResponse) and fp.chunked is False and sockfile is not None
                and hasattr(sockfile, "readinto1")):
            self._reader = sockfile.readinto1
            self._left = fp.length

    # -- the overall deadline ---------------------------------------------------------------------
    def start_deadline(self, opened: float, deadline: float, min_rate: float) -> None:
        """Give the body until ``deadline`` (``time.monotonic()``; the request was sent at ``opened``):
        checked before each read, and a watchdog wakes a read still blocked then."""
        self._opened, self.deadline, self._min_rate = opened, deadline, min_rate
        self._check_deadline()
        timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._expire)
        timer.daemon = True
        self._timer = timer
        timer.start()

    def _expire(self) -> None:
        with self._guard:
            if self._closed:
                return
            self._expired = True
            sock = self._socket()
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # the blocked read returns; close() stays the owner's
                except OSError:
                    pass

    def _late(self) -> bool:
        if self.length is not None and self.received >= self.length:
            return False  # every announced byte is in: nothing is late
        return self._expired or (self.deadline is not None and time.monotonic() >= self.deadline)

    def _too_slow(self) -> SlowTransferError:
        seconds = max(0.0, time.monotonic() - self._opened)
        return SlowTransferError(
            f"{redact_url(self.url)} sent {size_text(self.received)} in {seconds:.0f} s: slower than the "
            f"{rate_text(self._min_rate)} minimum; try another mirror",
            received=self.received, seconds=seconds, min_rate=self._min_rate, url=self.url)

    def _check_deadline(self) -> None:
        if self._late():
            raise self._too_slow()

    def _interrupted(self, exc: BaseException) -> FetchError:
        if self._late():  # the watchdog's shutdown, or a read timeout cut short by the deadline
            return self._too_slow()
        return FetchError(f"{redact_url(self.url)}: transfer interrupted ({describe_error(exc)})", transient=True,
                          url=self.url)

    def _ended(self) -> None:
        """An empty read: the end of the body, unless the watchdog cut it (a shut-down socket reads as
        the end of a body without a length)."""
        if self._expired and self._late():
            raise self._too_slow()

    # -- reads ------------------------------------------------------------------------------------
    def readinto(self, view: memoryview) -> int:
        if self._left is not None and self._left <= 0:
            return 0
        self._check_deadline()
        reader = self._reader
        if reader is None:
            data = self._read_some(len(view))
            view[: len(data)] = data
            return len(data)
        left = self._left
        if left is not None:
            if left <= 0:
                return 0
            if len(view) > left:
                view = view[:left]
        try:
            n = reader(view) or 0
        except (OSError, ValueError) as exc:
            raise self._interrupted(exc) from None
        if not n:
            self._ended()
        if left is not None:
            self._left = left - n
        self.received += n
        return n

    def _read_some(self, size: int) -> bytes:
        raw = self._resp.raw
        try:
            if hasattr(raw, "read1"):  # urllib3 >= 2
                data = bytes(raw.read1(size, decode_content=False))
            else:
                data = bytes(raw.read(size, decode_content=False))
        except (requests.RequestException, urllib3.exceptions.HTTPError, http.client.HTTPException, OSError,
                ValueError) as exc:
            raise self._interrupted(exc) from None
        if not data:
            self._ended()
        self.received += len(data)
        return data

    def chunks(self, size: int = DEFAULT_CHUNK_SIZE) -> Iterator[bytes]:
        raw = self._resp.raw
        read1 = hasattr(raw, "read1")  # urllib3 >= 2
        while True:
            self._check_deadline()
            try:
                # read1: whatever one socket read gives (at most ``size``), so that a timeout
                # or a dropped connection loses as little as possible of what already arrived.
                # decode_content=False: the bytes as served. A file is hashed as stored; a server
                # that gzips a .tar.gz "for transport" must not turn it into a .tar.
                data = raw.read1(size, decode_content=False) if read1 else raw.read(size, decode_content=False)
            except (
                requests.RequestException,
                urllib3.exceptions.HTTPError,
                http.client.HTTPException,
                OSError,
                ValueError,
            ) as exc:
                raise self._interrupted(exc) from None
            if not data:
                self._ended()
                return
            self.received += len(data)
            yield data

    def close(self) -> None:
        with self._guard:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
        self._resp.close()

    def _socket(self) -> Optional[socket.socket]:
        raw = self._resp.raw
        sock = getattr(getattr(raw, "_connection", None), "sock", None)
        if sock is None:  # the response owns the socket: urllib3 -> http.client -> SocketIO
            fp = getattr(getattr(raw, "_fp", None), "fp", None)
            sock = getattr(getattr(fp, "raw", None), "_sock", None)
        return sock if isinstance(sock, socket.socket) else None

    def abort(self) -> None:
        # close() alone does not wake a recv() blocked in another thread; shutdown() does.
        sock = self._socket()
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.close()


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it wraps: requests wraps urllib3's errors (in ``args`` or ``reason``),
    which wrap the socket's ``OSError`` (as ``__cause__`` or ``__context__``)."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        reason = getattr(e, "reason", None)
        todo += [x for x in (reason, e.__cause__, e.__context__, *e.args) if isinstance(x, BaseException)]


# The root causes people meet, in their words (the first in the chain that matches wins).
_WORDS = (
    (socket.gaierror, "cannot find the host (its name does not resolve)"),
    (ConnectionRefusedError, "connection refused"),
    (ConnectionResetError, "the connection was reset"),
    (ConnectionAbortedError, "the connection was aborted"),
    (requests.exceptions.ConnectTimeout, "no answer within the connect timeout"),
    (urllib3.exceptions.ConnectTimeoutError, "no answer within the connect timeout"),
    (requests.exceptions.ReadTimeout, "the server stopped sending (read timeout)"),
    (urllib3.exceptions.ReadTimeoutError, "the server stopped sending (read timeout)"),
    (socket.timeout, "timed out"),
    (urllib3.exceptions.ProxyError, "the proxy refused the connection"),
    (http.client.IncompleteRead, "the connection closed before the whole response came"),
)
# What urllib3 wraps around a cause: the pool, the retries, the class names.
_NOISE = re.compile(r"HTTPS?Connection(Pool)?\([^)]*\):\s*|Max retries exceeded with url: \S+\s*|\(Caused by \w+\(|"
                    r"<[^>]*>:?\s*|\[Errno -?\d+\]\s*|[\"')]+$")


def describe_error(exc: BaseException) -> str:
    """What went wrong, in one short line of words (``connection refused``), never a library's repr."""
    causes = list(_causes(exc))
    for kind, words in _WORDS:
        if any(isinstance(e, kind) for e in causes):
            return words
    for e in reversed(causes):  # the innermost cause that explains itself
        if isinstance(e, OSError) and e.strerror:
            return str(e.strerror)[:1].lower() + str(e.strerror)[1:]
    text = " ".join(_NOISE.sub("", str(causes[-1])).split()) or " ".join(_NOISE.sub("", str(exc)).split())
    if len(text) > 200:
        text = text[:199] + "…"
    return text or type(exc).__name__
