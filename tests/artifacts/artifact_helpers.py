"""Helpers for the artifact tests: a real HTTP server on 127.0.0.1 with fault injection and per-request byte counters.

    url = server.serve("/a.bin", data)
    server.fault("/a.bin", drop(at=1000))            # the next request drops at byte 1000
    server.fault("/a.bin", status(500), always=True)  # every request fails
    server.hits("/a.bin")   # [Hit(range_start=None, status=206, sent=1000), ...]
    server.sent("/a.bin")   # body bytes written for that path, all requests together

Faults (one per request, consumed in order; ``always=True`` applies one to every request):
``drop(at)`` close the connection after absolute byte ``at``; ``status(code)`` reply with an
error; ``wrong_bytes()`` serve corrupted bytes of the right length; ``content_length(n)`` announce
``n`` body bytes; ``extra(n)`` no Content-Length and ``n`` bytes too many; ``no_range()`` ignore
Range (200 with everything); ``drip(at, stall)`` send up to ``at`` then stall ``stall`` seconds
(longer than the client's read timeout); ``throttle(chunk, delay)`` send slowly;
``gate(at, event)`` send up to ``at`` and wait for ``event`` before the rest; ``rate(bps)`` a
link throttled to ``bps`` bytes per second (paced to the schedule, as benchmarks/bench_fetch.py does).
``redirect(path, to)`` makes ``path`` a redirect.
"""
from __future__ import annotations

import hashlib
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, Optional
from urllib.parse import urlsplit

from accelstack.artifacts import ArtifactRef


# -- faults ------------------------------------------------------------------------------------
def drop(at: int) -> dict:
    return {"kind": "drop", "at": at}


def status(code: int, retry_after: Optional[str] = None) -> dict:
    return {"kind": "status", "code": code, "retry_after": retry_after}


def wrong_bytes() -> dict:
    return {"kind": "wrong_bytes"}


def content_length(n: int) -> dict:
    return {"kind": "content_length", "n": n}


def extra(n: int) -> dict:
    return {"kind": "extra", "n": n}


def no_range() -> dict:
    return {"kind": "no_range"}


def drip(at: int, stall: float) -> dict:
    return {"kind": "drip", "at": at, "stall": stall}


def throttle(chunk: int, delay: float) -> dict:
    return {"kind": "throttle", "chunk": chunk, "delay": delay}


def rate(bytes_per_second: int) -> dict:
    """A throttled link: the body is paced so that byte ``n`` leaves ``n / bytes_per_second`` s after the first."""
    return {"kind": "rate", "bps": bytes_per_second}


def gate(at: int, event: threading.Event) -> dict:
    """Send up to byte ``at``, then wait until ``event`` is set before sending the rest."""
    return {"kind": "gate", "at": at, "event": event}


@dataclass
class Hit:
    path: str
    range_start: Optional[int]
    status: int = 0
    sent: int = 0
    fault: Optional[str] = None
    target: str = ""  # the request line's target as sent: an absolute URI when this server is a proxy


@dataclass
class FaultServer:
    httpd: ThreadingHTTPServer
    files: Dict[str, bytes] = field(default_factory=dict)
    queued: Dict[str, List[dict]] = field(default_factory=dict)
    always: Dict[str, dict] = field(default_factory=dict)
    redirects: Dict[str, str] = field(default_factory=dict)
    log: List[Hit] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    scheme: str = "http"

    @property
    def base(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"{self.scheme}://{host}:{port}"

    def url(self, path: str) -> str:
        return self.base + path

    def serve(self, path: str, data: bytes) -> str:
        self.files[path] = data
        return self.url(path)

    def fault(self, path: str, *faults: dict, always: bool = False) -> None:
        with self.lock:
            if always:
                assert len(faults) == 1
                self.always[path] = faults[0]
            else:
                self.queued.setdefault(path, []).extend(faults)

    def redirect(self, path: str, to: str) -> str:
        self.redirects[path] = to
        return self.url(path)

    def hits(self, path: str) -> List[Hit]:
        with self.lock:
            return [h for h in self.log if h.path == path]

    def sent(self, path: str) -> int:
        return sum(h.sent for h in self.hits(path))

    def _next_fault(self, path: str) -> Optional[dict]:
        with self.lock:
            queue = self.queued.get(path)
            if queue:
                return queue.pop(0)
            return self.always.get(path)


_RANGE = re.compile(r"^bytes=(\d+)-$")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FaultServer/1"

    def log_message(self, *args) -> None:  # quiet
        pass

    @property
    def fs(self) -> FaultServer:
        return self.server.fault_server  # type: ignore[attr-defined]

    def do_GET(self) -> None:  # noqa: N802
        fs = self.fs
        path = urlsplit(self.path).path
        match = _RANGE.match(self.headers.get("Range", ""))
        hit = Hit(path, int(match.group(1)) if match else None, target=self.path)
        with fs.lock:
            fs.log.append(hit)
        fault = fs._next_fault(path)
        hit.fault = fault["kind"] if fault else None

        if path in fs.redirects:
            hit.status = 302
            self.send_response(302)
            self.send_header("Location", fs.redirects[path])
            self.send_header("Content-Length", "0")
            self.send_header("Connection", "close")
            self.end_headers()
            return
        if fault and fault["kind"] == "status":
            hit.status = fault["code"]
            body = f"fault {fault['code']}\n".encode()
            self.send_response(fault["code"])
            if fault.get("retry_after"):
                self.send_header("Retry-After", fault["retry_after"])
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
            return
        data = fs.files.get(path)
        if data is None:
            hit.status = 404
            self.send_error(404)
            return
        kind = fault["kind"] if fault else None
        if kind == "wrong_bytes":
            data = bytes([data[0] ^ 0xFF]) + data[1:] if data else b"x"
        start = 0
        if match and kind != "no_range":
            start = int(match.group(1))
            if start >= len(data) and len(data) > 0:
                hit.status = 416
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.send_header("Connection", "close")
                self.end_headers()
                return
        body = data[start:]
        hit.status = 206 if match and kind != "no_range" else 200
        self.send_response(hit.status)
        if hit.status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        if kind != "no_range":
            self.send_header("Accept-Ranges", "bytes")
        if kind == "content_length":
            self.send_header("Content-Length", str(fault["n"]))
        elif kind == "extra":
            body = body + b"X" * fault["n"]
        else:
            self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()

        stop_at = len(body)
        chunk, delay = 64 * 1024, 0.0
        if kind in ("drop", "drip", "gate"):
            stop_at = max(0, min(len(body), fault["at"] - start))
        bps = 0
        if kind == "throttle":
            chunk, delay = fault["chunk"], fault["delay"]
        if kind == "rate":
            bps = fault["bps"]
            chunk = max(1, min(64 * 1024, bps // 50))  # ~20 ms of the link per write
        t0 = time.monotonic()
        try:
            pos = 0
            while pos < stop_at:
                piece = body[pos:min(stop_at, pos + chunk)]
                # Counted before the write returns: the client may finish (and the test read the
                # counter) before this thread runs again.
                hit.sent = pos + len(piece)
                self.wfile.write(piece)
                pos += len(piece)
                if delay:
                    time.sleep(delay)
                if bps:
                    ahead = t0 + pos / bps - time.monotonic()
                    if ahead > 0:
                        time.sleep(ahead)
            if kind == "drip":
                fs.stop.wait(fault["stall"])
                return
            if kind == "gate":
                fault["event"].wait(30)
                hit.sent = len(body)
                self.wfile.write(body[stop_at:])
            if kind == "drop":
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass
        self.close_connection = True


# -- helpers -----------------------------------------------------------------------------------
def payload(size: int, seed: int = 0) -> bytes:
    """Deterministic incompressible-ish bytes."""
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(f"{seed}:{counter}".encode()).digest()
        counter += 1
    return bytes(out[:size])


def ref_for(name: str, data: bytes, *urls: str) -> ArtifactRef:
    return ArtifactRef(name=name, sha256=hashlib.sha256(data).hexdigest(), size=len(data), urls=list(urls))



class Events:
    """A progress callback that records events."""

    def __init__(self) -> None:
        self.events = []

    def __call__(self, event) -> None:
        self.events.append(event)

    def of(self, task: str, kind: Optional[str] = None):
        return [e for e in self.events if e.task == task and (kind is None or e.kind == kind)]




class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:  # a refused TLS handshake is expected in tests
        pass


def start_server(tls=None):
    """A running :class:`FaultServer` and a function that stops it; with ``tls`` (a server-side
    ``ssl.SSLContext``) it speaks https."""
    httpd = _QuietServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    if tls is not None:
        httpd.socket = tls.wrap_socket(httpd.socket, server_side=True, do_handshake_on_connect=False)
    fs = FaultServer(httpd, scheme="https" if tls is not None else "http")
    httpd.fault_server = fs  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()

    def stop() -> None:
        fs.stop.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)

    return fs, stop
