"""Who may talk to the service: the per-launch token, the Host and Origin checks, CORS, body limits.

A local HTTP service is reachable by every web page the user opens (a page can send requests to
127.0.0.1) and by every local user. So, before any route runs:

- ``Host`` must name this service (127.0.0.1:PORT or localhost:PORT): a DNS-rebinding page
  reaches 127.0.0.1 under its own host name and is refused;
- an ``Origin``, when a browser sends one, must be this service's own or one the app configured;
- every request carries ``Authorization: Bearer <token>``, a random token made at launch and
  written to a file only this user can read; the exceptions are ``GET /``, the static page,
  which holds no data (it reads the token from its URL fragment and sends it with each call),
  and ``GET /favicon.ico``, a 204 (a browser asks for it on its own, and would log a 401);
- a request body is at most ``max_body`` bytes (the API takes small JSON documents only).

Refusals are JSON errors of the shape every error has (that of the CLI's error line, :mod:`.errors`).
"""
from __future__ import annotations

import hmac
import ipaddress
import json
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, FrozenSet, List, MutableMapping, Optional, Tuple

from ..errors import UsageError
from ..fsio import write_bytes
from ..serde import size_text
from .errors import (
    Describe,
    Forbidden,
    PayloadTooLarge,
    RemoteBindRefused,
    ServiceError,
    Unauthorized,
    describe_error,
    error_document,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

__all__ = ["FAVICON", "PUBLIC_PATHS", "SECURITY_HEADERS", "CORS_METHODS", "CORS_HEADERS", "new_token", "write_token_file", "is_loopback", "check_bind",
           "url_host", "DIGITS", "Policy", "normalize_origin", "error_body", "Guard"]

FAVICON = "/favicon.ico"  # answered by the guard itself: 204, no icon
# on every response, the guard's own answers included (docs/serve.md)
SECURITY_HEADERS = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"),
                    (b"x-frame-options", b"DENY")]
PUBLIC_PATHS = frozenset({"/", FAVICON})  # GET/HEAD only: the static page and its (empty) icon
CORS_METHODS = "GET, POST, DELETE"
CORS_HEADERS = "Authorization, Content-Type, Last-Event-ID"
DIGITS = re.compile(r"[0-9]+", re.ASCII)  # str.isdigit() also takes "²", which int() refuses


class _ClientGone(Exception):
    """The client left in the middle of its body: nothing of it is handed to a route."""


def new_token() -> str:
    """256 random bits, URL-safe (it travels in a URL fragment to the page)."""
    return secrets.token_urlsafe(32)


def write_token_file(path: Path, token: str) -> Path:
    """Write ``token`` to ``path``, readable by this user only (0600 in a 0700 directory).

    An old file is replaced, never written through (it could be a link planted by someone else):
    the new one is made beside it, 0600 from its creation, and renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.chmod(path.parent, 0o700)
    except OSError:
        pass  # a directory we do not own: the file's own mode still protects it
    return write_bytes(path, (token + "\n").encode("ascii"), mode=0o600)


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, allow_remote: bool) -> None:
    if not is_loopback(host) and not allow_remote:
        raise RemoteBindRefused(f"refusing to listen on {host}: it is reachable from other machines",
                                hint="listen on 127.0.0.1 (the default), or allow remote access explicitly "
                                "(every request still needs the token)")


def url_host(host: str) -> str:
    """``host`` as it appears in a URL (IPv6 in brackets)."""
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host


@dataclass
class Policy:
    """What the guard lets through; made once the port is known."""

    token: str
    port: int
    host: str = "127.0.0.1"
    allow_remote: bool = False
    cors_origins: FrozenSet[str] = frozenset()
    max_body: int = 64 * 1024
    describe: Describe = error_document  # how an error is written (the CLI's error line under serve)
    hosts: FrozenSet[str] = field(init=False)

    def __post_init__(self) -> None:
        names = {"127.0.0.1", "localhost", url_host(self.host).lower()}
        if self.host in ("::1", "[::1]"):
            names.add("[::1]")
        self.hosts = frozenset(f"{n}:{self.port}" for n in names)
        self.cors_origins = frozenset(normalize_origin(o) for o in self.cors_origins)

    def host_ok(self, host: Optional[str]) -> bool:
        if self.allow_remote:  # any name may reach a remote service; the token guards it
            return host is not None
        return host is not None and host.lower() in self.hosts

    def origin_ok(self, origin: str, host: str) -> bool:
        """The page's own origin (same scheme, host and port as the request) or a configured one."""
        o = normalize_origin(origin)
        return o == f"http://{host.lower()}" or o in self.cors_origins

    def token_ok(self, authorization: Optional[str]) -> bool:
        if not authorization:
            return False
        scheme, _, value = authorization.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), self.token.encode())


def normalize_origin(origin: str) -> str:
    return origin.strip().rstrip("/").lower()


_ORIGIN = re.compile(r"https?://(\[[0-9a-f:.]+\]|[a-z0-9]([a-z0-9.-]*[a-z0-9])?)(:[0-9]{1,5})?")


def check_origin(value: str) -> str:
    """A ``--cors-origin`` as browsers send it: ``http(s)://host[:port]``, nothing more; or a
    :class:`UsageError`. ``null`` (what sandboxed frames, ``file://`` pages and ``data:`` URLs send)
    would open the API to any of them; ``*``, a path or a bare host would never match a request."""
    origin = normalize_origin(value)
    match = _ORIGIN.fullmatch(origin)
    if match is None or int((match.group(3) or ":0")[1:]) > 65535:
        raise UsageError(f"--cors-origin {value!r} is not a web origin",
                         "give the scheme, host and port of the page that calls the API, as its browser sends "
                         "them: http://localhost:5173 (no path, no wildcard, not null)")
    return origin


def error_body(exc: ServiceError, describe: Describe = error_document) -> bytes:
    return json.dumps({"error": describe_error(describe, "serve", exc)}).encode()


class Guard:
    """The ASGI middleware that applies :class:`Policy` before the routes see a request."""

    def __init__(self, app: ASGIApp, policy: Policy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # no websockets
            return
        headers = _headers(scope)
        origin = headers.get("origin")
        cors = origin is not None and normalize_origin(origin) in self.policy.cors_origins
        try:
            self._check(scope, headers)
        except ServiceError as exc:
            await _respond(send, exc.status, error_body(exc, self.policy.describe), cors_origin=origin if cors else None,
                           extra=[(b"www-authenticate", b"Bearer")] if exc.status == 401 else [])
            return
        if scope["path"] == FAVICON:  # a browser asks on its own: no icon, and no 401 in its console
            await send({"type": "http.response.start", "status": 204,
                        "headers": [(b"cache-control", b"max-age=86400"), *SECURITY_HEADERS]})
            await send({"type": "http.response.body", "body": b""})
            return
        if scope["method"] == "OPTIONS":  # a preflight from an allowed origin (checked above)
            await _respond(send, 204, b"", cors_origin=origin, extra=[
                (b"access-control-allow-methods", CORS_METHODS.encode()),
                (b"access-control-allow-headers", CORS_HEADERS.encode()),
                (b"access-control-max-age", b"600")])
            return
        try:
            receive = await self._bounded_body(scope, headers, receive)
        except _ClientGone:  # a truncated body could still parse (and start a job): drop it
            return
        except ServiceError as exc:
            await _respond(send, exc.status, error_body(exc, self.policy.describe), cors_origin=origin if cors else None)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                hs = list(message.get("headers", []))
                hs += SECURITY_HEADERS
                if not any(k.lower() == b"cache-control" for k, _ in hs):
                    hs.append((b"cache-control", b"no-store"))
                if cors and origin is not None:
                    hs += [(b"access-control-allow-origin", origin.encode()), (b"vary", b"Origin")]
                message["headers"] = hs
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _check(self, scope: Scope, headers: Dict[str, str]) -> None:
        if not self.policy.host_ok(headers.get("host")):
            raise Forbidden(f"the Host header {headers.get('host', '(none)')!r} does not name this service",
                            hint="connect to 127.0.0.1 or localhost with the service's port", code="bad-host")
        origin = headers.get("origin")
        if origin is not None and not self.policy.origin_ok(origin, headers["host"]):
            raise Forbidden(f"requests from the web page at {origin!r} are not allowed",
                            hint="the app that starts the service can allow its own origin", code="bad-origin")
        if scope["method"] == "OPTIONS":
            if origin is None or normalize_origin(origin) not in self.policy.cors_origins:
                raise Forbidden("cross-origin requests are allowed only from the origins the service was started with",
                                code="bad-origin")
            return
        if scope["method"] in ("GET", "HEAD") and scope["path"] in PUBLIC_PATHS:
            return
        if not self.policy.token_ok(headers.get("authorization")):
            raise Unauthorized("this request needs the service's token",
                               hint="send 'Authorization: Bearer <token>' with the token from the service's token file",
                               code="unauthorized")

    async def _bounded_body(self, scope: Scope, headers: Dict[str, str], receive: Receive) -> Receive:
        """The whole body, read up front and at most ``max_body`` bytes; a receive that replays it."""
        limit = self.policy.max_body
        too_large = PayloadTooLarge(f"the request body is larger than the {size_text(limit)} accepted",
                                    hint="job options are a small JSON document", code="payload-too-large")
        length = headers.get("content-length")
        if length is not None:
            if not DIGITS.fullmatch(length):
                raise ServiceError("the Content-Length header is not a number", code="bad-request")
            if int(length) > limit:
                raise too_large
        if scope["method"] in ("GET", "HEAD", "DELETE") and length is None and "transfer-encoding" not in headers:
            return receive
        chunks: List[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone()
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                raise too_large
            chunks.append(body)
            if not message.get("more_body", False):
                break
        data = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": data, "more_body": False}
            return await receive()

        return replay


def _headers(scope: Scope) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for k, v in scope.get("headers", []):
        name = k.decode("latin-1").lower()
        if name in out:  # a repeated security header is suspicious: keep the first, like most servers
            continue
        out[name] = v.decode("latin-1")
    return out


async def _respond(send: Send, status: int, body: bytes, *, cors_origin: Optional[str] = None,
                   extra: Optional[List[Tuple[bytes, bytes]]] = None) -> None:
    hs = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
          (b"cache-control", b"no-store"), *SECURITY_HEADERS]
    if cors_origin:
        hs += [(b"access-control-allow-origin", cors_origin.encode()), (b"vary", b"Origin")]
    hs += extra or []
    await send({"type": "http.response.start", "status": status, "headers": hs})
    await send({"type": "http.response.body", "body": body})
