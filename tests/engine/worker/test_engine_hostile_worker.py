"""The worker's HTTP server under hostile local clients (issue 10): idle connections, missing
tokens, bad Content-Length, oversized headers, slow clients. Real sockets on 127.0.0.1 against the
real server class, in this process with a backend that loads nothing, and against a real worker
process on the CPU runtime."""
from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from accelstack.engine.errors import ModelLoadError
from accelstack.engine.generation import generate
from accelstack.engine.supervision import workdirs
from accelstack.engine.supervision.client import WorkerClient
from accelstack.engine.supervision.supervisor import Supervisor
from accelstack.engine.worker import server as worker_server
from accelstack.engine.worker.backend import WorkerBackend
from accelstack.engine.worker.main import listen
from accelstack.engine.worker.protocol import GenerateRequest
from accelstack.engine.worker.server import make_server
from accelstack.engine.worker.state import WorkerState
from accelstack.limits import WORKER_MAX_BODY_BYTES, WORKER_MAX_CONNECTIONS, WORKER_MAX_UNAUTHENTICATED

from engine_helpers import CrashOnLoadRuntime

TOKEN = "t0ken-for-tests"
CROWD = 300  # idle connections any local process could open


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setattr(worker_server, "exit_soon", lambda code: None)  # /shutdown must not end pytest
    state = WorkerState(WorkerBackend(io.StringIO()), TOKEN)
    state.phase = "ready"
    srv = make_server(state, listen())
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    srv.port = srv.server_address[1]
    yield srv
    srv.shutdown()
    srv.server_close()


def exchange(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data`` on a fresh connection, then read until the server closes it (or ``timeout``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(data)
        except OSError:
            pass  # the server may answer and close before reading everything
        out = b""
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                out += chunk
                if b"Connection: close" not in out and out.count(b"\r\n\r\n") and _complete(out):
                    break
        except (socket.timeout, ConnectionResetError):
            pass
        return out


def _complete(out: bytes) -> bool:
    head, _, body = out.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def status_of(response: bytes) -> int:
    if response.startswith(b"<!DOCTYPE HTML>"):  # http.server's answer to an HTTP/0.9-looking line: no status line
        return int(response.split(b"Error code: ", 1)[1][:3])
    assert response.startswith(b"HTTP/1."), response[:100]
    return int(response.split(b" ", 2)[1])


def test_a_crowd_of_idle_connections_does_not_lock_out_the_token_holder(server):
    crowd = []
    try:
        for i in range(CROWD):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            if i % 3 == 0:
                sock.sendall(b"GET /ping HTTP/1.1\r\nX-Slow: ")  # half a request, then silence
            crowd.append(sock)
        client = WorkerClient(server.port, TOKEN)
        assert all(client.ping(timeout=5) for _ in range(5))
        with server.guard:
            assert server.open_connections <= WORKER_MAX_CONNECTIONS
            assert len(server.waiting) <= WORKER_MAX_UNAUTHENTICATED
        assert server.dropped >= CROWD - WORKER_MAX_UNAUTHENTICATED
    finally:
        for sock in crowd:
            sock.close()
    assert server.errors == 0


def test_requests_without_the_token_are_answered_401_and_their_body_never_read(server):
    # A body of a terabyte is announced and never sent: the answer must not wait for it.
    response = exchange(server.port, b"POST /generate HTTP/1.1\r\nContent-Length: 1000000000000\r\n\r\n")
    assert status_of(response) == 401 and b"Connection: close" in response
    response = exchange(server.port, b"GET /status HTTP/1.1\r\nAuthorization: Bearer wrong\r\n\r\n")
    assert status_of(response) == 401 and json.loads(response.partition(b"\r\n\r\n")[2])["kind"] == "Unauthorized"


@pytest.mark.parametrize("length, code", [
    ("-1", 400), ("-5", 400), ("abc", 400), ("1e3", 400), ("0x10", 400), (" 12 ", 400), (str(WORKER_MAX_BODY_BYTES + 1), 413),
    ("99999999999999999999999999", 400),
])
def test_content_length_is_checked_before_reading(server, length, code):
    head = f"POST /generate HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {length}\r\n\r\n".encode()
    if length == " 12 ":  # the header parser strips the spaces: 12 bytes are read, and are not JSON
        head += b"{not json!!}"
    response = exchange(server.port, head)  # no body follows: a server that trusted the length would wait
    assert status_of(response) == code, response[:200]
    assert server.errors == 0


def test_other_malformed_requests(server):
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
    cases = [
        (b"POST /generate HTTP/1.1\r\n" + auth + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 411),
        (b"POST /generate HTTP/1.1\r\n" + auth + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400),
        (b"POST /generate HTTP/1.1\r\n" + auth + b"Content-Length: 12\r\n\r\n" + b"[" * 12, 400),
        (b"POST /generate HTTP/1.1\r\n" + auth + b"Content-Length: 2\r\n\r\n{}", 400),  # no prompt
        (b"GET /status?wait=nan&since=" + b"9" * 200 + b" HTTP/1.1\r\n" + auth + b"\r\n", 200),
        (b"GET /status?" + b"&".join(b"a=%d" % i for i in range(50)) + b" HTTP/1.1\r\n" + auth + b"\r\n", 400),
        (b"GET /result?job=" + b"x" * 300 + b" HTTP/1.1\r\n" + auth + b"\r\n", 400),
        # int() of 5000 digits raised ValueError inside the old handler: a traceback per request
        (b"GET /status?wait=1&since=" + b"9" * 5000 + b" HTTP/1.1\r\n" + auth + b"\r\n", 400),
        (b"GET  HTTP/1.1\r\n" + auth + b"\r\n", None),  # HTTP/0.9 (no status line to answer with): dropped
        (b"GET /status HTTP/1.1\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 1000) for i in range(100)) + auth + b"\r\n", 401),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256)), 400),  # a TLS hello
    ]
    for data, code in cases:
        response = exchange(server.port, data)
        assert (status_of(response) if code is not None else response) == (code if code is not None else b""), data[:80]
    assert WorkerClient(server.port, TOKEN).ping(timeout=5) and server.errors == 0


def test_a_silent_connection_is_closed_after_the_socket_timeout(server, monkeypatch):
    monkeypatch.setattr(server.RequestHandlerClass, "timeout", 0.3)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"GET /ping HTTP/1.1\r\n")
        assert sock.recv(100) == b""  # closed by the server (the client's own timeout is 10 s)
    deadline = time.monotonic() + 10
    while server.open_connections and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.open_connections == 0


def test_a_real_worker_keeps_serving_its_supervisor(cpu_runtime):
    """The real worker process (runtime imported, no model): a crowd and hostile requests, then the
    supervisor's own requests still work."""
    with Supervisor(cpu_runtime) as sup:
        port = sup.client.port
        crowd = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(CROWD)]
        try:
            assert sup.ping(timeout=5)
            assert status_of(exchange(port, b"POST /shutdown HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n")) == 401
            head = f"POST /generate HTTP/1.1\r\nAuthorization: Bearer {sup.client.token}\r\nContent-Length: -1\r\n\r\n"
            assert status_of(exchange(port, head.encode())) == 400
            assert sup.status().phase == "ready" and sup.alive()
        finally:
            for sock in crowd:
                sock.close()


# -- crashed workers keep their log; abandoned folders are cleaned up --------------------------------------
def _gguf_claiming_2_62_tensors(path):
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2 ** 62, 0) + b"\0" * 64)
    return path


def test_a_load_that_crashes_at_once_is_blamed_on_the_model(cpu_runtime, tmp_path):
    """The worker listens (its ready file names the port) before it loads anything, so a load that
    kills it at once is a ModelLoadError naming the model, not a start failure of the runtime."""
    model = tmp_path / "damaged.safetensors"
    model.write_bytes(b"\0" * 64)
    sup = Supervisor(CrashOnLoadRuntime(cpu_runtime.path, cpu_runtime.backend), model=str(model))
    with pytest.raises(ModelLoadError) as err:
        sup.start()
    assert not sup.alive()
    assert "crashed while loading" in err.value.message and str(model) in err.value.message
    assert "SIGSEGV" in err.value.message


def test_a_crashed_worker_keeps_the_log_its_message_names(cpu_runtime, tmp_path):
    """A worker that dies of SIGSEGV while loading (as stable-diffusion.cpp does on some corrupt
    files; sent here by hand, so it happens every time): the message names the log, and the log is
    still there after the supervisor stopped.

    The signal goes at a known point, not after a fixed sleep (0.3 s after the spawn once arrived
    before the worker listened, a start failure instead): the worker is prestarted for a model file
    that never appears, so it stays in its loading phase, and the signal is sent from the
    supervisor's own progress callback when it reports that phase (the worker listens and loads)."""
    sent = []

    def segfault_while_loading(event):
        if event.kind == "advance" and event.task.startswith("loading") and not sent:
            sent.append(sup.pid)
            os.kill(sup.pid, signal.SIGSEGV)

    sup = Supervisor(cpu_runtime, model=str(tmp_path / "appears-never.safetensors"), progress=segfault_while_loading)
    sup.prestart(model_appears=600)
    with pytest.raises(ModelLoadError) as err:
        sup.start()
    assert not sup.alive() and sent
    assert "crashed while loading" in err.value.message and "SIGSEGV" in err.value.message
    log_path = Path(err.value.hint.split("kept at ", 1)[1].split()[0])
    assert log_path.is_file()
    marker = json.loads((log_path.parent / workdirs.MARKER).read_text())
    assert marker["crashed"] is True and marker["pid"] == os.getpid()
    assert log_path.parent not in workdirs.clean_stale(log_path.parent.parent)  # kept: its maker runs
    shutil.rmtree(log_path.parent)


def test_generate_refuses_that_file_before_any_worker(cpu_runtime, tmp_path):
    model = _gguf_claiming_2_62_tensors(tmp_path / "bad.gguf")
    before = set(Path(tempfile.gettempdir()).glob("accelstack-worker-*"))
    with pytest.raises(ModelLoadError, match="claims 4611686018427387904 tensors"):
        generate(cpu_runtime, model, GenerateRequest(prompt="x", width=64, height=64, steps=1), tmp_path / "o.png")
    assert set(Path(tempfile.gettempdir()).glob("accelstack-worker-*")) == before


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_abandoned_worker_folders_are_removed_and_nothing_else(tmp_path):
    now = time.time()
    old = now - workdirs.WORKER_DIR_STALE_SECONDS - 60

    def folder(name, marker=None, mtime=old):
        d = tmp_path / name
        d.mkdir()
        (d / "worker-1.log").write_text("log")
        if marker is not None:
            (d / workdirs.MARKER).write_text(marker if isinstance(marker, str) else json.dumps(marker))
            os.utime(d / workdirs.MARKER, (mtime, mtime))
        return d

    dead = _dead_pid()
    gone = [folder("accelstack-worker-dead", {"pid": dead, "started": 1.0, "crashed": False}),
            folder("accelstack-worker-oldcrash", {"pid": dead, "started": 1.0, "crashed": True},
                   mtime=now - workdirs.CRASH_LOG_KEEP_SECONDS - 60)]
    kept = [folder("accelstack-worker-alive", {"pid": os.getpid(), "started": workdirs._started(os.getpid())}),
            folder("accelstack-worker-recent", {"pid": dead, "started": 1.0}, mtime=now),
            folder("accelstack-worker-crash", {"pid": dead, "started": 1.0, "crashed": True}),
            folder("accelstack-worker-unmarked"),
            folder("accelstack-worker-badmarker", "{not json"),
            folder("accelstack-worker-strpid", {"pid": "1"}),
            folder("someone-elses", {"pid": dead, "started": 1.0})]
    (tmp_path / "accelstack-worker-link").symlink_to(gone[0])
    kept.append(tmp_path / "accelstack-worker-link")
    removed = workdirs.clean_stale(tmp_path, now=now)
    assert sorted(removed) == sorted(gone)
    assert all(os.path.lexists(k) for k in kept) and not any(g.exists() for g in gone)


def test_a_stamp_that_cannot_be_written_does_not_fail_the_launch(tmp_path):
    """The start time is added after the worker's spawn: a folder gone or full by then only leaves
    the marker without it (kept while the pid lives), it is no reason to abandon a running worker."""
    folder = workdirs.make(tmp_path, stamped=False)
    shutil.rmtree(folder)
    workdirs.stamp(folder)
    assert not folder.exists()


@pytest.mark.parametrize("stamped", [True, False])  # False: killed between the folder and the worker's spawn
def test_a_killed_process_leaves_a_folder_that_the_next_start_removes(tmp_path, stamped):
    code = ("import sys, time; from accelstack.engine.supervision import workdirs; "
            "print(workdirs.make(sys.argv[1], stamped=sys.argv[2] == 'True'), flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path), str(stamped)], stdout=subprocess.PIPE, text=True)
    made = Path(proc.stdout.readline().strip())
    assert workdirs.clean_stale(tmp_path, now=time.time() + 3600) == []  # its maker still runs
    proc.kill()
    proc.wait()
    proc.stdout.close()
    assert workdirs.clean_stale(tmp_path) == []  # dead, but not stale yet
    assert workdirs.clean_stale(tmp_path, now=time.time() + workdirs.WORKER_DIR_STALE_SECONDS + 60) == [made]


@pytest.mark.parametrize("answer", [b"garbage\r\n\r\n", b"HTTP/1.1 abc OK\r\n\r\n", b""])
def test_a_port_that_answers_no_http_is_a_transport_error_for_the_client(answer):
    """Something else on the worker's port (or a worker that died mid-answer): the client's calls give
    their "no answer" values and the supervisor's transport errors, never http.client's own exceptions."""
    from accelstack.engine.supervision.client import TRANSPORT_ERRORS, ProtocolError

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve():
        for _ in range(2):
            conn, _addr = listener.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(answer)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        client = WorkerClient(port, TOKEN)
        assert client.status(timeout=5) is None
        with pytest.raises(TRANSPORT_ERRORS) as err:
            client.request("GET", "/ping", timeout=5)
        assert isinstance(err.value, ProtocolError)
    finally:
        t.join(10)
        listener.close()
