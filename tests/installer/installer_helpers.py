"""Run the real CLI in a child process against a private home and cache."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional


def cli_env(home: Path, cache: Path, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = {**os.environ, "ACCELSTACK_HOME": str(home), "ACCELSTACK_CACHE": str(cache)}
    env.pop("ACCELSTACK_OFFLINE", None)
    env.update(extra or {})
    return env


def run_cli(args: List[str], env: Dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "accelstack", *args], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=timeout)


def result_of(proc: subprocess.CompletedProcess) -> dict:
    """The ``{"result": ...}`` document a --json command prints last (after one-line progress events)."""
    start = proc.stdout.rfind('{\n  "result"')
    if start < 0:
        raise AssertionError(f"no result document (exit {proc.returncode}): {proc.stdout[-2000:]} {proc.stderr[-2000:]}")
    return json.loads(proc.stdout[start:])["result"]


def error_of(proc: subprocess.CompletedProcess) -> dict:
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith('{"error"'):
            return json.loads(line)
    raise AssertionError(f"no error document in: {proc.stdout[-2000:]} {proc.stderr[-2000:]}")
