"""Cold start: `accelstack detect --json` as a whole process vs torchruntime's `info`, in one run.

Goal (issue 24): the whole process takes at most 1.0x `python -m torchruntime info` on the same
machine, with a Vulkan driver installed (Mesa's lavapipe here), and detection in process under
50 ms warm. Both commands (and a bare interpreter) run in rounds, byte-compiled, with the Vulkan
enumeration's answer kept in a temporary ACCELSTACK_CACHE by the warm-up (what every `accelstack
detect` after the first one on a machine costs): the loop in benchmarks/_timing.py, shared with
bench_status_cold.py, says how. Wall time is the goal's measure; CPU time is printed beside it.

torchruntime's `info` lists GPUs with `lspci`: where pciutils is not installed it finds nothing at
once and is measured at its fastest (the benchmark says so; put an `lspci` on PATH to compare
with the work it does on a desktop).

    python benchmarks/bench_detect_cold.py [--runs 9] [--warm-runs 30]

Needs torchruntime (`pip install torchruntime`, a dependency of accelstack).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict

from _timing import bench_env, median, time_rounds

OURS = "python -m accelstack detect --json"
THEIRS = "python -m torchruntime info"
BARE = "python -c pass (the interpreter)"
COMMANDS = [(OURS, ["-m", "accelstack", "detect", "--json"]), (THEIRS, ["-m", "torchruntime", "info"]),
            (BARE, ["-c", "pass"])]


def _vulkan_note() -> str:
    loaders = [p for p in ("/usr/lib/x86_64-linux-gnu/libvulkan.so.1", "/usr/lib/aarch64-linux-gnu/libvulkan.so.1",
                           "/usr/lib64/libvulkan.so.1", "/usr/lib/libvulkan.so.1") if os.path.exists(p)]
    icds = sorted(n for d in ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d") if os.path.isdir(d)
                  for n in os.listdir(d) if n.endswith(".json"))
    if not loaders:
        return "no Vulkan loader installed (scripts/setup-vulkan.sh installs one with lavapipe): the goal is measured with one"
    return f"Vulkan loader {loaders[0]}, drivers: {', '.join(icds) or 'none'}"


def _warm_detect_ms(runs: int, cache: Path) -> Dict[str, float]:
    """In this process: the first detect (runs the Vulkan child when the cache is cold), then warm ones."""
    from accelstack import detect
    from accelstack.settings import Settings

    settings = Settings.resolve(cache=cache)
    refresh = []
    for _ in range(3):
        t = time.perf_counter()
        detect(settings=settings, refresh=True)
        refresh.append((time.perf_counter() - t) * 1000)
    warm = []
    for _ in range(runs):
        t = time.perf_counter()
        detect(settings=settings)
        warm.append((time.perf_counter() - t) * 1000)
    return {"refresh": statistics.median(refresh), "warm": statistics.median(warm)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=9, help="whole-process runs of each command (median; default 9)")
    ap.add_argument("--warm-runs", type=int, default=30, help="in-process warm detections (median; default 30)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter both run under (default: this one)")
    args = ap.parse_args()
    if importlib.util.find_spec("torchruntime") is None:
        print("torchruntime is not installed: pip install torchruntime", file=sys.stderr)
        return 2

    work = Path(tempfile.mkdtemp(prefix="accelstack-bench-cold-"))
    try:  # the warm-up rounds byte-compile all and keep the Vulkan enumeration's answer
        times = time_rounds(args.python, COMMANDS, bench_env(work), args.runs, check=True)
        warm = _warm_detect_ms(args.warm_runs, work / "cache-in-process")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    a, b = median(times[OURS], 0), median(times[THEIRS], 0)
    ca, cb = median(times[OURS], 1), median(times[THEIRS], 1)
    print(_vulkan_note())
    if not shutil.which("lspci"):
        print("note: no lspci on PATH: torchruntime's info fails to start it, lists no GPU, and is measured at its fastest")
    print(f"{'':37s}{'wall':>12s}{'CPU':>10s}   (medians of {args.runs} runs, ms)")
    print(f"{BARE:37s}{median(times[BARE], 0):12.1f}{median(times[BARE], 1):10.1f}")
    print(f"{OURS:37s}{a:12.1f}{ca:10.1f}")
    print(f"{THEIRS:37s}{b:12.1f}{cb:10.1f}")
    print(f"{'ratio accelstack/torchruntime':37s}{a / b:12.2f}{ca / cb:10.2f}   (goal: wall <= 1.00)")
    print(f"detect in process, warm              median {warm['warm']:7.2f} ms over {args.warm_runs} runs (goal: < 50 ms)")
    print(f"detect in process, --refresh         median {warm['refresh']:7.2f} ms over 3 runs (the Vulkan child runs)")
    met = a <= b and warm["warm"] < 50
    print(f"goals: {'met' if met else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
