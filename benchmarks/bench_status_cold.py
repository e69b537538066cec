"""Light commands as whole processes (issue 46): `accelstack status`, `detect --json`, `plan` from a
saved report and `--help`, each against `python -m torchruntime info`, in one run.

Goals: `status` at most 1.5x torchruntime's `info`, `detect --json` at most 1.0x. The commands run
in rounds (the order rotates each round, so none always follows another), byte-compiled into one
temporary PYTHONPYCACHEPREFIX filled by warm-up runs, with a fresh ACCELSTACK_HOME (nothing
installed: status reads the state, finds no runtime, and has no upgrade to ask the network about)
and an ACCELSTACK_CACHE that keeps the Vulkan enumeration's answer, as on every run after the first.
Wall time is the goal's measure; CPU time (user + system of the child) is printed beside it,
because on a shared machine wall time also measures the neighbours.

    python benchmarks/bench_status_cold.py [--runs 9] [--source DIR]

``--source DIR`` runs the commands from another checkout's ``accelstack`` (started in DIR), to
measure a before and an after on the same machine in one sitting.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

THEIRS = ("python -m torchruntime info", ["-m", "torchruntime", "info"])


def _ours(report: Path) -> List[Tuple[str, List[str]]]:
    return [("accelstack status", ["-m", "accelstack", "status"]),
            ("accelstack status --json", ["-m", "accelstack", "status", "--json"]),
            ("accelstack detect --json", ["-m", "accelstack", "detect", "--json"]),
            ("accelstack plan --hardware FILE", ["-m", "accelstack", "plan", "--hardware", str(report), "--json"]),
            ("accelstack --help", ["-m", "accelstack", "--help"])]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(python: str, argv: List[str], env: Dict[str, str]) -> Tuple[float, float]:
    """(wall, CPU) milliseconds of one run of ``python argv`` (any exit status: plan exits 1 when nothing fits),
    started in ``ACCELSTACK_BENCH_CWD`` (``-m`` puts the working directory first on the path)."""
    cpu, start = _children_cpu(), time.perf_counter()
    subprocess.run([python, *argv], env=env, cwd=env["ACCELSTACK_BENCH_CWD"], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return (time.perf_counter() - start) * 1000, (_children_cpu() - cpu) * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=9, help="whole-process runs of each command (median; default 9)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter all run under (default: this one)")
    ap.add_argument("--source", help="a checkout whose accelstack package to run (PYTHONPATH)")
    args = ap.parse_args()
    if importlib.util.find_spec("torchruntime") is None:
        print("torchruntime is not installed: pip install torchruntime", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="accelstack-bench-status-"))
    try:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(PYTHONPYCACHEPREFIX=str(work / "pycache"), ACCELSTACK_CACHE=str(work / "cache"),
                   ACCELSTACK_HOME=str(work / "home"))
        env["ACCELSTACK_BENCH_CWD"] = str(work)
        if args.source:
            env["PYTHONPATH"] = env["ACCELSTACK_BENCH_CWD"] = str(Path(args.source).resolve())
        report = work / "report.json"
        with open(report, "wb") as out:
            subprocess.run([args.python, "-m", "accelstack", "detect", "--json"], env=env, cwd=env["ACCELSTACK_BENCH_CWD"],
                           stdout=out, check=True)
        lines = report.read_bytes().splitlines()
        report.write_bytes(__import__("json").dumps(__import__("json").loads(lines[-1])["result"]).encode())
        commands = [THEIRS, *_ours(report)]
        for _ in range(2):  # byte-compile all, keep the Vulkan enumeration's answer
            for _, argv in commands:
                _run(args.python, argv, env)
        times: Dict[str, List[Tuple[float, float]]] = {name: [] for name, _ in commands}
        for i in range(args.runs):
            order = commands[i % len(commands):] + commands[:i % len(commands)]
            for name, argv in order:
                times[name].append(_run(args.python, argv, env))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base_wall = statistics.median(t[0] for t in times[THEIRS[0]])
    base_cpu = statistics.median(t[1] for t in times[THEIRS[0]])
    print(f"source: {args.source or 'this checkout'}; medians of {args.runs} runs, ms")
    print(f"{'':34s}{'wall':>9s}{'CPU':>9s}{'wall x':>9s}{'CPU x':>8s}")
    for name, _ in commands:
        wall = statistics.median(t[0] for t in times[name])
        cpu = statistics.median(t[1] for t in times[name])
        print(f"{name:34s}{wall:9.1f}{cpu:9.1f}{wall / base_wall:9.2f}{cpu / base_cpu:8.2f}")
    print("goals: status <= 1.50x, detect --json <= 1.00x torchruntime info (wall)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
