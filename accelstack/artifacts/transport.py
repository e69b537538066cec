"""The one narrow interface between accelstack and the network.

Everything that speaks HTTP goes through :class:`Transport`. It knows nothing about hashes,
caches or retries: it opens one URL at one byte offset and hands back a :class:`Stream` of bytes,
raising :class:`~accelstack.artifacts.errors.FetchError` with ``transient`` set when trying again
may help (connection errors, timeouts, 5xx, 408, 429) and unset when it cannot (404, 403,
redirect loops, insecure redirects).

Only ``https://`` is accepted, except ``http://`` to a loopback address (``localhost``,
``127.0.0.0/8``, ``::1``) and ``file://`` (local mirrors and tests). Redirects are followed here,
hop by hop, so that every hop is checked against the same rule. TLS is verified against the
operating system's trust store (``truststore``, in this module's sessions only), and proxies come
from the environment (``HTTPS_PROXY``, ``HTTP_PROXY``, ``NO_PROXY``), as requests reads them.
"""
from __future__ import annotations

import http.client
import ipaddress
import logging
import os
import re
import socket
import threading
from pathlib import Path
from typing import Any, BinaryIO, Dict, Iterator, List, Optional
from urllib.parse import unquote, urljoin, urlsplit
from urllib.request import url2pathname

from .errors import FetchError, InsecureURLError

log = logging.getLogger(__name__)

DEFAULT_CONNECT_TIMEOUT = 15.0
DEFAULT_READ_TIMEOUT = 60.0
DEFAULT_MAX_REDIRECTS = 10
DEFAULT_CHUNK_SIZE = 1 << 20

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


def _redact(url: str) -> str:
    """The URL without user:password, for messages."""
    parts = urlsplit(url)
    if parts.username or parts.password:
        netloc = parts.hostname or ""
        if parts.port:
            netloc += f":{parts.port}"
        return parts._replace(netloc=netloc).geturl()
    return url


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


class _FileStream(Stream):
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


class _HTTPStream(Stream):
    def __init__(self, url: str, response: Any) -> None:  # response: requests.Response
        self.url = url
        self._resp = response
        self.status = response.status_code
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
                    f"{_redact(url)}: 206 reply without a valid Content-Range "
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

    def readinto(self, view: memoryview) -> int:
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
            raise FetchError(
                f"{_redact(self.url)}: transfer interrupted ({_describe(exc)})", transient=True, url=self.url
            ) from None
        if left is not None:
            self._left = left - n
        return n

    def _read_some(self, size: int) -> bytes:
        import requests
        import urllib3

        raw = self._resp.raw
        try:
            if hasattr(raw, "read1"):  # urllib3 >= 2
                return bytes(raw.read1(size, decode_content=False))
            return bytes(raw.read(size, decode_content=False))
        except (requests.RequestException, urllib3.exceptions.HTTPError, http.client.HTTPException, OSError,
                ValueError) as exc:
            raise FetchError(
                f"{_redact(self.url)}: transfer interrupted ({_describe(exc)})", transient=True, url=self.url
            ) from None

    def chunks(self, size: int = DEFAULT_CHUNK_SIZE) -> Iterator[bytes]:
        import requests
        import urllib3

        raw = self._resp.raw
        read1 = hasattr(raw, "read1")  # urllib3 >= 2
        while True:
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
                raise FetchError(
                    f"{_redact(self.url)}: transfer interrupted ({_describe(exc)})", transient=True, url=self.url
                ) from None
            if not data:
                return
            yield data

    def close(self) -> None:
        self._resp.close()

    def abort(self) -> None:
        # close() alone does not wake a recv() blocked in another thread; shutdown() does.
        raw = self._resp.raw
        sock = getattr(getattr(raw, "_connection", None), "sock", None)
        if sock is None:  # the response owns the socket: urllib3 -> http.client -> SocketIO
            fp = getattr(getattr(raw, "_fp", None), "fp", None)
            sock = getattr(getattr(fp, "raw", None), "_sock", None)
        if isinstance(sock, socket.socket):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.close()


def _describe(exc: BaseException) -> str:
    name = type(exc).__name__
    text = str(exc)
    # urllib3 messages nest the pool description; keep them short.
    if len(text) > 200:
        text = text[:200] + "..."
    return f"{name}: {text}" if text else name


_TLS_LOCK = threading.Lock()
_TLS_CONTEXT: List[Any] = []  # [the process's one truststore context], or [None] where there is none


def _trust_store_context() -> Optional[Any]:
    """An SSL context that verifies against the operating system's trust store (``truststore``,
    as pip does): a company's TLS-inspecting proxy whose root the IT department installed on the
    machine is trusted, which certifi's fixed bundle cannot know. ``None`` where truststore is not
    available (Python 3.9, or not installed): requests then verifies against certifi's bundle."""
    with _TLS_LOCK:
        if not _TLS_CONTEXT:
            context: Optional[Any] = None
            try:
                import ssl

                import truststore

                context = truststore.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            except Exception as exc:  # ImportError on 3.9; any failure falls back to certifi
                log.info("TLS: the system trust store is not available (%s); verifying against certifi's bundle",
                         _describe(exc))
            _TLS_CONTEXT.append(context)
        return _TLS_CONTEXT[0]


def _tls_adapter() -> Optional[Any]:
    """A requests adapter for https:// that uses :func:`_trust_store_context` (for this session
    only: nothing is injected into ``ssl`` or ``requests`` globally, so an embedding app's own
    HTTP clients are untouched). Proxies from the environment still apply: requests asks the
    adapter for a proxy manager, which gets the same context."""
    context = _trust_store_context()
    if context is None:
        return None
    from requests.adapters import HTTPAdapter

    class TrustStoreAdapter(HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> Any:
            kwargs["ssl_context"] = context
            return super().init_poolmanager(*args, **kwargs)

        def proxy_manager_for(self, *args: Any, **kwargs: Any) -> Any:
            kwargs["ssl_context"] = context
            return super().proxy_manager_for(*args, **kwargs)

        def cert_verify(self, conn: Any, url: str, verify: Any, cert: Any) -> None:
            super().cert_verify(conn, url, verify, cert)
            if verify is True:
                # requests would add certifi's bundle to every connection; the system store is the
                # trust (a bundle named by REQUESTS_CA_BUNDLE still is added, as the user asked)
                conn.ca_certs = None
                conn.ca_cert_dir = None

    return TrustStoreAdapter()


class Transport:
    """Opens URLs. One ``requests.Session`` per thread; connect and read timeouts on every request."""

    def __init__(
        self,
        *,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        max_redirects: int = DEFAULT_MAX_REDIRECTS,
        user_agent: Optional[str] = None,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_redirects = max_redirects
        if user_agent is None:
            try:
                from .. import __version__ as version
            except Exception:  # pragma: no cover - partial installs
                version = "0"
            user_agent = f"accelstack/{version}"
        self.user_agent = user_agent
        self._local = threading.local()
        self._sessions: List[Any] = []
        self._lock = threading.Lock()

    def _session(self) -> Any:
        session = getattr(self._local, "session", None)
        if session is None:
            import requests

            session = requests.Session()
            session.headers["User-Agent"] = self.user_agent
            # Bytes as stored: a transparently gunzipped body would not match the hash or size.
            session.headers["Accept-Encoding"] = "identity"
            session.trust_env = True  # HTTPS_PROXY, NO_PROXY, ... from the environment, as users expect
            adapter = _tls_adapter()
            if adapter is not None:
                session.mount("https://", adapter)
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

    def open(self, url: str, offset: int = 0) -> Stream:
        """Start reading ``url`` from byte ``offset`` (a Range request when ``offset > 0``).

        The server may ignore the range and reply 200 with the whole file: check ``Stream.start``.
        """
        check_url(url)
        scheme = urlsplit(url).scheme.lower()
        if scheme == "file":
            return _FileStream(url, Path(url2pathname(unquote(urlsplit(url).path))), offset)
        return self._open_http(url, offset)

    def _open_http(self, url: str, offset: int) -> Stream:
        import requests

        headers: Dict[str, str] = {}
        if offset > 0:
            headers["Range"] = f"bytes={offset}-"
        seen = [url]
        current = url
        for _hop in range(self.max_redirects + 1):
            try:
                resp = self._session().get(
                    current,
                    headers=headers,
                    stream=True,
                    allow_redirects=False,
                    timeout=(self.connect_timeout, self.read_timeout),
                )
            except requests.exceptions.InvalidURL as exc:
                raise FetchError(f"{_redact(current)}: invalid URL ({exc})", url=current) from None
            except requests.exceptions.SSLError as exc:
                if "CERTIFICATE_VERIFY_FAILED" not in str(exc):
                    raise FetchError(f"{_redact(current)}: {_describe(exc)}", transient=True, url=current) from None
                # Trying again cannot help; the usual cause is a TLS-inspecting proxy.
                raise FetchError(
                    f"{_redact(current)}: the server's TLS certificate is not trusted ({_describe(exc)})",
                    "if your network inspects TLS (a company proxy), install its root certificate in the "
                    "operating system's trust store, which accelstack uses; otherwise report the mirror",
                    url=current,
                ) from None
            except (requests.RequestException, OSError, ValueError) as exc:
                raise FetchError(
                    f"{_redact(current)}: {_describe(exc)}", transient=True, url=current
                ) from None
            status = resp.status_code
            if status in (301, 302, 303, 307, 308):
                location = resp.headers.get("Location")
                resp.close()
                if not location:
                    raise FetchError(f"{_redact(current)}: redirect ({status}) without a Location", url=current)
                target = urljoin(current, location)
                check_url(target)  # an https mirror may not send us to plain http
                if target in seen:
                    chain = " -> ".join(_redact(u) for u in seen + [target])
                    raise FetchError(f"redirect loop: {chain}", "the mirror is misconfigured; report it to its owner", url=url)
                seen.append(target)
                current = target
                continue
            if status in (200, 206):
                return _HTTPStream(current, resp)
            retry_after = _retry_after(resp.headers.get("Retry-After"))
            reason = resp.reason or http.client.responses.get(status, "")
            resp.close()
            transient = status in _TRANSIENT_STATUS or 500 <= status < 600
            raise FetchError(
                f"{_redact(current)}: HTTP {status} {reason}".rstrip(),
                transient=transient,
                status=status,
                retry_after=retry_after,
                url=current,
            )
        raise FetchError(
            f"{_redact(url)}: more than {self.max_redirects} redirects",
            "the mirror is misconfigured; report it to its owner",
            url=url,
        )


def _retry_after(value: Optional[str]) -> Optional[float]:
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: rare for downloads, ignore
    return max(0.0, seconds)
