"""Connections: bounded per peer and in total, incomplete requests timed out, the token holder answered.

uvicorn's h11 protocol keeps a connection that never completes a request open for ever (its
keep-alive timer starts only after a response, and any byte received cancels it), so idle and
dripping connections can use up the process's file descriptors: then nothing is accepted any
more, the token holder's requests included. This protocol adds three things to it:

- a deadline for each request, headers and body (``request_timeout``), armed when the connection
  opens and after each response, and *not* renewed by the bytes that arrive: a client that
  drips its request is closed when the deadline passes (408 when part of a request came);
- at most ``per_peer`` connections from one remote address and ``total`` in all (``total``
  below the descriptor limit, see :func:`connection_budget`; on loopback every local user shares
  one address, so only ``total`` applies there): past either, one connection without a request in
  progress is closed to make room for the new one: the one that has waited longest among those
  with nothing waiting to be read, else the one that has waited longest. A connection whose
  request has arrived but not been read yet (an app's, just accepted) is so kept until it is read,
  and a connection in the middle of a request that carries the service's token is never closed
  for room; only when every connection is such a request is the new one refused (503 ``busy``).

So a client without the token can hold connections only while no one else needs them, and the
token holder's new connection gets in and is answered.
"""
from __future__ import annotations

import ipaddress
import logging
import select
import time
from dataclasses import dataclass
from typing import Any, Callable, List, Optional

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .security import SECURITY_HEADERS

try:
    import resource
except ImportError:  # Windows: no descriptor limit to read
    resource = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

__all__ = ["MAX_CONNECTIONS", "MAX_PER_PEER", "REQUEST_TIMEOUT", "RESERVED_FDS", "Limits", "connection_budget",
           "raw_response", "guarded_protocol"]

MAX_CONNECTIONS = 256  # an app and a page need a handful; event streams one each
MAX_PER_PEER = 128  # from one remote address (on loopback every local user is 127.0.0.1: only the total applies)
REQUEST_TIMEOUT = 10.0  # seconds for a whole request, headers and body (bodies are at most 64 KiB)
RESERVED_FDS = 128  # descriptors kept for everything else: jobs, their workers, logs, the thread pool

Authorized = Callable[[Optional[str]], bool]  # the request's Authorization header -> carries the token


@dataclass(frozen=True)
class Limits:
    total: int = MAX_CONNECTIONS
    per_peer: int = MAX_PER_PEER
    request_timeout: float = REQUEST_TIMEOUT


def connection_budget(limit: int = MAX_CONNECTIONS) -> int:
    """``limit``, or fewer where the descriptor limit is low (macOS's default is 256): half of what
    the process may open beyond ``RESERVED_FDS``, so a full table never makes ``accept`` fail."""
    if resource is None:
        return limit
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return limit
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return limit
    return max(8, min(limit, (soft - RESERVED_FDS) // 2))


_SECURITY = "".join(f"{k.decode()}: {v.decode()}\r\n" for k, v in SECURITY_HEADERS)


def raw_response(status: int, reason: str, body: bytes = b"", extra: str = "") -> bytes:
    """A whole response, written straight to a connection that has no request cycle to answer."""
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"cache-control: no-store\r\n{_SECURITY}connection: close\r\n{extra}\r\n")
    return head.encode("latin-1") + body


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a request deadline and room made by age (see the module)."""

    limits = Limits()
    refusal = raw_response(503, "Service Unavailable")  # guarded_protocol sets the error document
    timed_out = raw_response(408, "Request Timeout")

    @staticmethod
    def authorized(authorization: Optional[str]) -> bool:
        return False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.peer = ""
        self.fd = -1
        self.since = 0.0  # when the current wait for a request began (the age rooms are made by)
        self.dropped = False
        self.deadline: Any = None

    # -- uvicorn's protocol interface ------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self.peer = self.client[0] if self.client else ""
        sock = transport.get_extra_info("socket")
        self.fd = sock.fileno() if sock is not None else -1
        if not self._make_room():
            self.dropped = True
            log.warning("refused a connection: every one of %d connections is serving the token holder",
                        self.limits.total)
            transport.write(self.refusal)
            transport.close()
            return
        self._arm()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.dropped = True
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
            self._disarm()  # the request is complete: the app's response may take as long as it needs

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():
            return
        if self.conn.their_state in (h11.IDLE, h11.SEND_BODY):
            self._arm()  # waiting for the next request (or the rest of this one's body)
        else:
            self._disarm()

    # -- the deadline ------------------------------------------------------------------------------
    def _arm(self) -> None:
        self._disarm()
        self.since = time.monotonic()
        self.deadline = self.loop.call_later(self.limits.request_timeout, self._expire)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _expire(self) -> None:
        self.deadline = None
        if self.transport.is_closing():
            return
        partial = bool(self.conn.trailing_data[0]) or self.conn.their_state is h11.SEND_BODY
        # no response begun: none after the last one, or a request whose body is still coming
        idle = self.cycle is None or self.cycle.response_complete or not self.cycle.response_started
        log.debug("closing a connection from %s: no complete request within %.0f s", self.peer,
                  self.limits.request_timeout)
        if partial and idle:
            self.transport.write(self.timed_out)
        self.transport.close()  # a request in the middle of its body sees a disconnect

    # -- room ----------------------------------------------------------------------------------------
    def serving_token_holder(self) -> bool:
        """In the middle of a request that carries the service's token (never closed for room)."""
        if self.cycle is None or self.cycle.response_complete:
            return False
        auth = next((v for k, v in self.cycle.scope["headers"] if k == b"authorization"), None)
        return self.authorized(auth.decode("latin-1") if auth is not None else None)

    def _make_room(self) -> bool:
        others = [c for c in self.connections if c is not self and isinstance(c, GuardedH11Protocol) and not c.dropped]
        mine = [c for c in others if c.peer == self.peer]
        if len(mine) >= self.limits.per_peer and not _loopback(self.peer) and not _close_oldest(mine):
            return False
        others = [c for c in others if not c.dropped]
        return len(others) < self.limits.total or _close_oldest(others)


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _waiting_to_be_read(conns: List[GuardedH11Protocol]) -> set:
    """The descriptors of ``conns`` with bytes the loop has not read yet (one poll, no waiting)."""
    if not hasattr(select, "poll"):
        return set()
    poller = select.poll()
    for c in conns:
        if c.fd >= 0:
            poller.register(c.fd, select.POLLIN)
    try:
        return {fd for fd, ev in poller.poll(0) if ev & select.POLLIN}
    except OSError:
        return set()


def _close_oldest(conns: List[GuardedH11Protocol]) -> bool:
    """Close the connection that has waited longest with nothing to read, else the one that has
    waited longest; False when each is serving the token holder."""
    candidates = [c for c in conns if not c.serving_token_holder()]
    if not candidates:
        return False
    speaking = _waiting_to_be_read(candidates)
    victim = min(candidates, key=lambda c: (c.fd in speaking, c.since))
    victim.dropped = True
    victim._disarm()
    victim.transport.abort()  # at once: no lingering write buffer, its descriptor freed now
    return True


def guarded_protocol(limits: Limits, authorized: Authorized, refusal: bytes) -> type:
    """The protocol class uvicorn is given (``Config(http=...)``): these limits, this token check."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,),
                {"limits": limits, "authorized": staticmethod(authorized), "refusal": refusal})
