"""Two real processes fetch the same blob at the same time: one downloads, the other waits on
the blob's lock and reuses the result; the file is correct and was downloaded once."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from artifact_helpers import gate, payload, ref_for

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from accelstack.artifacts import ArtifactRef, Cache, Transport, fetch_one

    name, sha, size, url, cache = sys.argv[1:6]

    def progress(event):
        print(event.to_json(), flush=True)

    path = fetch_one(ArtifactRef(name, sha, int(size), [url]), cache=Cache(cache), offline=False,
                     transport=Transport(connect_timeout=5, read_timeout=30), progress=progress)
    print(json.dumps({"event": "result", "path": str(path)}), flush=True)
    """
)


def _start(ref, cache_dir) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, ref.name, ref.sha256, str(ref.size), ref.urls[0], str(cache_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _lines_until(proc: subprocess.Popen, predicate, timeout: float = 30.0):
    """Read ``proc``'s JSON lines until one satisfies ``predicate``; return all read."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        event = json.loads(line)
        seen.append(event)
        if predicate(event):
            return seen
    raise AssertionError(f"condition not met; saw {seen}; stderr: {proc.stderr.read() if proc.poll() is not None else ''}")


def test_two_processes_fetch_the_same_blob(server, tmp_path):
    data = payload(400_000)
    ref = ref_for("shared.bin", data, server.serve("/shared.bin", data))
    release = threading.Event()
    server.fault("/shared.bin", gate(200_000, release))
    cache_dir = tmp_path / "cache"

    first = _start(ref, cache_dir)
    second = None
    try:
        # The first process is mid-download (it holds the lock) ...
        deadline = time.monotonic() + 30
        while not (server.hits("/shared.bin") and server.hits("/shared.bin")[0].sent >= 200_000):
            assert time.monotonic() < deadline, "first process never started downloading"
            assert first.poll() is None, first.stderr.read()
            time.sleep(0.02)
        # ... so the second one waits for it.
        second = _start(ref, cache_dir)
        _lines_until(second, lambda e: e.get("kind") == "message" and "waiting" in e.get("message", ""))
        release.set()
        out1, err1 = first.communicate(timeout=60)
        out2, err2 = second.communicate(timeout=60)
    finally:
        release.set()
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
    assert first.returncode == 0, err1
    assert second.returncode == 0, err2
    result1 = json.loads(out1.strip().splitlines()[-1])  # the script's own line, not the CLI's
    result2 = json.loads(out2.strip().splitlines()[-1])
    assert result1["path"] == result2["path"]
    assert Path(result1["path"]).read_bytes() == data
    # downloaded once: a single request, exactly the file's bytes
    assert len(server.hits("/shared.bin")) == 1
    assert server.sent("/shared.bin") == len(data)
    # the second reports the blob as reused from the cache
    ends = [json.loads(line) for line in out2.strip().splitlines() if '"kind": "end"' in line]
    assert any(e["task"] == "shared.bin" and e["extra"].get("cached") for e in ends)
