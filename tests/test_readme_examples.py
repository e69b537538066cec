"""The README's command examples run as written: each `$ accelstack ...` transcript is what the command prints.

A transcript may be shortened: its lines (other than `...`) must appear in the real output, in order,
each as a whole line. The round trip the README promises in prose (`detect --json` into
`plan --hardware`) runs too.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def _transcripts() -> List[Tuple[str, List[str]]]:
    """Every ```text block that starts with `$ accelstack`: (command line, the lines it shows)."""
    found = []
    for block in re.findall(r"```text\n(.*?)```", README.read_text(encoding="utf-8"), re.S):
        lines = block.rstrip("\n").split("\n")
        if lines and lines[0].startswith("$ accelstack "):
            command = lines[0][2:].split("   #")[0].strip()
            found.append((command, lines[1:]))
    return found


def _run(args: List[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "ACCELSTACK_HOME": str(tmp_path / "home"), "ACCELSTACK_CACHE": str(tmp_path / "cache"),
           "COLUMNS": "400"}
    env.pop("ACCELSTACK_MANIFESTS", None)
    return subprocess.run([sys.executable, "-m", "accelstack", *args], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)


def test_the_readme_has_command_transcripts():
    commands = [command for command, _ in _transcripts()]
    assert any(c.startswith("accelstack detect") for c in commands)
    assert any(c.startswith("accelstack plan") for c in commands)


@pytest.mark.parametrize("command,shown", _transcripts(), ids=[c for c, _ in _transcripts()])
def test_a_readme_transcript_is_what_the_command_prints(command, shown, tmp_path):
    proc = _run(shlex.split(command)[1:], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    printed = proc.stdout.split("\n")
    at = 0
    for line in shown:
        if line.strip() == "...":
            continue
        try:
            at = printed.index(line, at) + 1
        except ValueError:
            pytest.fail(f"README line not printed (in order) by `{command}`:\n{line}\n--- printed ---\n{proc.stdout}")


def test_the_readme_round_trip_detect_json_into_plan_hardware(tmp_path):
    capture = "tests/fixtures/captures/linux-nvidia-rtx4070-550"
    detected = _run(["detect", "--replay", capture, "--json"], tmp_path)
    assert detected.returncode == 0, detected.stdout[-2000:]
    report = tmp_path / "report.json"
    report.write_text(detected.stdout, encoding="utf-8")
    planned = _run(["plan", "--stack", "torch", "--hardware", str(report)], tmp_path)
    assert planned.returncode == 0, planned.stdout[-2000:]
    assert "decision: torch" in planned.stdout and "RTX 4070" in planned.stdout


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_the_readme_completion_commands_print_a_script(shell, tmp_path):
    proc = _run(["completion", shell], tmp_path)
    assert proc.returncode == 0 and "accelstack" in proc.stdout and len(proc.stdout) > 200
