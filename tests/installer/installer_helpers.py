"""Run the real CLI in a child process against a private home and cache."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import cli_helpers


def cli_env(home: Path, cache: Path, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = {**os.environ, "ACCELSTACK_HOME": str(home), "ACCELSTACK_CACHE": str(cache)}
    env.pop("ACCELSTACK_OFFLINE", None)
    env.update(extra or {})
    return env


def run_cli(args: List[str], env: Dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "accelstack", *args], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=timeout)


def result_of(proc: subprocess.CompletedProcess) -> dict:
    """The ``result`` of the final line of a --json command (the whole JSON Lines contract checked)."""
    try:
        return cli_helpers.result_of(proc.stdout)
    except AssertionError as exc:
        raise AssertionError(f"{exc} (exit {proc.returncode}): {proc.stdout[-2000:]} {proc.stderr[-2000:]}") from None


def error_of(proc: subprocess.CompletedProcess) -> dict:
    """The final error line of a --json command."""
    try:
        return cli_helpers.error_of(proc.stdout)
    except AssertionError as exc:
        raise AssertionError(f"{exc} (exit {proc.returncode}): {proc.stdout[-2000:]} {proc.stderr[-2000:]}") from None
