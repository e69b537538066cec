"""The worker's HTTP API (see :mod:`accelstack.engine.worker` for the endpoints).

Every request must carry the per-launch token; long polls wait on the state's condition
variable. ``/cancel`` during a job and ``/shutdown`` end the process right after answering.
"""
from __future__ import annotations

import hmac
import json
import os
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler
from typing import Any, Type
from urllib.parse import parse_qs, urlparse

from ..serde import from_dict, to_dict
from .protocol import EXIT_CANCELLED, EXIT_OK, GenerateRequest
from .worker_state import WorkerState

MAX_WAIT = 30.0  # longest a long-polling request may wait


def make_handler(state: WorkerState) -> Type[BaseHTTPRequestHandler]:
    """The request handler class bound to ``state``."""
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # quiet: the supervisor keeps the log for errors
            pass

        def _send(self, code: int, payload: Any) -> None:
            body = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()

        def _authorized(self) -> bool:
            given = self.headers.get("Authorization", "")
            if hmac.compare_digest(given.encode(), f"Bearer {state.token}".encode()):
                return True
            self._send(403, {"error": "bad or missing token", "kind": "Forbidden"})
            return False

        def _body(self) -> Any:
            n = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(n) or b"{}") if n else {}

        def do_GET(self) -> None:
            if not self._authorized():
                return
            url = urlparse(self.path)
            if url.path in ("/ping", "/status") and state.status_delay and state.phase == "generating":
                time.sleep(state.status_delay)
            query = parse_qs(url.query)
            try:
                wait = min(MAX_WAIT, max(0.0, float(query.get("wait", ["0"])[0])))
            except ValueError:
                wait = 0.0
            if url.path == "/ping":
                with state.lock:
                    self._send(200, {"ok": True, "pid": os.getpid(), "phase": state.phase})
            elif url.path == "/status":
                since = query.get("since", [""])[0]
                if wait and since.lstrip("-").isdigit():  # long poll: answer at the next change
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
                    self._send(404, {"error": f"no job {job!r}", "kind": "NotFound"})
            else:
                self._send(404, {"error": f"no endpoint {url.path}", "kind": "NotFound"})

        def do_POST(self) -> None:
            if not self._authorized():
                return
            path = urlparse(self.path).path
            try:
                body = self._body()
            except ValueError:
                self._send(400, {"error": "the request body is not JSON", "kind": "BadRequest"})
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
                self._send(404, {"error": f"no endpoint {path}", "kind": "NotFound"})

        def _generate(self, body: Any) -> None:
            try:
                req = from_dict(GenerateRequest, body).validate()
            except Exception as exc:
                self._send(400, {"error": getattr(exc, "message", str(exc)), "kind": "GenerationError",
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


def exit_soon(code: int) -> None:
    """Exit after the current response has gone out (from a helper thread, right away)."""
    def bye():
        time.sleep(0.05)
        try:
            sys.stderr.flush()
        finally:
            os._exit(code)

    threading.Thread(target=bye, daemon=True).start()

