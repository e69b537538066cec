"""Four images of one model: through a warm session, and as four one-off generates, against one
batch of four (issue 46), in one run, on the SD 1.x-sized probe and the CPU build.

- ``batch``: one engine ``generate`` with ``batch_count=4`` (what `accelstack generate -b 4` runs, less
  the CLI's process start): one load, four images; its time / 4 is the reference per image.
- ``session``: :class:`accelstack.engine.session.WarmSession`, four jobs of one image each (what the core's
  ``open_session`` and the service's generate jobs run): one load, then the worker reused.
- ``one-off``: four engine ``generate`` calls of one image each: four loads (how the service ran jobs before).

Each ratio is per image against the batch's per-image time, measured in the same run (goal for the
session: <= 1.10x). Seeds differ per image, as a batch's do.

    python benchmarks/bench_warm_session.py [--size 128] [--steps 4] [--runs 2]
"""
from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, List


def runtime_dir(wheel: Path, cache: Path) -> Path:
    target = cache / f"runtime-{hashlib.sha256(wheel.read_bytes()).hexdigest()[:16]}"
    if not target.is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--no-index",
                        "--target", str(target), str(wheel)], check=True)
    return target


def best(fn: Callable[[], None], runs: int) -> float:
    times: List[float] = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--runtime", type=Path, help="an unpacked CPU runtime (default: the CPU build, from the build cache)")
    ap.add_argument("--probe-cache", type=Path, help="where the probe model is kept (default: the settings' probe cache)")
    args = ap.parse_args()

    from accelstack.engine.generation import generate
    from accelstack.engine.probes.model import DEFAULT_SEED, ensure_probe_model
    from accelstack.engine.request.check import check_generation
    from accelstack.engine.runtime import Runtime
    from accelstack.engine.session import WarmSession
    from accelstack.engine.worker.protocol import GenerateRequest
    from accelstack.publisher.build import build_ggml
    from accelstack.settings import Settings

    s = Settings.resolve()
    rt = Runtime(args.runtime or runtime_dir(Path(build_ggml("cpu", s).wheel), s.cache / "bench"), "cpu")
    probe = ensure_probe_model(DEFAULT_SEED, cache_root=args.probe_cache or s.probe_cache, keep=True)
    work = Path(tempfile.mkdtemp(prefix="accelstack-bench-warm-"))

    def request(seed: int, batch: int = 1) -> GenerateRequest:
        return GenerateRequest(prompt="a lighthouse", width=args.size, height=args.size, steps=args.steps, seed=seed,
                               sampler="euler", batch_count=batch)

    def batch() -> None:
        generate(rt, probe.path, request(1, 4), work / "batch.png")

    def one_off() -> None:
        for i in range(4):
            generate(rt, probe.path, request(1 + i), work / f"one-{i}.png")

    def session() -> None:
        with WarmSession(rt) as warm:
            for i in range(4):
                warm.generate(check_generation(request(1 + i), probe.path, work / f"warm-{i}.png"))

    b = best(batch, args.runs) / 4
    w = best(session, args.runs) / 4
    o = best(one_off, args.runs) / 4
    print(f"SD 1.x probe, {args.size}x{args.size}, {args.steps} steps, CPU build; best of {args.runs} runs, s per image")
    print(f"{'batch of 4 (generate -b 4)':32s}{b:8.3f}   1.00x")
    print(f"{'warm session, 4 jobs':32s}{w:8.3f}{w / b:7.2f}x   (goal <= 1.10x)")
    print(f"{'4 one-off generates':32s}{o:8.3f}{o / b:7.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
