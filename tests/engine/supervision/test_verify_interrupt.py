"""Ctrl-C or SIGTERM during `verify` says what state it left, as docs/json.md promises of every
interrupted command (issue 42, item 8): it said only "interrupted", and the progress task it had
started was never ended. The real CLI on the CPU build, signalled once the probe's worker is at work."""
from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from engine_helpers import REPO, cli_env


@pytest.mark.parametrize("sig,code,word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_an_interrupted_verify_says_what_it_left_and_ends_its_progress(cpu_runtime, tmp_path, sig, code, word):
    out = tmp_path / "probe.png"
    env = cli_env(tmp_path / "cache", tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "accelstack", "verify", "--runtime", str(cpu_runtime.path),
                             "--threads", "1", "-o", str(out), "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO))
    assert proc.stdout is not None
    lines = []
    for raw in proc.stdout:  # the worker is loading the probe model: the check is under way
        lines.append(json.loads(raw))
        if lines[-1].get("stage") == "generate":
            break
    proc.send_signal(sig)
    rest, err = proc.communicate(timeout=180)
    lines += [json.loads(x) for x in rest.splitlines()]
    assert proc.returncode == code, (proc.returncode, lines[-3:], err[-2000:])
    final = lines[-1]
    assert final["event"] == "error" and final["code"] == "interrupted", final
    assert final["message"] == (f"{word}: no verdict was recorded and no probe image was written; the worker was "
                                "stopped and the temporary probe model removed"), final
    assert final["action"] == "retry" and "run the same command again" in final["hint"], final
    progress = [x for x in lines if x.get("event") == "progress"]
    started = {(x["stage"], x["task"]) for x in progress if x["kind"] == "start"}
    ended = {(x["stage"], x["task"]) for x in progress if x["kind"] == "end"}
    assert started <= ended, started - ended  # no task left open for an app's bar
    verify_end = [x for x in progress if x["kind"] == "end" and x["stage"] == "verify"]
    assert verify_end and verify_end[-1]["ok"] is False and verify_end[-1]["message"] == word, verify_end
    assert not out.exists()
    probe = tmp_path / "cache" / "probe"
    assert not probe.exists() or not [p for p in probe.iterdir() if p.is_dir()], list(probe.iterdir())  # (pools are a cache)
