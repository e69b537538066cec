"""Full live detection vs torchruntime's get_gpus() + get_torch_platform(), in the same run.

Goal (issue 2): median under 50 ms on Linux when no vendor tool must be spawned, and never slower
than torchruntime while reporting far more. Each detection is run in a fresh interpreter too
(cold: imports + data loading, what a user's first `accelstack detect` pays).

    python benchmarks/bench_detect.py [--runs N]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def _median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def _cold_ms(code: str, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL)
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--cold-runs", type=int, default=5)
    args = ap.parse_args()

    from torchruntime.device_db import get_gpus
    from torchruntime.platform_detection import get_torch_platform

    from accelstack import detect  # the core: the home and the Vulkan enumeration's cache from Settings
    from accelstack.hardware.system import LiveSystem

    system = LiveSystem()
    detect(system)  # warm caches (tables, PCI database) as a long-running app would have them
    ours = _median_ms(lambda: detect(system), args.runs)
    theirs = _median_ms(lambda: get_torch_platform(get_gpus()), args.runs)
    report = detect(system)
    ours_cold = _cold_ms("from accelstack import detect, LiveSystem; detect(LiveSystem())", args.cold_runs)
    theirs_cold = _cold_ms(
        "from torchruntime.device_db import get_gpus; from torchruntime.platform_detection import get_torch_platform; "
        "get_torch_platform(get_gpus())",
        args.cold_runs,
    )
    import shutil

    print(f"machine: {len(report.gpus)} GPU(s), {report.cpu.model}, {len(report.cpu.features)} CPU features")
    if not shutil.which("lspci"):
        print("note: lspci is not installed, so torchruntime's get_gpus() fails at once and detects nothing;")
        print("      install pciutils for a fair comparison (accelstack reads sysfs and needs no lspci)")
    print(f"accelstack detect (warm)       median {ours:8.2f} ms over {args.runs} runs")
    print(f"torchruntime get_gpus+platform median {theirs:8.2f} ms over {args.runs} runs")
    print(f"ratio accelstack/torchruntime  {ours / theirs:8.2f}  (goal: <= 1.0, and accelstack < 50 ms)")
    print(f"cold process, accelstack       median {ours_cold:8.1f} ms over {args.cold_runs} runs")
    print(f"cold process, torchruntime     median {theirs_cold:8.1f} ms over {args.cold_runs} runs")
    print(f"cold ratio                     {ours_cold / theirs_cold:8.2f}")
    print(f"goal under 50 ms: {'met' if ours < 50 else 'NOT met'}; not slower than torchruntime: {'met' if ours <= theirs else 'NOT met'}")


if __name__ == "__main__":
    main()
