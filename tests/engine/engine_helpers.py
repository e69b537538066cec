"""Helpers for the engine tests: run the real CLI in a subprocess with an isolated environment."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def cli_env(cache: Path, tmp: Path, **extra: str) -> dict:
    env = dict(os.environ)
    env.update(ACCELSTACK_CACHE=str(cache), ACCELSTACK_CONFIG=str(tmp / "no-config.yaml"),
               ACCELSTACK_HOME=str(tmp / "home"), TMPDIR=str(tmp), **extra)  # TMPDIR: kept crash logs stay here
    env.pop("ACCELSTACK_DEBUG", None)
    env.pop("ACCELSTACK_PROBE_CACHE", None)
    return env


def run_cli(args, env, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "accelstack", *map(str, args)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env, timeout=timeout, cwd=str(REPO))
