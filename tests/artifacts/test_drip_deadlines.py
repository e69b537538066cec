"""Issue 29: a server that drips bytes (one every 0.2 s here; 10 s in the report) never trips the
read timeout, so every document and artifact fetch has an overall deadline from its size (its cap,
or what the server announces) and a minimum rate. Past it the fetch fails with a typed
:class:`SlowTransferError` that says what arrived and how fast it had to, and a download moves on
to the next mirror, keeping what arrived. Real loopback servers throughout; every test bounds how
long the call may run and asserts the reason, never a fixed sleep.
"""
from __future__ import annotations

import threading
import time

import pytest

from accelstack.artifacts import (
    Cache,
    FetchError,
    RetryPolicy,
    SlowTransferError,
    Transport,
    fetch,
    fetch_document,
)
from accelstack.errors import UsageError
from accelstack.settings import Settings, Timeouts

from artifact_helpers import Events, payload, rate, ref_for, throttle
from cli_helpers import error_of, run_cli

DRIP = throttle(1, 0.2)  # one byte every 0.2 s: far below any minimum, far above any read timeout


def _within(seconds: float, fn):
    """``fn()``'s result or exception, failing the test if it is still running after ``seconds``."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    t0 = time.monotonic()
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still running after {seconds:.0f} s: no overall deadline"
    return box, time.monotonic() - t0


def _slow_document(url: str):
    """Fetch ``url`` with a 4 KiB/s minimum and a 1 s document deadline, bounded by the test: the
    typed error it must end in, and how long it took."""
    transport = Transport(connect_timeout=1.0, read_timeout=5.0, min_rate=4096, document_timeout=1.0)
    try:
        box, took = _within(60, lambda: fetch_document(url, transport=transport))
    finally:
        transport.close()
    exc = box.get("error")
    assert isinstance(exc, SlowTransferError), box
    return exc, took


def test_a_dripping_document_is_given_up_at_its_deadline_and_says_why(server):
    url = server.serve("/ggml-manifest.json", b"{" + b" " * 4000 + b"}")
    server.fault("/ggml-manifest.json", DRIP, always=True)
    exc, took = _slow_document(url)
    assert isinstance(exc, FetchError) and not exc.transient  # the next mirror, not the same one again
    assert url in exc.message and "slower than the 4 KiB/s minimum" in exc.message, exc.message
    assert "try another mirror" in exc.message and "ACCELSTACK_MIN_RATE" in exc.hint, exc.hint
    assert 0 < exc.received < 4002 and exc.min_rate == 4096
    assert took < 20, took  # deadline 2 s: connect allowance + at most the document timeout


def test_a_dripping_mirror_gives_way_to_the_next_one_which_resumes(server, tmp_path, retry):
    data = payload(64 * 1024)
    slow = server.serve("/slow/blob.bin", data)
    good = server.serve("/good/blob.bin", data)
    server.fault("/slow/blob.bin", DRIP, always=True)
    ref = ref_for("blob.bin", data, slow, good)
    events = Events()
    transport = Transport(connect_timeout=1.0, read_timeout=5.0, min_rate=64 * 1024)
    try:
        box, took = _within(60, lambda: fetch([ref], cache=Cache(tmp_path / "c"), offline=False, transport=transport,
                                              retry=retry, progress=events))
    finally:
        transport.close()
    assert "error" not in box, box.get("error")
    assert box["value"][ref.sha256].read_bytes() == data
    messages = [e.message for e in events.of("blob.bin", "message")]
    assert any("slower than the 64 KiB/s minimum" in m and "trying the next mirror" in m for m in messages), messages
    assert len(server.hits("/slow/blob.bin")) == 1  # given up, not retried: it would only drip again
    resumed = server.hits("/good/blob.bin")[0].range_start  # what the slow mirror sent was kept
    assert resumed is not None and 0 < resumed <= server.sent("/slow/blob.bin"), resumed
    assert took < 30, took


def test_a_dripping_only_mirror_fails_typed_and_keeps_what_arrived(server, tmp_path, retry):
    data = payload(32 * 1024, seed=3)
    url = server.serve("/only/blob.bin", data)
    server.fault("/only/blob.bin", DRIP, always=True)
    ref = ref_for("blob.bin", data, url)
    cache = Cache(tmp_path / "c")
    transport = Transport(connect_timeout=1.0, read_timeout=5.0, min_rate=32 * 1024)
    try:
        box, took = _within(60, lambda: fetch([ref], cache=cache, offline=False, transport=transport, retry=retry))
    finally:
        transport.close()
    exc = box.get("error")
    assert isinstance(exc, SlowTransferError), box
    assert "slower than the 32 KiB/s minimum" in exc.message and url in exc.message, exc.message
    assert not cache.blob_path(ref.sha256).exists()
    assert cache.part_size(ref.sha256) == exc.received > 0  # the next run resumes from there
    assert took < 30, took


def test_a_steady_transfer_above_the_minimum_is_not_cut(server, tmp_path, retry):
    data = payload(300_000, seed=5)
    url = server.serve("/steady.bin", data)
    server.fault("/steady.bin", rate(400_000), always=True)  # ~0.75 s at 6x the minimum
    ref = ref_for("steady.bin", data, url)
    transport = Transport(connect_timeout=1.0, read_timeout=5.0, min_rate=64 * 1024)
    try:
        box, _ = _within(60, lambda: fetch([ref], cache=Cache(tmp_path / "c"), offline=False, transport=transport,
                                           retry=RetryPolicy(retries=0)))
    finally:
        transport.close()
    assert "error" not in box, box.get("error")
    assert box["value"][ref.sha256].read_bytes() == data


def test_a_small_announced_body_gets_a_small_deadline():
    t = Transport(connect_timeout=2.0, min_rate=1024, document_timeout=60.0)
    assert t.deadline_for(8 << 20, document=True) == 62.0  # the cap: the document timeout bounds it
    assert t.deadline_for(2048, document=True) == 4.0  # what the server announced
    assert t.deadline_for(10 << 20) == 2.0 + 10 * 1024  # an artifact: its size at the minimum rate
    assert Transport(min_rate=0).deadline_for(1 << 30) is None  # 0 turns the deadline off


def test_the_minimum_rate_comes_from_settings_and_the_environment(tmp_path):
    env = {"ACCELSTACK_HOME": str(tmp_path / "h"), "ACCELSTACK_CACHE": str(tmp_path / "c")}
    assert Settings.resolve(env=env).timeouts.min_rate == 64 * 1024
    assert Settings.resolve(env={**env, "ACCELSTACK_MIN_RATE": "8192"}).timeouts.min_rate == 8192
    mine = Timeouts(min_rate=1000.0)
    assert Settings.resolve(env={**env, "ACCELSTACK_MIN_RATE": "8192"}, timeouts=mine).timeouts.min_rate == 1000.0
    with pytest.raises(UsageError, match="ACCELSTACK_MIN_RATE must be a number of bytes per second"):
        Settings.resolve(env={**env, "ACCELSTACK_MIN_RATE": "fast"})
    t = Transport.from_timeouts(Timeouts(connect=3.0, read=4.0, min_rate=5.0, document=6.0))
    assert (t.connect_timeout, t.read_timeout, t.min_rate, t.document_timeout) == (3.0, 4.0, 5.0, 6.0)


def test_install_dry_run_with_a_dripping_manifest_ends_and_says_why(server, tmp_path):
    url = server.serve("/ggml-manifest.json", b"{" + b" " * 20000 + b"}")
    server.fault("/ggml-manifest.json", DRIP, always=True)
    env = {"ACCELSTACK_HOME": str(tmp_path / "home"), "ACCELSTACK_CACHE": str(tmp_path / "cache"),
           "ACCELSTACK_MIN_RATE": str(8 << 20), "NO_PROXY": "127.0.0.1,localhost"}
    t0 = time.monotonic()
    rc, out, err = run_cli(["install", "--dry-run", "--json", "--no-build", "--manifest", url], env, timeout=150)
    took = time.monotonic() - t0
    assert rc != 0, out
    error = error_of(out)
    assert "slower than the 8 MiB/s minimum" in error["message"] and url in error["message"], error
    assert took < 90, took  # the deadline: the connect allowance (15 s) + 1 s for an 8 MiB cap at 8 MiB/s


@pytest.fixture
def header_drip():
    """A loopback server that answers every request by dripping its status line and headers, one
    byte every 0.2 s, without end (as a captive portal or a hostile mirror can)."""
    import socket

    stop = threading.Event()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)

    def drip(conn) -> None:
        with conn:
            conn.recv(65536)
            text = b"HTTP/1.1 200 OK\r\n" + b"X-Padding: " + b"a" * 100000
            for byte in text:
                if stop.wait(0.2):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            threading.Thread(target=drip, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/ggml-manifest.json"
    stop.set()
    listener.close()


def test_a_server_that_drips_its_headers_is_given_up_at_the_deadline(header_drip):
    exc, took = _slow_document(header_drip)
    assert "did not send its reply's headers" in exc.message and "try another mirror" in exc.message, exc.message
    assert took < 20, took  # the deadline is 2 s; each byte came well inside the 5 s read timeout
