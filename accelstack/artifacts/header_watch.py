"""A deadline on the wait for a reply's headers.

requests' read timeout bounds each wait for a byte, so a server (a captive portal, a hostile
mirror) that drips its status line and headers one byte at a time is never timed out. The body has
its own watchdog (``HTTPStream.start_deadline``); this covers the part before it: the transport's
connections note which one sends the current request on this thread, and a timer shuts that
connection's socket down when the fetch's budget is spent, waking the blocked read.
"""
from __future__ import annotations

import socket
import threading
from typing import Any, Optional

from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

__all__ = ["HeaderWatch", "watch_connections"]

_ACTIVE = threading.local()  # .watch: the HeaderWatch of the request this thread is sending


class HeaderWatch:
    """``with HeaderWatch(seconds):`` around sending a request and reading its headers; ``expired``
    says afterwards whether the timer cut it (the caller then reports a slow server)."""

    def __init__(self, seconds: Optional[float]) -> None:
        self.seconds = seconds
        self.expired = False
        self._conn: Any = None
        self._done = False
        self._lock = threading.Lock()
        self._timer: Optional[threading.Timer] = None

    def sending(self, conn: Any) -> None:
        with self._lock:
            self._conn = conn

    def _expire(self) -> None:
        with self._lock:
            if self._done:
                return  # the headers came: the socket is the body's now, under its own deadline
            self.expired = True
            sock = getattr(self._conn, "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> HeaderWatch:
        if self.seconds is not None:
            _ACTIVE.watch = self
            self._timer = threading.Timer(max(0.0, self.seconds), self._expire)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._done = True
        if self._timer is not None:
            self._timer.cancel()
            _ACTIVE.watch = None


class _Noted:
    """Mixed into urllib3's connections: tell this thread's HeaderWatch which connection sends."""

    def request(self, *args: Any, **kwargs: Any) -> Any:
        watch = getattr(_ACTIVE, "watch", None)
        if watch is not None:
            watch.sending(self)
        return super().request(*args, **kwargs)  # type: ignore[misc]


class _HTTPConnection(_Noted, HTTPConnection):
    pass


class _HTTPSConnection(_Noted, HTTPSConnection):
    pass


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


def watch_connections(adapter: HTTPAdapter) -> HTTPAdapter:
    """``adapter`` with connections a :class:`HeaderWatch` can cut (direct ones; through a proxy
    the read timeout alone still applies)."""
    adapter.poolmanager.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}
    return adapter
