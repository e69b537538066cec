"""Issue 29: `accelstack serve` cannot be starved without the token. Connections that never finish
a request are closed after a deadline (which the bytes they drip do not renew), the service holds
at most a bounded number of connections (room is made by closing the one that waited longest),
and the token holder is answered while an attacker holds idle and dripping connections, with the
common limit of 1,024 file descriptors on the service."""
from __future__ import annotations

import resource
import selectors
import socket
import threading
import time
from typing import Dict, List

import psutil
import requests

from accelstack.service.connections import MAX_CONNECTIONS, REQUEST_TIMEOUT, RESERVED_FDS

from service_helpers import Service

API = "/api/v1"
FD_LIMIT = 1024
ATTACKERS = 1100
DRIPPING = 100
DRIP = b"GET /api/v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "  # then one byte at a time, for ever


def _common_fd_limit() -> None:
    """In the service's child: the usual soft limit of descriptors (1,024)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(FD_LIMIT, hard), hard))


class Attacker(threading.Thread):
    """Holds ``count`` connections to the service without the token: most send nothing, ``dripping``
    of them send a request one byte every 50 ms; each one the service closes is opened again."""

    def __init__(self, port: int, count: int, dripping: int) -> None:
        super().__init__(daemon=True)
        self.port, self.count, self.dripping = port, count, dripping
        self.sel = selectors.DefaultSelector()
        self.sent: Dict[socket.socket, int] = {}  # a dripping socket -> bytes of its request sent
        self.closed_by_service = 0
        self.full = threading.Event()
        self.halt = threading.Event()

    def _open(self, drip: bool) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", self.port))
        self.sel.register(s, selectors.EVENT_READ, drip)
        if drip:
            self.sent[s] = 0

    def run(self) -> None:
        for i in range(self.count):
            self._open(i < self.dripping)
        self.full.set()
        next_drip = time.monotonic()
        while not self.halt.is_set():
            for key, _ in self.sel.select(0.05):
                s: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    data = s.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data:
                    continue  # a 408 or 503: the close follows
                self.sel.unregister(s)
                self.sent.pop(s, None)
                s.close()
                self.closed_by_service += 1
                self._open(key.data)
            if time.monotonic() >= next_drip:
                next_drip = time.monotonic() + 0.05
                for s, n in list(self.sent.items()):
                    try:
                        s.send(DRIP[n:n + 1] if n < len(DRIP) else b"a")
                        self.sent[s] = n + 1
                    except OSError:
                        pass  # not connected yet, or closed: the select above sees it
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self.sel.close()

    def stop(self) -> None:
        self.halt.set()
        self.join(60)


def _wait_until(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def test_idle_and_dripping_connections_do_not_starve_the_token_holder(tmp_path):
    svc = Service(tmp_path / "home", tmp_path / "cache", preexec_fn=_common_fd_limit)
    attacker = Attacker(svc.port, ATTACKERS, DRIPPING)
    try:
        attacker.start()
        assert attacker.full.wait(60)
        # the service holds a bounded number: of 1,100 connections, the ones past its budget are closed
        _wait_until(lambda: attacker.closed_by_service >= ATTACKERS - MAX_CONNECTIONS, 60,
                    "the service closed the connections past its bound")
        fds = psutil.Process(svc.proc.pid).num_fds()  # those it holds, and a batch just accepted
        assert fds <= 2 * MAX_CONNECTIONS + RESERVED_FDS, f"the service holds {fds} descriptors under the attack"
        times: List[float] = []
        for _ in range(10):
            start = time.monotonic()
            r = requests.get(f"{svc.url}{API}/jobs", headers=svc.headers(), timeout=5)
            times.append(time.monotonic() - start)
            assert r.status_code == 200, r.text
        start = time.monotonic()
        job = svc.post_job("verify")  # no runtime here: it is accepted, then fails
        times.append(time.monotonic() - start)
        assert job.status_code == 202, job.text
        # every request answered, and all but one within 1 s: the attacker's threads share this test
        # process, so one answer can wait for this process, not the service (a full CI run saw 1.29 s once)
        assert sorted(times)[-2] < 1.0 and max(times) < 3.0, f"the token holder waited {max(times):.2f} s for an answer: {times}"
        assert svc.proc.poll() is None
    finally:
        attacker.stop()
        assert svc.stop() == 0
    log = svc.stderr_path.read_text()
    assert "Traceback" not in log and "Too many open files" not in log and "out of system resource" not in log, log


def _read_until_closed(s: socket.socket, timeout: float) -> bytes:
    """What the service sends before it closes ``s``; fails if it is still open after ``timeout`` s."""
    s.settimeout(timeout)
    got = b""
    while True:
        try:
            data = s.recv(65536)
        except socket.timeout:
            raise AssertionError(f"the service kept an incomplete request open for {timeout} s (got {got!r})") from None
        except ConnectionResetError:
            return got
        if not data:
            return got
        got += data


def test_incomplete_requests_are_closed_after_the_deadline(start_service):
    svc = start_service()
    idle = socket.create_connection(("127.0.0.1", svc.port))
    partial = socket.create_connection(("127.0.0.1", svc.port))
    partial.sendall(DRIP)
    body = socket.create_connection(("127.0.0.1", svc.port))  # the token, and a body that never ends
    doc = b'{"kind": "verify"}'
    body.sendall(b"POST /api/v1/jobs HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAuthorization: Bearer %s\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (svc.port, svc.token.encode(), len(doc) + 64, doc))
    dripping = socket.create_connection(("127.0.0.1", svc.port))
    dripping.sendall(DRIP)
    stop = threading.Event()

    def drip() -> None:  # a byte every 0.2 s: bytes that arrive do not renew the deadline
        while not stop.wait(0.2):
            try:
                dripping.send(b"a")
            except OSError:
                return

    dripper = threading.Thread(target=drip, daemon=True)
    dripper.start()
    bound = REQUEST_TIMEOUT + 20
    try:
        assert _read_until_closed(idle, bound) == b""
        assert _read_until_closed(partial, bound).startswith(b"HTTP/1.1 408 ")
        assert _read_until_closed(dripping, bound).startswith(b"HTTP/1.1 408 ")
        assert _read_until_closed(body, bound).startswith(b"HTTP/1.1 408 "), "part of a request came: its body"
    finally:
        stop.set()
        dripper.join(5)
        for s in (idle, partial, body, dripping):
            s.close()
    # the truncated body (a valid JSON document so far) never reached a route: no job was started
    assert svc.get(f"{API}/jobs").json()["jobs"] == []
