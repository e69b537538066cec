"""Whole-process timing shared by the cold-start benchmarks (bench_detect_cold.py, bench_status_cold.py).

One loop, so both measure the same way: every command runs byte-compiled into one temporary
PYTHONPYCACHEPREFIX (filled by warm-up runs, so none pays for compiling nor writes into the source
tree), with a fresh ACCELSTACK_HOME and an ACCELSTACK_CACHE that keeps the Vulkan enumeration's
answer (as on every run after the first on a machine), in rounds whose order rotates (so no command
always follows another). Wall time is what goals measure; the CPU time of the child (user + system,
from the kernel's accounting) is kept beside it, because on a shared machine wall time also measures
the neighbours.
"""
from __future__ import annotations

import os
import resource
import statistics
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

Command = Tuple[str, List[str]]
Times = List[Tuple[float, float]]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bench_env(work: Path) -> Dict[str, str]:
    """This environment with a byte-code cache, a cache and a home inside ``work`` (bytecode allowed)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPYCACHEPREFIX=str(work / "pycache"), ACCELSTACK_CACHE=str(work / "cache"),
               ACCELSTACK_HOME=str(work / "home"))
    return env


def run_once(python: str, argv: Sequence[str], env: Dict[str, str], cwd: Optional[str] = None,
             check: bool = False) -> Tuple[float, float]:
    """(wall, CPU) milliseconds of one run of ``python argv`` started in ``cwd``."""
    cpu, start = _children_cpu(), time.perf_counter()
    subprocess.run([python, *argv], check=check, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return (time.perf_counter() - start) * 1000, (_children_cpu() - cpu) * 1000


def time_rounds(python: str, commands: Sequence[Command], env: Dict[str, str], runs: int,
                cwd: Optional[str] = None, check: bool = False, warmups: int = 2) -> Dict[str, Times]:
    """``warmups`` rounds unmeasured, then ``runs`` rounds of every command, the order rotated each round."""
    for _ in range(warmups):
        for _, argv in commands:
            run_once(python, argv, env, cwd, check)
    times: Dict[str, Times] = {name: [] for name, _ in commands}
    for i in range(runs):
        shift = i % len(commands)
        for name, argv in [*commands[shift:], *commands[:shift]]:
            times[name].append(run_once(python, argv, env, cwd, check))
    return times


def median(times: Times, which: int) -> float:
    """Median wall (``which`` 0) or CPU (1) milliseconds."""
    return statistics.median(t[which] for t in times)
