"""The worker's HTTP API (see :mod:`accelstack.engine.worker.main` for the endpoints).

Every request must carry the per-launch token; long polls wait on the state's condition
variable. ``/cancel`` during a job and ``/shutdown`` end the process right after answering.

Any local process can connect to 127.0.0.1, so the server bounds what a connection can cost
before it has shown the token (:class:`WorkerHTTPServer`): every socket has a timeout; at most
``WORKER_MAX_UNAUTHENTICATED`` connections may be waiting to show the token, and a new one pushes
the oldest out (so a crowd of idle connections never locks the token holder out: its request
arrives right after it connects); at most ``WORKER_MAX_CONNECTIONS`` in all (the file descriptors
stay far from the process limit, where ``accept`` would fail in a loop). Request line and headers
share a byte budget; a request without the right token is answered 401 and its connection closed
without reading its body; ``Content-Length`` must be plain digits within ``WORKER_MAX_BODY_BYTES``.
"""
from __future__ import annotations

import collections
import hmac
import json
import math
import os
import re
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple, Type
from urllib.parse import parse_qs, urlparse

from ...limits import (
    WORKER_MAX_BODY_BYTES,
    WORKER_MAX_CONNECTIONS,
    WORKER_MAX_HEADER_BYTES,
    WORKER_MAX_QUERY_CHARS,
    WORKER_MAX_UNAUTHENTICATED,
    WORKER_SOCKET_TIMEOUT,
    MalformedInput,
    parse_json,
    too_large,
)
from ...serde import from_dict, to_dict
from .protocol import EXIT_CANCELLED, EXIT_OK, LISTEN_BACKLOG, GenerateRequest
from .state import WorkerState

__all__ = ["make_server", "make_handler", "WorkerHTTPServer", "exit_soon", "MAX_WAIT"]

MAX_WAIT = 30.0  # longest a long-polling request may wait
MAX_QUERY_FIELDS = 8
_DIGITS = re.compile(r"[0-9]{1,12}")
_VERSION = re.compile(r"-?[0-9]{1,18}")


class _HeaderBudget:
    """The connection's reader with a byte budget for each request's line and headers: past it,
    lines come back cut short, so a request cannot make the server buffer more than the budget
    (http.server alone allows 100 headers of 64 KiB). Bodies are read through unbudgeted."""

    def __init__(self, raw: Any, budget: int) -> None:
        self.raw = raw
        self.budget = budget
        self.left = budget

    def reset(self) -> None:
        self.left = self.budget

    def readline(self, limit: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        want = self.left if limit is None or limit < 0 else min(limit, self.left)
        line = self.raw.readline(want)
        self.left -= len(line)
        return line

    def read(self, n: int = -1) -> bytes:
        return self.raw.read(n)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


class WorkerHTTPServer(ThreadingHTTPServer):
    """The worker's server: one daemon thread per connection, with the bounds described above."""

    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: Tuple[str, int], handler: Type[BaseHTTPRequestHandler],
                 bind_and_activate: bool = True) -> None:
        super().__init__(address, handler, bind_and_activate)
        self.guard = threading.Lock()
        self.waiting: collections.OrderedDict[socket.socket, None] = collections.OrderedDict()  # no token yet
        self.open_connections = 0
        self.dropped = 0  # connections pushed out or refused by the bounds
        self.errors = 0  # handler exceptions (a bug if it is not 0)

    def process_request(self, request: Any, client_address: Any) -> None:
        evicted: Optional[socket.socket] = None
        with self.guard:
            if self.open_connections >= WORKER_MAX_CONNECTIONS:
                self.dropped += 1
                self.shutdown_request(request)
                return
            self.open_connections += 1
            self.waiting[request] = None
            if len(self.waiting) > WORKER_MAX_UNAUTHENTICATED:
                evicted, _ = self.waiting.popitem(last=False)
                self.dropped += 1
        if evicted is not None:
            try:  # its thread's next read ends at once; that thread closes it
                evicted.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread could be started: this connection is over
            self._forget(request)
            self.shutdown_request(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)

    def _forget(self, request: Any) -> None:
        with self.guard:
            self.open_connections -= 1
            self.waiting.pop(request, None)

    def authenticated(self, request: Any) -> None:
        """The connection showed the token: it no longer counts as waiting (it cannot be evicted)."""
        with self.guard:
            self.waiting.pop(request, None)

    def handle_error(self, request: Any, client_address: Any) -> None:
        self.errors += 1  # one line in the worker's log, not a traceback per hostile request
        exc = sys.exc_info()[1]
        try:
            sys.stderr.write(f"[WARN] worker http: {type(exc).__name__}: {str(exc)[:200]}\n")
        except (OSError, ValueError):
            pass


def make_server(state: WorkerState, sock: socket.socket) -> WorkerHTTPServer:
    """The worker's server on ``sock``, a socket that already listens on 127.0.0.1
    (:func:`accelstack.engine.worker.main.listen`: bound before this module was imported, so requests
    that come sooner wait in its queue); call ``serve_forever``."""
    server = WorkerHTTPServer(sock.getsockname(), make_handler(state), bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.server_name, server.server_port = "127.0.0.1", sock.getsockname()[1]
    return server


def make_handler(state: WorkerState) -> Type[BaseHTTPRequestHandler]:
    """The request handler class bound to ``state``."""
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = WORKER_SOCKET_TIMEOUT  # every read and write on the connection
        server: WorkerHTTPServer

        def log_message(self, format: str, *args: Any) -> None:  # quiet: the supervisor keeps the log
            pass

        def setup(self) -> None:
            super().setup()
            self.rfile = _HeaderBudget(self.rfile, WORKER_MAX_HEADER_BYTES)  # type: ignore[assignment]

        def parse_request(self) -> bool:
            if not super().parse_request():
                return False
            if self.request_version == "HTTP/0.9":  # no status line to answer with: drop it
                self.close_connection = True
                return False
            return True

        def handle_one_request(self) -> None:
            self.rfile.reset()  # type: ignore[attr-defined]
            try:
                super().handle_one_request()
            except (OSError, ValueError):  # a timeout, a reset, a connection pushed out: it is over
                self.close_connection = True

        def _send(self, code: int, payload: Any, close: bool = False) -> None:
            body = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()

        def _authorized(self) -> bool:
            given = self.headers.get("Authorization", "")
            if hmac.compare_digest(given.encode("utf-8", "replace"), f"Bearer {state.token}".encode()):
                self.server.authenticated(self.connection)
                return True
            # Answered and dropped: its body (if any) is never read.
            self._send(401, {"error": "bad or missing token", "kind": "Unauthorized"}, close=True)
            return False

        def _body(self) -> Any:
            """The JSON body, or None after answering 4xx (the connection is then closed)."""
            if self.headers.get("Transfer-Encoding"):
                self._send(411, {"error": "send a Content-Length, not a chunked body", "kind": "BadRequest"}, close=True)
                return None
            lengths = self.headers.get_all("Content-Length") or []
            if len(set(lengths)) > 1 or (lengths and not _DIGITS.fullmatch(lengths[0].strip())):
                self._send(400, {"error": "bad Content-Length", "kind": "BadRequest"}, close=True)
                return None
            n = int(lengths[0]) if lengths else 0
            if n > WORKER_MAX_BODY_BYTES:
                self._send(413, {"error": too_large("the body", n, WORKER_MAX_BODY_BYTES),
                                 "kind": "BadRequest"}, close=True)
                return None
            raw = self.rfile.read(n) if n else b""
            if len(raw) < n:
                self.close_connection = True  # the client went away mid-body
                return None
            try:
                return parse_json(raw, what="the request body", max_bytes=WORKER_MAX_BODY_BYTES) if raw else {}
            except MalformedInput as exc:
                self._send(400, {"error": exc.message, "kind": "BadRequest"}, close=True)
                return None

        def _query(self) -> Optional[Dict[str, List[str]]]:
            try:
                query = parse_qs(urlparse(self.path).query, max_num_fields=MAX_QUERY_FIELDS)
            except ValueError:
                query = None
            if query is None or any(len(v) > WORKER_MAX_QUERY_CHARS for vs in query.values() for v in vs):
                self._send(400, {"error": "bad query", "kind": "BadRequest"}, close=True)
                return None
            return query

        def do_GET(self) -> None:
            self._guarded(self._get)

        def do_POST(self) -> None:
            self._guarded(self._post)

        def _guarded(self, method: Any) -> None:
            """Run ``method``; an unexpected error answers 500 (once) instead of a traceback."""
            try:
                method()
            except (OSError, ValueError):
                self.close_connection = True
            except Exception as exc:  # noqa: BLE001 - a bug: answer, count, keep serving
                self.server.errors += 1
                self.close_connection = True
                try:
                    self._send(500, {"error": f"{type(exc).__name__}: {str(exc)[:200]}", "kind": "WorkerError"}, close=True)
                except OSError:
                    pass

        def _get(self) -> None:
            if not self._authorized():
                return
            url = urlparse(self.path)
            query = self._query()
            if query is None:
                return
            try:
                wait = float(query.get("wait", ["0"])[0])
            except ValueError:
                wait = 0.0
            wait = min(MAX_WAIT, max(0.0, wait)) if math.isfinite(wait) else 0.0
            if url.path == "/ping":
                with state.lock:
                    self._send(200, {"ok": True, "pid": os.getpid(), "phase": state.phase})
            elif url.path == "/status":
                since = query.get("since", [""])[0]
                if wait and _VERSION.fullmatch(since):  # long poll: answer at the next change
                    with state.lock:
                        state.lock.wait_for(lambda: state.version != int(since), timeout=wait)
                self._send(200, to_dict(state.status()))
            elif url.path == "/result":
                job = query.get("job", [""])[0]
                with state.lock:
                    if wait:  # long poll: answer as soon as the job is done
                        state.lock.wait_for(lambda: job in state.results or state.job != job
                                            or state.phase != "generating", timeout=wait)
                    outcome = state.results.get(job)
                    running = state.job == job and state.phase == "generating"
                if outcome is not None:
                    self._send(200, outcome)
                elif running:
                    self._send(202, {"pending": True})
                else:
                    self._send(404, {"error": f"no job {job[:40]!r}", "kind": "NotFound"})
            else:
                self._send(404, {"error": f"no endpoint {url.path[:80]}", "kind": "NotFound"})

        def _post(self) -> None:
            if not self._authorized():
                return
            path = urlparse(self.path).path
            body = self._body()
            if body is None:
                return
            if path == "/generate":
                self._generate(body)
            elif path == "/cancel":
                with state.lock:
                    busy = state.phase == "generating"
                self._send(200, {"cancelled": busy, "exiting": busy})
                if busy:  # a running step cannot be aborted: end the process (the supervisor restarts it)
                    exit_soon(EXIT_CANCELLED)
            elif path == "/shutdown":
                with state.lock:
                    state.phase = "stopping"
                    state.changed()
                self._send(200, {"ok": True})
                exit_soon(EXIT_OK)
            else:
                self._send(404, {"error": f"no endpoint {path[:80]}", "kind": "NotFound"})

        def _generate(self, body: Any) -> None:
            try:
                req = from_dict(GenerateRequest, body).validate()
            except Exception as exc:  # noqa: BLE001 - any malformed request is the client's problem
                self._send(400, {"error": str(getattr(exc, "message", exc))[:500], "kind": "GenerationError",
                                 "hint": getattr(exc, "hint", "") or ""})
                return
            with state.lock:
                if state.phase != "ready" or state.backend.sd is None:
                    self._send(409, {"error": f"worker is {state.phase}, not ready", "kind": "Busy"})
                    return
                job = uuid.uuid4().hex[:12]
                state.phase, state.job, state.step, state.steps = "generating", job, 0, req.steps
                state.images_done = 0
                state.changed()
                state.sampling, state.sampling_total = [], 0.0
            threading.Thread(target=state.run_job, args=(job, req), name="job", daemon=True).start()
            self._send(202, {"job": job})

    return Handler


EXIT_PAUSE = 0.01


def exit_soon(code: int) -> None:
    """Exit after the current response has gone out (from a helper thread, right away): the
    handler flushed it to the socket already; the pause lets its thread close the connection."""
    def bye():
        time.sleep(EXIT_PAUSE)
        try:
            sys.stderr.flush()
        finally:
            os._exit(code)

    threading.Thread(target=bye, daemon=True).start()

