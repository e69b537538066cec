"""`accelstack verify` wall time: this working tree against a baseline revision, same script, same
machine, alternating runs.

The baseline is checked out with `git worktree` into a temporary folder and run with the same
interpreter, the same CPU runtime (the cached `cpu` build, installed once) and its own probe cache,
so the two differ only in accelstack's code. The default baseline, ``b43597e``, is the last commit
before the verify-time work of issue 14 (one probe file, kept value pools, the worker started while
the probe is written, its exit overlapped, lazy imports, the record of the probe image that spares
a later verify its second generation; ``--baseline 7844fa6`` measures the record alone). The first
run of each side is its cold run (the new side then makes its pools file and its record in its own
cache); the figures are over the warm runs after it. Prints each
run, then min and median per side and the ratios new/baseline. This machine's speed drifts by 20 %
or more from minute to minute: alternate, and compare the ratio.

    python benchmarks/bench_verify.py [--runs 8] [--baseline b43597e]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def verify(code: Path, runtime: Path, work: Path, side: str) -> tuple:
    """One `accelstack verify` with the code in ``code``: (wall seconds, report). No CPU time: the new
    side does not wait for its worker's exit, so the worker's CPU time is not counted as the command's."""
    env = dict(os.environ, PYTHONPATH=str(code), ACCELSTACK_PROBE_CACHE=str(work / side / "probe"),
               ACCELSTACK_CACHE=str(work / side / "cache"), ACCELSTACK_HOME=str(work / side / "home"),
               ACCELSTACK_CONFIG=str(work / "none.yaml"))
    start = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "accelstack", "verify", "--runtime", str(runtime), "--json"],
                         capture_output=True, text=True, env=env, cwd=str(work))
    wall = time.perf_counter() - start
    if res.returncode != 0:
        raise SystemExit(f"{side} verify failed ({res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    report = json.loads(res.stdout.strip().splitlines()[-1])["result"]
    return wall, report


def fmt(values: list) -> str:
    return f"min {min(values):5.2f} s, median {statistics.median(values):5.2f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=8, help="warm runs per side (after one cold run each)")
    ap.add_argument("--baseline", default="b43597e", help="the git revision to compare with")
    args = ap.parse_args()

    from accelstack.publisher.build import build_ggml
    from accelstack.settings import Settings

    work = Path(tempfile.mkdtemp(prefix="bench-verify-"))
    baseline = work / "baseline"
    try:
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(baseline), args.baseline],
                       check=True, capture_output=True)
        wheel = Path(build_ggml("cpu", Settings.resolve()).wheel)
        runtime = work / "runtime"
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                        "--no-index", "--target", str(runtime), str(wheel)], check=True)
        sides = {"baseline": baseline, "new": REPO}
        walls: dict = {side: [] for side in sides}
        for i in range(args.runs + 1):
            order = list(sides) if i % 2 == 0 else list(reversed(list(sides)))
            line = []
            for side in order:
                wall, report = verify(sides[side], runtime, work, side)
                if i > 0:
                    walls[side].append(wall)
                line.append(f"{side} {wall:5.2f} s (probe {report['probe_seconds']:.2f}, load {report['load_seconds']:.2f})")
            print(f"{'cold' if i == 0 else f'run {i}'}: " + "; ".join(line), flush=True)
        print()
        for side in sides:
            print(f"verify warm, {side:8}: {fmt(walls[side])}")
        print(f"ratio new/baseline: median {statistics.median(walls['new']) / statistics.median(walls['baseline']):.2f}, "
              f"min {min(walls['new']) / min(walls['baseline']):.2f}; load average {os.getloadavg()[0]:.2f} "
              f"on {os.cpu_count()} CPUs")
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(baseline)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
