"""`generate` without -o never overwrites an image the user did not name (issue 42, item 9): it wrote
output.png over the previous run's. The real CLI on the CPU build, in a folder that already holds one."""
from __future__ import annotations

import json
import subprocess
import sys

from engine_helpers import cli_env


def _generate(cpu_runtime, probe_model, tmp_path, cwd, *extra):
    env = cli_env(tmp_path / "cache", tmp_path)
    return subprocess.run([sys.executable, "-m", "accelstack", "generate", "--runtime", str(cpu_runtime.path),
                           "-m", str(probe_model.path), "-p", "a lighthouse", "-W", "64", "-H", "64", "--steps", "1",
                           "--threads", "1", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env, cwd=str(cwd), timeout=600)


def test_generate_without_output_keeps_the_existing_output_png_and_says_where_the_image_went(
        cpu_runtime, probe_model, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    mine = work / "output.png"
    mine.write_bytes(b"the user's earlier image")
    (work / "output-2.png").write_bytes(b"another one")
    res = _generate(cpu_runtime, probe_model, tmp_path, work)
    assert res.returncode == 0, res.stderr[-2000:]
    assert mine.read_bytes() == b"the user's earlier image"
    assert (work / "output-2.png").read_bytes() == b"another one"
    assert (work / "output-3.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote 1 image: output-3.png" in res.stdout, res.stdout
    assert "-o names the file" in res.stdout

    res = _generate(cpu_runtime, probe_model, tmp_path, work, "-b", "2", "--json")  # a batch, with --json
    assert res.returncode == 0, res.stderr[-2000:]
    images = json.loads(res.stdout.splitlines()[-1])["result"]["images"]
    assert [i.rsplit("/", 1)[-1] for i in images] == ["output-2-1.png", "output-2-2.png"], images  # output-2.png is taken
    assert mine.read_bytes() == b"the user's earlier image"
    assert (work / "output-2.png").read_bytes() == b"another one"


def test_generate_without_output_in_an_empty_folder_writes_output_png(cpu_runtime, probe_model, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    res = _generate(cpu_runtime, probe_model, tmp_path, work)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (work / "output.png").exists()
    assert "wrote 1 image: output.png" in res.stdout and "free name" not in res.stdout
