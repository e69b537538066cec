"""Light commands as whole processes (issue 46): `accelstack status`, `detect --json`, `plan` from a
saved report and `--help`, each against `python -m torchruntime info`, in one run.

Goals: `status` at most 1.5x torchruntime's `info`, `detect --json` at most 1.0x. The commands run
in rounds, byte-compiled, with a fresh ACCELSTACK_HOME (nothing installed: status reads the state,
finds no runtime, and has no upgrade to ask the network about) and an ACCELSTACK_CACHE that keeps the
Vulkan enumeration's answer: the loop in benchmarks/_timing.py, shared with bench_detect_cold.py, says
how. Wall time is the goal's measure; CPU time is printed beside it.

    python benchmarks/bench_status_cold.py [--runs 9] [--source DIR]

``--source DIR`` runs the commands from another checkout's ``accelstack`` (started in DIR), to
measure a before and an after on the same machine in one sitting.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Tuple

from _timing import bench_env, median, time_rounds

THEIRS = ("python -m torchruntime info", ["-m", "torchruntime", "info"])


def _ours(report: Path) -> List[Tuple[str, List[str]]]:
    return [("accelstack status", ["-m", "accelstack", "status"]),
            ("accelstack status --json", ["-m", "accelstack", "status", "--json"]),
            ("accelstack detect --json", ["-m", "accelstack", "detect", "--json"]),
            ("accelstack plan --hardware FILE", ["-m", "accelstack", "plan", "--hardware", str(report), "--json"]),
            ("accelstack --help", ["-m", "accelstack", "--help"])]


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
        env = bench_env(work)
        cwd = str(work)  # `-m` puts the working directory first on the path
        if args.source:
            env["PYTHONPATH"] = cwd = str(Path(args.source).resolve())
        report = work / "report.json"
        with open(report, "wb") as out:
            subprocess.run([args.python, "-m", "accelstack", "detect", "--json"], env=env, cwd=cwd, stdout=out, check=True)
        lines = report.read_bytes().splitlines()
        report.write_bytes(json.dumps(json.loads(lines[-1])["result"]).encode())
        commands = [THEIRS, *_ours(report)]
        # any exit status counts: plan exits 1 when nothing fits
        times = time_rounds(args.python, commands, env, args.runs, cwd=cwd)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base_wall, base_cpu = median(times[THEIRS[0]], 0), median(times[THEIRS[0]], 1)
    print(f"source: {args.source or 'this checkout'}; medians of {args.runs} runs, ms")
    print(f"{'':34s}{'wall':>9s}{'CPU':>9s}{'wall x':>9s}{'CPU x':>8s}")
    for name, _ in commands:
        wall, cpu = median(times[name], 0), median(times[name], 1)
        print(f"{name:34s}{wall:9.1f}{cpu:9.1f}{wall / base_wall:9.2f}{cpu / base_cpu:8.2f}")
    print("goals: status <= 1.50x, detect --json <= 1.00x torchruntime info (wall)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
