"""Start the real `accelstack serve` in a child process and talk to it over HTTP on 127.0.0.1."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import requests

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 60.0
JOB_TIMEOUT = 240.0


def service_env(home: Path, cache: Path, **extra: str) -> Dict[str, str]:
    """The session's isolated environment (build and probe caches shared) with this test's home and
    cache, and ``extra`` variables (a probe cache of the test's own)."""
    env = {**os.environ, "ACCELSTACK_HOME": str(home), "ACCELSTACK_CACHE": str(cache), **extra}
    for name in ("ACCELSTACK_OFFLINE", "ACCELSTACK_DEBUG", "ACCELSTACK_MANIFESTS", "ACCELSTACK_BACKEND"):
        env.pop(name, None)
    return env


class Service:
    """One running service: its announced URL, its token, and helpers for requests and events."""

    def __init__(self, home: Path, cache: Path, *args: str, preexec_fn: Optional[Callable[[], None]] = None,
                 env: Optional[Dict[str, str]] = None) -> None:
        self.home = home
        self.stderr_path = home.parent / f"serve-{id(self)}.err"
        self.stderr_file = open(self.stderr_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "accelstack", "serve", "--json", *args],
                                     env=service_env(home, cache, **(env or {})), stdout=subprocess.PIPE, stderr=self.stderr_file,
                                     text=True, cwd=str(REPO), preexec_fn=preexec_fn)
        line = _readline(self.proc, START_TIMEOUT)
        if not line:
            self.proc.kill()
            raise AssertionError(f"the service did not start: {self.stderr()}")
        self.announced = json.loads(line)
        self.url = self.announced["url"].rstrip("/")
        self.token_file = Path(self.announced["token_file"])
        self.token = self.token_file.read_text().strip()
        self.port = int(self.url.rsplit(":", 1)[1])

    def stderr(self) -> str:
        self.stderr_file.flush()
        return self.stderr_path.read_text()

    def headers(self, **extra: str) -> Dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", **extra}

    def get(self, path: str, *, auth: bool = True, **kw: Any) -> requests.Response:
        headers = {**(self.headers() if auth else {}), **kw.pop("headers", {})}
        return requests.get(self.url + path, headers=headers, timeout=60, **kw)

    def post_job(self, kind: str, **options: Any) -> requests.Response:
        return requests.post(f"{self.url}/api/v1/jobs", json={"kind": kind, "options": options}, headers=self.headers(),
                             timeout=60)

    def start_job(self, kind: str, **options: Any) -> Dict[str, Any]:
        r = self.post_job(kind, **options)
        assert r.status_code == 202, r.text
        return r.json()["job"]

    def events(self, job_id: str) -> Iterator[Tuple[str, int, Dict[str, Any]]]:
        """(event, id, data) for each Server-Sent Event of a job, live, until the stream ends."""
        with requests.get(f"{self.url}/api/v1/jobs/{job_id}/events", headers=self.headers(), stream=True,
                          timeout=JOB_TIMEOUT) as r:
            assert r.status_code == 200, r.text
            assert r.headers["content-type"].startswith("text/event-stream")
            event, eid, data = "", -1, ""
            for raw in r.iter_lines(decode_unicode=True):
                if raw is None:
                    continue
                if raw == "":
                    if data:
                        yield event, eid, json.loads(data)
                    event, eid, data = "", -1, ""
                elif raw.startswith(":"):
                    continue
                else:
                    name, _, value = raw.partition(": ")
                    if name == "event":
                        event = value
                    elif name == "id":
                        eid = int(value)
                    elif name == "data":
                        data += value

    def follow(self, job_id: str) -> Tuple[List[Dict[str, Any]], str, Dict[str, Any]]:
        """All progress events of a job and its final (event, data)."""
        progress: List[Dict[str, Any]] = []
        for event, eid, data in self.events(job_id):
            if event == "progress":
                assert eid == len(progress), "event ids count the job's events from 0"
                progress.append(data)
            else:
                return progress, event, data
        raise AssertionError("the stream ended without a result or error event")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr_file.close()
        if self.proc.stdout:
            self.proc.stdout.close()
        return self.proc.returncode


def _readline(proc: subprocess.Popen, timeout: float) -> str:
    """The first line of stdout, or '' when the process ends or the time runs out."""
    out: List[str] = []
    t = threading.Thread(target=lambda: out.append(proc.stdout.readline() if proc.stdout else ""), daemon=True)
    t.start()
    t.join(timeout)
    return out[0].strip() if out else ""
