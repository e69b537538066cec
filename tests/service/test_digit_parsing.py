"""Issue 29: ``str.isdigit()`` accepts "²" (and other digits ``int()`` refuses or that are not
ASCII): the service answered 500 "this is a bug in accelstack" for ``?index=²`` and
``Last-Event-ID: ²``. A bad index is a 400, a bad Last-Event-ID is ignored (the stream starts
over), a bad Content-Length is a 400; and every other place that checked ``isdigit()`` before
``int()`` (hardware probes, manifest matching) now takes ASCII digits only."""
from __future__ import annotations

import socket
from urllib.parse import quote

import pytest

from accelstack.hardware.assess import _vkey
from accelstack.hardware.common import parse_smi_csv
from accelstack.hardware.report import GPU
from accelstack.hardware.tables import _cc_key
from accelstack.hardware.windows import nvidia_driver_from_windows
from accelstack.manifests.hw_rules import driver_hint
from accelstack.manifests.machine import l4t_of

from service_helpers import Service

API = "/api/v1"
ODD_DIGITS = ["²", "1²", "٣", "１", "𝟗", "⁴²", "Ⅻ", "½"]  # superscripts, Arabic-Indic, full-width, math, numerals


def _header_bytes(value: str) -> bytes:
    """A header value as a client sends it: Latin-1 where it can be ("²" is the byte 0xB2, what
    ``requests`` sends), else UTF-8 (which the server reads as Latin-1)."""
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return value.encode("utf-8")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A service and a job that has ended (a verify on an empty home fails at once)."""
    root = tmp_path_factory.mktemp("digits")
    svc = Service(root / "home", root / "cache")
    try:
        job = svc.start_job("verify")
        progress, event, _ = svc.follow(job["id"])
        yield svc, job["id"], progress, event
    finally:
        svc.stop()


@pytest.mark.parametrize("index", ODD_DIGITS + ["-1", "1e3", "", " 1", "99999"])
def test_a_bad_image_index_is_a_400(finished, index):
    svc, job_id, _, _ = finished
    r = svc.get(f"{API}/jobs/{job_id}/image?index={quote(index)}")
    assert r.status_code == 400, (index, r.status_code, r.text)
    err = r.json()["error"]
    assert err["code"] == "bad-request" and "index" in err["message"] and err["action"] != "report-bug", err


@pytest.mark.parametrize("last", ODD_DIGITS + ["-1", "x", "1" * 20])
def test_a_bad_last_event_id_is_ignored(finished, last):
    svc, job_id, progress, final = finished
    with socket.create_connection(("127.0.0.1", svc.port), timeout=60) as s:
        s.sendall(f"GET {API}/jobs/{job_id}/events HTTP/1.1\r\nHost: 127.0.0.1:{svc.port}\r\n"
                  f"Authorization: Bearer {svc.token}\r\n".encode() + b"Last-Event-ID: " + _header_bytes(last) +
                  b"\r\nConnection: close\r\n\r\n")
        got = b""
        while True:
            data = s.recv(65536)
            if not data:
                break
            got += data
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), got[:300]
    assert b"id: 0\n" in body and f"event: {final}\n".encode() in body, body[:300]  # from the first event
    assert body.count(b"event: progress") == len(progress)


@pytest.mark.parametrize("length", ["²", "٣", "１"])
def test_a_non_ascii_content_length_is_a_400(finished, length):
    svc, _, _, _ = finished
    with socket.create_connection(("127.0.0.1", svc.port), timeout=60) as s:
        s.sendall(f"POST {API}/jobs HTTP/1.1\r\nHost: 127.0.0.1:{svc.port}\r\nAuthorization: Bearer {svc.token}\r\n"
                  .encode() + b"Content-Length: " + _header_bytes(length) + b"\r\nConnection: close\r\n\r\n")
        got = s.recv(65536)
    assert got.startswith(b"HTTP/1.1 400 "), got[:300]


def test_the_other_isdigit_sites_take_ascii_digits_only():
    assert parse_smi_csv("²,NVIDIA A,00000000:01:00.0,8192,8000,535.10,8.6") == []  # a malformed row is skipped
    assert len(parse_smi_csv("0,NVIDIA A,00000000:01:00.0,8192,8000,535.10,8.6")) == 1
    assert nvidia_driver_from_windows("31.0.15.²3742") == ""
    assert nvidia_driver_from_windows("31.0.15.3742") == "537.42"
    assert _cc_key("².0") == (-1, -1) and _cc_key("٨.٦") == (-1, -1) and _cc_key("8.6") == (8, 6)
    assert _vkey("1.².3") == (1, 3) and _vkey("1.٣") == (1,)
    assert l4t_of(GPU(index=0, vendor="nvidia", name="Orin", driver_version="3²5.1")) == ""
    assert l4t_of(GPU(index=0, vendor="nvidia", name="Orin", driver_version="35.3.1")) == "35.3.1"
    assert isinstance(driver_hint("8.6", "5²5.60"), str)
