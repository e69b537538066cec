"""Issue 29, the service's jobs: a job's image is served only while it is the very file the job
wrote (never through a link planted in its place), the queue is bounded per kind (429 with the
CLI-shaped error), and finished jobs past the documented 100 are forgotten when a job ends."""
from __future__ import annotations

import http.server
import os
import threading

import pytest

from accelstack.service.jobs import MAX_FINISHED_JOBS, MAX_QUEUED

from service_helpers import Service

API = "/api/v1"
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def verified(installed_home, probe_model, tmp_path_factory):
    """A service on a home with the CPU runtime, and a verify job that succeeded with its image."""
    svc = Service(installed_home / "home", installed_home / "cache")
    try:
        job = svc.start_job("verify")
        _, event, data = svc.follow(job["id"])
        assert event == "result" and data["result"]["verdict"] == "PASS", data
        yield svc, job["id"], svc.home / "state" / "service" / "jobs" / job["id"] / "verify.png"
    finally:
        svc.stop()


def test_a_job_image_replaced_by_a_link_is_not_served(verified, tmp_path):
    svc, job_id, png = verified
    original = png.read_bytes()
    first = svc.get(f"{API}/jobs/{job_id}/image")
    assert first.status_code == 200 and first.content == original and original.startswith(PNG)
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"the user's private file")
    other_png = tmp_path / "other.png"
    other_png.write_bytes(PNG + b"not the job's image")
    saved = tmp_path / "saved.png"
    os.replace(png, saved)
    try:
        for plant in ("symlink to a file", "symlink to a PNG", "hard link", "copy", "fifo"):
            if png.exists() or png.is_symlink():
                png.unlink()
            if plant == "symlink to a file":
                png.symlink_to(secret)
            elif plant == "symlink to a PNG":
                png.symlink_to(other_png)
            elif plant == "hard link":
                os.link(other_png, png)
            elif plant == "copy":
                png.write_bytes(original)  # the same bytes, another file: not what the job wrote
            else:
                os.mkfifo(png)  # opened without blocking: no hang
            r = svc.get(f"{API}/jobs/{job_id}/image")
            assert r.status_code == 404, (plant, r.status_code, r.content[:80])
            assert b"private" not in r.content and b"not the job" not in r.content
            err = r.json()["error"]
            assert err["code"] == "image-replaced" and err["command"] == "serve" and err["hint"], err
    finally:
        if png.exists() or png.is_symlink():
            png.unlink()
        os.replace(saved, png)
    again = svc.get(f"{API}/jobs/{job_id}/image")  # the job's own file, back in place, is served again
    assert again.status_code == 200 and again.content == original


class _Gate(http.server.BaseHTTPRequestHandler):
    """A channel that answers nothing until the test opens the gate, then 404: an install that waits."""

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        self.server.asked.set()  # type: ignore[attr-defined]
        self.server.gate.wait(120)  # type: ignore[attr-defined]
        self.send_error(404)


@pytest.fixture
def gate():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Gate)
    httpd.daemon_threads = True
    httpd.gate, httpd.asked = threading.Event(), threading.Event()  # type: ignore[attr-defined]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd
    httpd.gate.set()  # type: ignore[attr-defined]
    httpd.shutdown()
    httpd.server_close()


def test_the_queue_is_bounded_per_kind(start_service, gate):
    url = f"http://127.0.0.1:{gate.server_address[1]}/ggml-manifest.json"
    svc = start_service("--no-build", "--manifest", url)
    install = svc.start_job("install")
    assert gate.asked.wait(60), "the install never asked the channel"  # it runs, and waits for the channel
    accepted, refused = [], None
    for _ in range(MAX_QUEUED + 5):
        r = svc.post_job("verify")
        if r.status_code != 202:
            refused = r
            break
        accepted.append(r.json()["job"]["id"])
    assert svc.get(f"{API}/jobs/{install['id']}").json()["job"]["state"] == "running"
    assert len(accepted) == MAX_QUEUED, f"{len(accepted)} verify jobs were queued behind the install"
    assert refused is not None and refused.status_code == 429, refused.text if refused is not None else None
    err = refused.json()["error"]
    assert err["code"] == "queue-full" and err["action"] == "wait" and err["command"] == "serve", err
    assert err["event"] == "error" and err["ok"] is False and "verify" in err["message"] and err["hint"], err
    gate.gate.set()
    for job_id in accepted:
        svc.follow(job_id)
    assert svc.post_job("verify").status_code == 202  # the queue has room again


def test_finished_jobs_are_forgotten_when_a_job_ends(start_service):
    svc = start_service()
    ids = []
    for _ in range(MAX_FINISHED_JOBS + 20):  # no runtime here: each verify fails at once
        job = svc.start_job("verify")
        _, event, _ = svc.follow(job["id"])
        assert event == "error"
        ids.append(job["id"])
    listed = svc.get(f"{API}/jobs").json()["jobs"]
    assert all(j["state"] in ("succeeded", "failed", "cancelled") for j in listed)
    assert len(listed) == MAX_FINISHED_JOBS, f"{len(listed)} finished jobs are listed (the docs promise at most 100)"
    assert [j["id"] for j in listed] == ids[-MAX_FINISHED_JOBS:], "the most recent ones are kept, in order"
    assert svc.get(f"{API}/jobs/{ids[0]}").status_code == 404
