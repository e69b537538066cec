"""The one narrow interface between accelstack and the network.

Everything that speaks HTTP goes through :class:`Transport`. It knows nothing about hashes,
caches or retries: it opens one URL at one byte offset and hands back a :class:`Stream` of bytes,
raising :class:`~accelstack.artifacts.errors.FetchError` with ``transient`` set when trying again
may help (connection errors, timeouts, 5xx, 408, 429) and unset when it cannot (404, 403,
redirect loops, insecure redirects).

Only ``https://`` is accepted, except ``http://`` to a loopback address (``localhost``,
``127.0.0.0/8``, ``::1``) and ``file://`` (local mirrors and tests). Redirects are followed here,
hop by hop, so that every hop is checked against the same rule. TLS is verified against the
operating system's trust store (:mod:`.tls`, in this module's sessions only), and proxies come
from the environment (``HTTPS_PROXY``, ``HTTP_PROXY``, ``NO_PROXY``), as requests reads them. The
bytes of a response are a :class:`~accelstack.artifacts.streams.Stream`.

Every fetch that says how many bytes it expects (``expect``: an artifact's remaining size, a
document's cap) has an overall deadline, since a server that sends one byte now and then never
trips the read timeout: ``connect_timeout + bytes / min_rate`` seconds from the request, where
``bytes`` is the smaller of ``expect`` and the Content-Length the server announces, and a
document's share is at most ``document_timeout``. Past it the read raises
:class:`~accelstack.artifacts.errors.SlowTransferError` (not transient: the next mirror is tried).
"""
from __future__ import annotations

import http.client
import ipaddress
import logging
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional
from urllib.parse import unquote, urljoin, urlsplit
from urllib.request import url2pathname

import requests

from .. import __version__
from ..settings import Timeouts
from .errors import FetchError, InsecureURLError, SlowTransferError
from .header_watch import HeaderWatch, watch_connections
from .streams import DEFAULT_CHUNK_SIZE, FileStream, HTTPStream, Stream, describe_error, rate_text, redact_url
from .tls import tls_adapter

__all__ = ["DEFAULT_CHUNK_SIZE", "DEFAULT_CONNECT_TIMEOUT", "DEFAULT_DOCUMENT_TIMEOUT", "DEFAULT_MAX_REDIRECTS",
           "DEFAULT_MIN_RATE", "DEFAULT_READ_TIMEOUT", "Stream", "Transport", "check_url", "is_loopback_host"]

log = logging.getLogger(__name__)

DEFAULT_CONNECT_TIMEOUT = Timeouts.connect
DEFAULT_READ_TIMEOUT = Timeouts.read
DEFAULT_MIN_RATE = Timeouts.min_rate  # bytes per second: 64 KiB/s, a slow mobile link
DEFAULT_DOCUMENT_TIMEOUT = Timeouts.document
DEFAULT_MAX_REDIRECTS = 10

_TRANSIENT_STATUS = {408, 425, 429, 500, 502, 503, 504}


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals; names are never resolved."""
    host = (host or "").strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_url(url: str) -> None:
    """Raise :class:`InsecureURLError` unless ``url`` may be fetched."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError as exc:
        raise InsecureURLError(f"not a valid URL: {url!r} ({exc})", url=url) from None
    scheme = parts.scheme.lower()
    if scheme == "https" and host:
        return
    if scheme == "http" and host and is_loopback_host(host):
        return
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise InsecureURLError(f"file:// URL names a remote host: {url}", url=url)
        return
    raise InsecureURLError(
        f"refusing to download from {url}: only https:// is accepted "
        "(plain http:// only for loopback addresses, and file:// for local mirrors)",
        "ask the publisher for an https:// mirror",
        url=url,
    )


class Transport:
    """Opens URLs. One ``requests.Session`` per thread; connect and read timeouts on every request,
    and an overall deadline from ``min_rate`` (bytes per second; 0: none) on every sized fetch."""

    def __init__(
        self,
        *,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        max_redirects: int = DEFAULT_MAX_REDIRECTS,
        user_agent: Optional[str] = None,
        min_rate: float = DEFAULT_MIN_RATE,
        document_timeout: float = DEFAULT_DOCUMENT_TIMEOUT,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.min_rate = min_rate
        self.document_timeout = document_timeout
        self.max_redirects = max_redirects
        if user_agent is None:
            user_agent = f"accelstack/{__version__}"
        self.user_agent = user_agent
        self._local = threading.local()
        self._sessions: List[Any] = []
        self._lock = threading.Lock()

    @classmethod
    def from_timeouts(cls, timeouts: Optional[Timeouts]) -> Transport:
        """A transport with the connect/read timeouts and deadlines of ``Settings.timeouts``."""
        t = timeouts or Timeouts()
        return cls(connect_timeout=t.connect, read_timeout=t.read, min_rate=t.min_rate, document_timeout=t.document)

    def deadline_for(self, size: Optional[int], *, document: bool = False) -> Optional[float]:
        """Seconds a fetch of at most ``size`` bytes may take in all, from its request (None: no deadline)."""
        if size is None or self.min_rate <= 0:
            return None
        seconds = max(0, size) / self.min_rate
        if document:
            seconds = min(seconds, self.document_timeout)
        return self.connect_timeout + seconds

    def _session(self) -> Any:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.headers["User-Agent"] = self.user_agent
            # Bytes as stored: a transparently gunzipped body would not match the hash or size.
            session.headers["Accept-Encoding"] = "identity"
            session.trust_env = True  # HTTPS_PROXY, NO_PROXY, ... from the environment, as users expect
            adapter = tls_adapter()
            session.mount("http://", watch_connections(requests.adapters.HTTPAdapter()))
            session.mount("https://", watch_connections(adapter or requests.adapters.HTTPAdapter()))
            self._local.session = session
            with self._lock:
                self._sessions.append(session)
        return session

    def close(self) -> None:
        with self._lock:
            sessions, self._sessions = self._sessions, []
        for session in sessions:
            session.close()

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self, url: str, offset: int = 0, *, accept: str = "", expect: Optional[int] = None,
             document: bool = False) -> Stream:
        """Start reading ``url`` from byte ``offset`` (a Range request when ``offset > 0``).

        The server may ignore the range and reply 200 with the whole file: check ``Stream.start``.
        ``accept`` is the request's Accept header (a package index's page kinds, in order of
        preference); the reply's kind is ``Stream.content_type``. ``expect``: the most body bytes
        this fetch should take (what is left of an artifact, a document's cap), which sets its
        overall deadline (:meth:`deadline_for`; ``document``: capped at ``document_timeout``).
        """
        check_url(url)
        scheme = urlsplit(url).scheme.lower()
        if scheme == "file":
            return FileStream(url, Path(url2pathname(unquote(urlsplit(url).path))), offset)
        opened = time.monotonic()
        budget = self.deadline_for(expect, document=document)
        stream = self._open_http(url, offset, accept, budget)
        if budget is not None and isinstance(stream, HTTPStream):
            announced = self.deadline_for(stream.length, document=document)
            if announced is not None:
                budget = min(budget, announced)  # a small declared body gets a small deadline
            try:
                stream.start_deadline(opened, opened + budget, self.min_rate)
            except FetchError:
                stream.close()
                raise
        return stream

    def _open_http(self, url: str, offset: int, accept: str = "", budget: Optional[float] = None) -> Stream:
        headers: Dict[str, str] = {}
        if offset > 0:
            headers["Range"] = f"bytes={offset}-"
        if accept:
            headers["Accept"] = accept
        seen = [url]
        current = url
        started = time.monotonic()
        for _hop in range(self.max_redirects + 1):
            left = None if budget is None else budget - (time.monotonic() - started)
            watch = HeaderWatch(left)
            try:
                with watch:
                    resp = self._session().get(
                        current,
                        headers=headers,
                        stream=True,
                        allow_redirects=False,
                        # No single wait longer than the whole fetch may take (the headers included).
                        timeout=(self.connect_timeout,
                                 self.read_timeout if budget is None else min(self.read_timeout, budget)),
                    )
            except Exception as exc:
                if not watch.expired:
                    _refuse(exc, current)
                seconds = time.monotonic() - started
                raise SlowTransferError(
                    f"{redact_url(current)} did not send its reply's headers in {seconds:.0f} s (a server that "
                    f"drips bytes): slower than the {rate_text(self.min_rate)} minimum; try another mirror",
                    received=0, seconds=seconds, min_rate=self.min_rate, url=current) from None
            if watch.expired:
                resp.close()
                raise SlowTransferError(f"{redact_url(current)} did not send its reply's headers in time: slower than "
                                        f"the {rate_text(self.min_rate)} minimum; try another mirror",
                                        received=0, seconds=time.monotonic() - started, min_rate=self.min_rate,
                                        url=current)
            status = resp.status_code
            if status in (301, 302, 303, 307, 308):
                location = resp.headers.get("Location")
                resp.close()
                if not location:
                    raise FetchError(f"{redact_url(current)}: redirect ({status}) without a Location", url=current)
                target = urljoin(current, location)
                check_url(target)  # an https mirror may not send us to plain http
                if target in seen:
                    chain = " -> ".join(redact_url(u) for u in seen + [target])
                    raise FetchError(f"redirect loop: {chain}", "the mirror is misconfigured; report it to its owner", url=url)
                seen.append(target)
                current = target
                continue
            if status in (200, 206):
                return HTTPStream(current, resp)
            retry_after = _retry_after(resp.headers.get("Retry-After"))
            reason = resp.reason or http.client.responses.get(status, "")
            resp.close()
            transient = status in _TRANSIENT_STATUS or 500 <= status < 600
            raise FetchError(
                f"{redact_url(current)}: HTTP {status} {reason}".rstrip(),
                transient=transient,
                status=status,
                retry_after=retry_after,
                url=current,
            )
        raise FetchError(
            f"{redact_url(url)}: more than {self.max_redirects} redirects",
            "the mirror is misconfigured; report it to its owner",
            url=url,
        )


def _refuse(exc: BaseException, current: str) -> None:
    """Raise the FetchError for ``exc``, an error sending a request or reading its headers."""
    if isinstance(exc, requests.exceptions.InvalidURL):
        raise FetchError(f"{redact_url(current)}: invalid URL ({exc})", url=current) from None
    if isinstance(exc, requests.exceptions.SSLError):
        if "CERTIFICATE_VERIFY_FAILED" not in str(exc):
            raise FetchError(f"{redact_url(current)}: {describe_error(exc)}", transient=True, url=current) from None
        # Trying again cannot help; the usual cause is a TLS-inspecting proxy.
        raise FetchError(
            f"{redact_url(current)}: the server's TLS certificate is not trusted ({describe_error(exc)})",
            "if your network inspects TLS (a company proxy), install its root certificate in the "
            "operating system's trust store, which accelstack uses; otherwise report the mirror",
            url=current,
        ) from None
    if isinstance(exc, (requests.RequestException, OSError, ValueError)):
        raise FetchError(f"cannot reach {redact_url(current)}: {describe_error(exc)}", transient=True,
                         url=current) from None
    raise exc


def _retry_after(value: Optional[str]) -> Optional[float]:
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: rare for downloads, ignore
    return max(0.0, seconds)
