"""Every user-controlled string `generate` prints reaches the terminal escaped (issue 47): file names with
terminal escape sequences came out raw in its progress and result lines, while `model inspect` escaped them."""
from __future__ import annotations

import os

from companion_files import kohya_lora

from engine_helpers import cli_env, run_cli

ESC = "\x1b]0;owned\x07\x1b[2J"  # retitles the window, clears the screen


def test_generate_prints_file_names_escaped(cpu_runtime, probe_model, cache_with_probe, tmp_path):
    loras = tmp_path / f"loras{ESC}"
    loras.mkdir()
    kohya_lora(loras / "style.safetensors")  # (a LoRA name is a plain file name, checked)
    model = tmp_path / f"model{ESC}.safetensors"
    os.symlink(probe_model.path, model)
    out = tmp_path / f"out{ESC}.png"
    env = cli_env(cache_with_probe, tmp_path)
    r = run_cli(["generate", "--runtime", cpu_runtime.path, "-m", model, "-W", "64", "-H", "64", "--steps", "1",
                 "--seed", "5", "--lora-dir", loras, "-p", "cat <lora:style:0.5>", "-o", out, "-v"], env)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert out.is_file()
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout, r.stdout
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr, r.stderr
    assert "\\x1b]0;owned\\x07" in r.stdout  # named, escaped as model inspect does
