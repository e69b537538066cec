"""`accelstack fetch` and the CLI progress renderer."""
from __future__ import annotations

import io
import json
import re

import pytest

from accelstack.cli import main
from accelstack.commands.progress import ProgressRenderer
from accelstack.events import ProgressEvent

from artifact_helpers import drop, payload, ref_for
from cli_helpers import json_lines


def _run(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_fetch_json_lines_then_result(server, tmp_path, capsys):
    data = payload(200_000)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    cache = tmp_path / "c"
    rc, out, err = _run(["fetch", ref.urls[0], "--sha256", ref.sha256, "--size", str(ref.size),
                         "--cache", str(cache), "--json"], capsys)
    assert rc == 0, err
    lines = json_lines(out)  # the whole contract checked, schemas included
    assert all(line["event"] in ("progress", "result") for line in lines)
    progress = [line for line in lines if line["event"] == "progress"]
    assert progress[0]["task"] == "" and progress[0]["kind"] == "start" and progress[0]["total"] == 200_000
    assert any(p["task"] == "a.bin" and p["kind"] == "end" and p["ok"] for p in progress)
    result = lines[-1]["result"]
    assert lines[-1]["event"] == "result" and result["sha256"] == ref.sha256
    assert open(result["path"], "rb").read() == data


def test_fetch_plain_prints_path_and_timestamped_lines_when_not_a_tty(server, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ACCELSTACK_CACHE", str(tmp_path / "c"))
    data = payload(1000)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    rc, out, err = _run(["fetch", ref.urls[0], "--sha256", ref.sha256, "--size", str(ref.size)], capsys)
    assert rc == 0
    assert out.strip().endswith(ref.sha256)  # stdout: the answer alone
    assert err.strip() and all(re.match(r"^\d\d:\d\d:\d\d \[fetch\]", line) for line in err.strip().splitlines()), err


def test_fetch_offline_and_errors(server, tmp_path, capsys):
    data = payload(1000)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    base = ["fetch", ref.urls[0], "--sha256", ref.sha256, "--size", str(ref.size), "--cache", str(tmp_path / "c")]
    rc, out, err = _run(base + ["--offline"], capsys)
    assert rc == 1 and "offline" in err and "what to do" in err
    assert server.hits("/a.bin") == []
    rc, out, err = _run(base + ["--offline", "--json"], capsys)
    assert json.loads(out.strip().splitlines()[-1])["error"] == "OfflineError"
    rc, out, err = _run(["fetch", "http://example.com/x", "--sha256", ref.sha256, "--size", "1",
                         "--cache", str(tmp_path / "c")], capsys)
    assert rc == 1 and "https" in err
    rc, out, err = _run(["fetch", ref.urls[0], "--sha256", "nothex", "--size", "1"], capsys)
    assert rc == 2
    wrong = "0" * 64
    rc, out, err = _run(["fetch", ref.urls[0], "--sha256", wrong, "--size", str(ref.size),
                         "--cache", str(tmp_path / "c")], capsys)
    assert rc == 1 and wrong in err and ref.sha256 in err


# -- renderer ------------------------------------------------------------------------------------
class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def _ev(kind, task, done=0, total=None, **kw):
    return ProgressEvent(kind=kind, stage="fetch", task=task, done=done, total=total, **kw)


def test_renderer_modes():
    assert ProgressRenderer("auto", stream=io.StringIO()).mode == "lines"  # not a terminal: timestamped lines
    assert ProgressRenderer("auto", stream=FakeTTY()).mode == "bars"
    with pytest.raises(ValueError):
        ProgressRenderer("loud")


def test_renderer_json_lines():
    out = io.StringIO()
    r = ProgressRenderer("json", json_stream=out)
    r(_ev("start", "a", done=10, total=100))
    line = json.loads(out.getvalue())
    assert isinstance(line.pop("ts"), str) and isinstance(line.pop("stage_index"), int)
    assert line == {"event": "progress", "kind": "start", "stage": "fetch", "task": "a", "done": 10, "total": 100,
                    "ok": None, "message": "", "extra": {}}


def test_renderer_bars_start_at_resumed_offset_and_track_total():
    tty = FakeTTY()
    r = ProgressRenderer("bars", stream=tty)
    r(_ev("start", "", total=300))
    r(_ev("start", "a.bin", done=100, total=200))  # resumed at 100
    bar = r._bars[("fetch", "a.bin")]
    total = r._totals["fetch"]
    assert bar.n == 100 and bar.initial == 100 and total.n == 100
    r(_ev("start", "b.bin", done=0, total=100))
    r(_ev("advance", "a.bin", done=150, total=200))
    r(_ev("advance", "b.bin", done=50, total=100))
    assert total.n == 200
    r(_ev("advance", "b.bin", done=0, total=100))  # restarted from zero
    assert total.n == 150
    r(_ev("message", "b.bin", message="server does not support resuming"))
    r(_ev("end", "a.bin", done=200, total=200, ok=True))
    r(_ev("end", "b.bin", done=100, total=100, ok=True))
    assert total.n == 300
    r(_ev("end", "", done=300, total=300, ok=True))
    r.close()
    text = tty.getvalue()
    assert "server does not support resuming" in text
    assert "fetch total" in text


def test_renderer_quiet_writes_nothing():
    stream = io.StringIO()
    r = ProgressRenderer("quiet", stream=stream, json_stream=stream)
    r(_ev("start", "a", total=1))
    assert stream.getvalue() == ""


def test_renderer_on_a_real_resumed_fetch(server, tmp_path):
    from accelstack.artifacts import Cache, RetryPolicy, Transport, fetch_one

    data = payload(100_000)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    server.fault("/a.bin", drop(40_000))
    tty = FakeTTY()
    r = ProgressRenderer("bars", stream=tty)
    fetch_one(ref, cache=Cache(tmp_path / "c"), offline=False, progress=r, transport=Transport(read_timeout=2),
              retry=RetryPolicy(backoff_base=0.001))
    r.close()
    assert "a.bin" in tty.getvalue()


def test_fetch_deep_rehashes_a_cached_copy(server, tmp_path, capsys):
    data = payload(30_000, seed=5)
    ref = ref_for("d.bin", data, server.serve("/d.bin", data))
    args = ["fetch", ref.urls[0], "--sha256", ref.sha256, "--size", str(ref.size), "--cache", str(tmp_path / "c")]
    assert main(args) == 0
    assert main(args) == 0  # the first reuse hashes it and records it as verified
    blob = capsys.readouterr().out.split()[-1]
    import os

    st = os.stat(blob)
    os.chmod(blob, 0o644)
    with open(blob, "r+b") as fh:
        fh.write(b"\0")
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert main(args) == 0  # the record matches: trusted as it is
    assert open(blob, "rb").read()[:1] == b"\0" and len(server.hits("/d.bin")) == 1
    assert main(args + ["--deep"]) == 0
    assert open(blob, "rb").read() == data and len(server.hits("/d.bin")) == 2
