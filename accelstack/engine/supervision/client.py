"""The connection to a worker: its small HTTP API on 127.0.0.1, with the per-launch token.

Every call has a timeout; transport failures (refused, reset, late) come back as ``None`` /
``False`` where the supervisor treats them as evidence rather than verdicts, so a busy worker
that answers late is not mistaken for a dead one. See :mod:`accelstack.engine.worker.main` for the API.
"""
from __future__ import annotations

import json
import time
from typing import Any, Dict, Optional, Tuple

from ...serde import from_dict, to_dict
from ..errors import GenerationError
from ..worker.protocol import GenerateRequest, WorkerStatus

__all__ = ["WorkerClient", "TRANSPORT_ERRORS", "ProtocolError"]


class ProtocolError(OSError):
    """An answer that is not HTTP (http.client's HTTPException, as a transport error)."""


TRANSPORT_ERRORS = (OSError, ValueError)


class WorkerClient:
    """Requests to one launch of the worker (``port``, ``token``)."""

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.token = token

    def request(self, method: str, path: str, body: Optional[Dict[str, Any]] = None,
                timeout: float = 10.0) -> Tuple[int, Any]:
        """One request; raises the transport's errors (see ``TRANSPORT_ERRORS``)."""
        import http.client  # on the first request: the worker is started before it (the CLI's start, ~8 ms)

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = json.dumps(body).encode() if body is not None else None
            headers = {"Authorization": f"Bearer {self.token}"}
            if data is not None:
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw else {})
        except http.client.HTTPException as exc:
            raise ProtocolError(f"{type(exc).__name__}: {exc}") from exc
        finally:
            conn.close()

    def status(self, timeout: float, wait: float = 0.0, since: Optional[int] = None) -> Optional[WorkerStatus]:
        """The worker's status, or None without an answer in time; with ``wait`` and ``since``, a
        long poll that answers as soon as the state's version differs from ``since``."""
        path = f"/status?wait={wait}&since={since}" if wait and since is not None else "/status"
        try:
            code, data = self.request("GET", path, timeout=timeout + wait)
        except TRANSPORT_ERRORS:
            return None
        return from_dict(WorkerStatus, data) if code == 200 else None

    def ping(self, timeout: float) -> bool:
        try:
            code, _ = self.request("GET", "/ping", timeout=timeout)
            return code == 200
        except TRANSPORT_ERRORS:
            return False

    def cancel(self, timeout: float) -> bool:
        """Ask the worker to stop its job; True if it was generating."""
        try:
            code, data = self.request("POST", "/cancel", {}, timeout=timeout)
            return code == 200 and bool(data.get("cancelled"))
        except TRANSPORT_ERRORS:
            return False

    def shutdown(self, timeout: float = 1.0) -> bool:
        """Ask the worker to exit; True when it answered (it then exits right away)."""
        try:
            return self.request("POST", "/shutdown", {}, timeout=timeout)[0] == 200
        except TRANSPORT_ERRORS:
            return False

    def submit(self, request: GenerateRequest, timeout: float) -> str:
        """Start a job; return its id. Transport errors propagate (the worker may be gone)."""
        code, data = self.request("POST", "/generate", to_dict(request), timeout=timeout)
        if code == 400:
            raise GenerationError(data.get("error", "bad request"), hint=data.get("hint") or None)
        if code != 202:
            raise GenerationError(f"the worker refused the job: {data.get('error', code)}")
        return str(data["job"])

    def result(self, job: str, wait: float, timeout: float) -> Optional[Dict[str, Any]]:
        """The job's outcome (``{"result"}`` or ``{"error"}``), or None while it runs; with
        ``wait``, a long poll that answers as soon as the job ends."""
        try:
            code, data = self.request("GET", f"/result?job={job}&wait={wait}", timeout=wait + timeout)
        except TRANSPORT_ERRORS:
            time.sleep(0.05)  # a worker that refuses connections is about to show up as dead
            return None
        if code == 200:
            return dict(data)
        if code == 404:
            raise GenerationError(f"the worker lost job {job}")
        return None
