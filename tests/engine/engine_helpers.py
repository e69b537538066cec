"""Helpers for the engine tests: run the real CLI in a subprocess with an isolated environment."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List

from accelstack.engine.runtime import Runtime

REPO = Path(__file__).resolve().parents[2]
SLOW_STATUS_WORKER = Path(__file__).resolve().with_name("slow_status_worker.py")
CRASH_ON_LOAD_WORKER = Path(__file__).resolve().with_name("crash_on_load_worker.py")


@dataclass
class SlowStatusRuntime(Runtime):
    """A runtime whose worker is tests/engine/slow_status_worker.py (its /ping and /status answer
    ``delay`` seconds late while generating), with the runtime's own worker options."""

    delay: float = 2.5

    def worker_command(self) -> List[str]:
        cmd = super().worker_command()  # [python, "-c", bootstrap, options...]
        return [self.interpreter(), str(SLOW_STATUS_WORKER), str(self.delay)] + cmd[3:]


@dataclass
class CrashOnLoadRuntime(Runtime):
    """A runtime whose worker is tests/engine/crash_on_load_worker.py (it dies of SIGSEGV as soon as
    it loads a model), with the runtime's own worker options."""

    def worker_command(self) -> List[str]:
        return [self.interpreter(), str(CRASH_ON_LOAD_WORKER)] + super().worker_command()[3:]


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
