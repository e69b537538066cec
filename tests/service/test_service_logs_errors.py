"""Issue 25, the service: the serve terminal logs each job, errors have the shape of the CLI's error
line, one time format (the CLI's), and docs/serve.md shows the lines `serve --json` really prints."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import requests

from service_helpers import REPO, Service, service_env

API = "/api/v1"
ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")  # events.iso_utc, as the CLI writes ts
DOCS = REPO / "docs" / "serve.md"


def _cli_error_line(tmp_path: Path) -> dict:
    """A real CLI failure's final --json line (a usage error, like most refused requests)."""
    proc = subprocess.run([sys.executable, "-m", "accelstack", "serve", "--json", "--host", "0.0.0.0"],
                          env=service_env(tmp_path / "h0", tmp_path / "c0"), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=60)
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert line["event"] == "error", line
    return line


def test_service_errors_have_the_shape_of_the_cli_error_line(start_service, tmp_path):
    cli = _cli_error_line(tmp_path)
    svc = start_service()
    bodies = {
        "unauthorized": requests.get(f"{svc.url}{API}/jobs", timeout=30),  # the guard's refusal
        "not-found": svc.get(f"{API}/nothing-here"),  # a route's
        "bad-request": svc.post_job("no-such-kind"),
    }
    for code, r in bodies.items():
        err = r.json()["error"]
        assert err["code"] == code, err
        assert set(err) == set(cli), f"{code}: {sorted(err)} vs the CLI's {sorted(cli)}"
        assert err["event"] == "error" and err["ok"] is False and err["command"] == "serve"
        assert isinstance(err["hint"], str) and isinstance(err["action"], str)
        assert err["format_version"] == cli["format_version"]
    # a job that fails: its error is what `accelstack verify --json` would end with
    job = svc.start_job("verify")
    _, event, data = svc.follow(job["id"])
    assert event == "error" and data["state"] == "failed", data
    err = data["error"]
    assert set(err) - {"run"} == set(cli) - {"run"} and err["command"] == "verify" and err["error"] and err["message"]
    assert "run" not in err or err["run"].startswith("accelstack "), err
    assert svc.get(f"{API}/jobs/{job['id']}").json()["job"]["error"] == err


def test_times_are_written_as_the_cli_writes_them(start_service, tmp_path):
    svc = start_service()
    assert ISO_MS.match(svc.get(f"{API}/hardware").json()["detected_at"])
    job = svc.start_job("install", dry_run=True)  # a plan, and its message
    progress, _, _ = svc.follow(job["id"])
    info = svc.get(f"{API}/jobs/{job['id']}").json()["job"]
    for name in ("created_at", "started_at", "finished_at"):
        assert ISO_MS.match(info[name]), (name, info[name])
    assert progress and all(isinstance(e["ts"], str) and ISO_MS.match(e["ts"]) for e in progress), progress[:2]


def _serve_human(tmp_path: Path):
    """`accelstack serve` for people: its URL from the first line, its token from the file it names."""
    proc = subprocess.Popen([sys.executable, "-m", "accelstack", "serve"], env=service_env(tmp_path / "home", tmp_path / "cache"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO))
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(4)]
    url = lines[0].split(" on ", 1)[1].strip().rstrip("/")
    token_file = lines[2].split("token file:", 1)[1].split(" (", 1)[0].strip()
    return proc, url, Path(token_file).read_text().strip()


def test_the_serve_terminal_logs_each_job(tmp_path):
    proc, url, token = _serve_human(tmp_path)
    try:
        headers = {"Authorization": f"Bearer {token}"}
        job = requests.post(f"{url}{API}/jobs", json={"kind": "verify"}, headers=headers, timeout=30).json()["job"]
        with requests.get(f"{url}{API}/jobs/{job['id']}/events", headers=headers, timeout=120) as r:
            assert "event: error" in r.text  # nothing is installed in this home: the verify fails
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    mine = [line for line in err.splitlines() if f"job {job['id']}" in line]
    assert len(mine) == 2, err
    assert re.match(rf"^\S+Z  job {job['id']}  verify started$", mine[0]), mine[0]
    assert re.match(rf"^\S+Z  job {job['id']}  verify failed in \d+(\.\d)? (s|min)", mine[1]), mine[1]
    assert ": " in mine[1].split(" failed in ", 1)[1], "the end says why it failed"


def test_serve_json_prints_what_the_docs_show(tmp_path):
    """docs/serve.md's example ready, job and result lines have the keys the real ones have."""
    docs = DOCS.read_text()

    def example(event: str) -> dict:
        found = []
        for line in docs.splitlines():
            if line.startswith('{"event"'):
                doc = json.loads(line)  # an example line of serve's output is whole, valid JSON
                if doc["event"] == event:
                    found.append(doc)
        assert found, f"docs/serve.md shows no {event} line"
        return found[0]

    svc = Service(tmp_path / "home", tmp_path / "cache")
    job = svc.start_job("verify")
    svc.follow(job["id"])
    ready = svc.announced
    svc.proc.send_signal(signal.SIGTERM)
    out, _ = svc.proc.communicate(timeout=60)
    assert svc.stop() == 0
    result = json.loads(out.strip().splitlines()[-1])
    err = svc.stderr_path.read_text()
    logged = [json.loads(line) for line in err.splitlines() if line.startswith('{"event":"job"')]
    assert [e["state"] for e in logged] == ["running", "failed"], err
    assert logged[-1]["seconds"] is not None and logged[-1]["code"] and ISO_MS.match(logged[-1]["ts"])

    assert set(example("ready")) == set(ready), (sorted(example("ready")), sorted(ready))
    assert set(example("result")) == set(result) and set(example("result")["result"]) == set(result["result"])
    assert set(example("job")) == set(logged[-1])
