"""Ctrl-C or SIGTERM in the middle of a generate: exit 130/143 and one final error line that says what
was left (docs/json.md: "the error line says in what state things were left"); it said only
"interrupted". The real CLI on the CPU build, signalled once its first step is reported."""
from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from engine_helpers import REPO, cli_env


@pytest.mark.parametrize("sig,code,word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_an_interrupted_generate_says_no_image_was_written(cpu_runtime, probe_model, tmp_path, sig, code, word):
    out = tmp_path / "out.png"
    env = cli_env(tmp_path / "cache", tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "accelstack", "generate", "--runtime", str(cpu_runtime.path),
                             "-m", str(probe_model.path), "-p", "a lighthouse", "-W", "64", "-H", "64", "--steps", "400",
                             "--threads", "1", "-o", str(out), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=str(REPO))
    assert proc.stdout is not None
    lines = []
    for raw in proc.stdout:  # the first step reported: the worker is generating
        lines.append(json.loads(raw))
        if lines[-1].get("kind") == "advance" and lines[-1].get("stage") == "generate":
            break
    proc.send_signal(sig)
    rest, _err = proc.communicate(timeout=120)
    lines += [json.loads(x) for x in rest.splitlines()]
    assert proc.returncode == code, (proc.returncode, lines[-3:])
    final = lines[-1]
    assert final["code"] == "interrupted" and final["message"].startswith(f"{word}: no image was written"), final
    assert [x for x in lines if x.get("event") in ("result", "error")] == [final]
    assert not out.exists()
