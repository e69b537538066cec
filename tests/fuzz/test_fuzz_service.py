"""Fuzzing the service's request parsing (issue 29): the real `accelstack serve` on 127.0.0.1,
requests whose numbers are odd text (superscripts, Arabic-Indic and full-width digits, signs,
thousands of digits): ``?index=`` of a job's image, ``Last-Event-ID`` of its event stream,
``Content-Length``, job ids, and ``?refresh``. Each is answered within a time bound, never with a
500: a JSON error of the CLI's shape (or the HTTP layer's own 400 for a malformed request line or
header), or the stream from its first event when a ``Last-Event-ID`` is not a number."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from .fuzzing import CALL_BOUND_S, Counter, fuzz

REPO = Path(__file__).resolve().parents[2]
API = "/api/v1"
STATS = {"service": Counter(), "service 400": Counter(), "service ok": Counter()}
ODD_DIGITS = "0123456789²³¹⁰⁴⁹٠١٢٣٩۰۹０１９𝟎𝟗߀߉०९০৯Ⅻ½⅓¼"
NUMBERS = st.one_of(
    st.text(alphabet=ODD_DIGITS, max_size=8),
    st.text(alphabet=ODD_DIGITS + "-+ .e_x", max_size=12),
    st.sampled_from(["0", "00", "-0", "1", "9999", "10000", "9" * 5000, " 1", "1 ", "+1", "0x1", "1_0", "", "²", "١"]),
    st.text(max_size=10),
)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """A real service on an empty home, and a job that has ended (a verify fails there at once)."""
    root = tmp_path_factory.mktemp("service-fuzz")
    env = {**os.environ, "ACCELSTACK_HOME": str(root / "home"), "ACCELSTACK_CACHE": str(root / "cache")}
    for name in ("ACCELSTACK_OFFLINE", "ACCELSTACK_DEBUG", "ACCELSTACK_MANIFESTS", "ACCELSTACK_BACKEND"):
        env.pop(name, None)
    with open(root / "serve.err", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "accelstack", "serve", "--json"], env=env, cwd=str(REPO),
                                stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            assert proc.stdout is not None
            ready = json.loads(proc.stdout.readline())
            port = int(ready["url"].rstrip("/").rsplit(":", 1)[1])
            token = Path(ready["token_file"]).read_text().strip()
            status, _, body = _request(port, token, "POST", f"{API}/jobs", body=b'{"kind": "verify"}')
            assert status == 202, body
            job = json.loads(body)["job"]["id"]
            _request(port, token, "GET", f"{API}/jobs/{job}/events")  # to its end
            yield port, token, job
        finally:
            proc.terminate()
            proc.wait(60)
    assert "Traceback" not in (root / "serve.err").read_text()


def _header(value: str) -> bytes:
    try:
        return value.encode("latin-1")  # what requests sends
    except UnicodeEncodeError:
        return value.encode("utf-8")


def _request(port: int, token: str, method: str, target: str, headers: Dict[str, str] = None,  # type: ignore[assignment]
             body: bytes = b"", length: str = None) -> Tuple[int, Dict[str, str], bytes]:  # type: ignore[assignment]
    """One request on a fresh connection: (status, headers, body), read until the service closes it."""
    lines: List[bytes] = [f"{method} {target} HTTP/1.1".encode("latin-1"), f"Host: 127.0.0.1:{port}".encode(),
                          f"Authorization: Bearer {token}".encode(), b"Connection: close"]
    lines += [name.encode() + b": " + _header(value) for name, value in (headers or {}).items()]
    if body or length is not None:
        lines.append(b"Content-Length: " + (_header(length) if length is not None else str(len(body)).encode()))
    with socket.create_connection(("127.0.0.1", port), timeout=CALL_BOUND_S) as s:
        s.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        got = b""
        while True:
            data = s.recv(65536)
            if not data:
                break
            got += data
    head, _, rest = got.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    hs = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    if hs.get("transfer-encoding") == "chunked":
        rest = _unchunk(rest)
    return int(status_line.split()[1]), hs, rest


def _unchunk(data: bytes) -> bytes:
    out = b""
    while data:
        size, _, data = data.partition(b"\r\n")
        n = int(size.split(b";")[0], 16)
        if n == 0:
            break
        out, data = out + data[:n], data[n + 2:]
    return out


def _check(status: int, headers: Dict[str, str], body: bytes, what: str) -> None:
    STATS["service"]()
    assert status != 500 and status < 500, f"{what}: {status} {body[:300]!r}"
    if status == 400:
        STATS["service 400"]()
    else:
        STATS["service ok"]()
    if status >= 400 and headers.get("content-type", "").startswith("application/json"):
        err = json.loads(body)["error"]
        assert err["event"] == "error" and err["code"] != "internal-error" and err["action"] != "report-bug", err


@fuzz(int(os.environ.get("FUZZ_SERVICE_EXAMPLES", "150")))
@given(index=NUMBERS)
def test_fuzz_image_index(service, index):
    port, token, job = service
    start = time.monotonic()
    status, hs, body = _request(port, token, "GET", f"{API}/jobs/{job}/image?index={quote(index)}")
    assert time.monotonic() - start < CALL_BOUND_S
    _check(status, hs, body, f"index={index!r}")
    assert status in (400, 404), (index, status)  # the job has no image: 404 for a good index, 400 for the rest
    if not (index.isascii() and index.isdigit() and len(index) <= 4):
        assert status == 400, (index, status, body[:200])


@fuzz(int(os.environ.get("FUZZ_SERVICE_EXAMPLES", "150")))
@given(last=NUMBERS.filter(lambda v: "\r" not in v and "\n" not in v))
def test_fuzz_last_event_id(service, last):
    port, token, job = service
    status, hs, body = _request(port, token, "GET", f"{API}/jobs/{job}/events", headers={"Last-Event-ID": last})
    _check(status, hs, body, f"Last-Event-ID {last!r}")
    if status == 200:
        ok_number = last.strip(" \t").isascii() and last.strip(" \t").isdigit() and len(last.strip(" \t")) < 10
        if not ok_number:
            assert b"id: 0\n" in body, (last, body[:200])  # ignored: the stream starts over
        assert b"event: error\n" in body  # and ends with the job's final event


@fuzz(int(os.environ.get("FUZZ_SERVICE_EXAMPLES", "150")))
@given(length=NUMBERS.filter(lambda v: "\r" not in v and "\n" not in v), job_id=NUMBERS)
def test_fuzz_content_length_and_job_ids(service, length, job_id):
    port, token, _ = service
    number = length.strip(" \t")
    size = int(number) if number.isascii() and number.isdigit() and len(number) < 7 else -1
    body = b"{}".ljust(size) if 2 <= size <= 64 * 1024 else b"{}"  # a valid length comes with its whole body
    status, hs, body = _request(port, token, "POST", f"{API}/jobs", body=body, length=length if size != len(body) else None)
    _check(status, hs, body, f"Content-Length {length!r}")
    status, hs, body = _request(port, token, "GET", f"{API}/jobs/{quote(job_id)}?refresh={quote(length)}")
    _check(status, hs, body, f"job id {job_id!r}")
    assert status in (307, 400, 404), (job_id, status)  # 307: an empty id, "/jobs/" -> "/jobs"

