"""The verify probe: disk kept and `accelstack verify` time, the old way (a 2.1 GB f16 probe kept in
every probe cache) against the new one (1.07 GB of F8_E5M2 synthesized per run, removed after), same
script, same machine, alternating runs.

The old way is reproduced with today's code: the same values written as f16 into a kept folder
where ``ensure_probe_model`` finds it (its marker says f16), so both ways run the same verify and
differ only in the probe. Prints, per way, the bytes left on disk, synthesis time, and `accelstack
verify` wall and CPU time through the real command (min and median over ``--runs``), then the
ratios new/old. On a busy machine compare CPU time: wall time there mostly measures the others. "Old cold" is the old synthesis plus an old warm verify (the old first run did both).

    python benchmarks/bench_probe.py [--runs 3] [--seed 4321]
    python benchmarks/bench_probe.py --synthesis [--runs 5]

``--synthesis`` times only the probe's synthesis (F8_E5M2, the whole SD 1.x model, into a temporary
folder, then removed), the scaled pools encoded when first needed (the baseline) against encoded ahead
on a helper thread while the files are written (what ``ensure_probe_model`` does), alternating, and
checks that both ways wrote the same bytes.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def write_f16_probe(root: Path, seed: int) -> tuple:
    """The old probe (every value f16, 2.1 GB) as a kept folder; returns (seconds, bytes)."""
    from accelstack.engine import probe_model as pm
    from accelstack.engine.probe_architecture import sd1_tensors
    from accelstack.engine.probe_weights import Pools, write_part

    start = time.perf_counter()
    folder = root / pm.probe_dir_name(seed)
    pools = Pools(seed, "F16")
    sizes = {}
    for part, tensors in sd1_tensors().items():
        path = folder / pm.FILES[part]
        path.parent.mkdir(parents=True, exist_ok=True)
        write_part(path, tensors, pools, pm._meta(part, seed), lambda n: None)
        sizes[part] = path.stat().st_size
    (folder / pm.MARKER).write_text(json.dumps({"seed": seed, "format_version": pm.FORMAT_VERSION, "dtype": "F16",
                                                "parameters": 1_066_235_307, "sizes": sizes}))
    return time.perf_counter() - start, sum(sizes.values())


def du(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()) if path.exists() else 0


def verify_cli(runtime: Path, probe_cache: Path, work: Path) -> tuple:
    env = dict(os.environ, ACCELSTACK_PROBE_CACHE=str(probe_cache), ACCELSTACK_CACHE=str(work / "cache"),
               ACCELSTACK_HOME=str(work / "home"), ACCELSTACK_CONFIG=str(work / "none.yaml"),
               PYTHONPATH=str(REPO))
    start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    res = subprocess.run([sys.executable, "-m", "accelstack", "verify", "--runtime", str(runtime), "--json", "-q"],
                         capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the command and its worker (waited for)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if res.returncode != 0:
        raise SystemExit(f"verify failed ({res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    report = json.loads(res.stdout.strip().splitlines()[-1])["result"]
    report["cpu_seconds"] = cpu
    return wall, report


def synthesis(runs: int, seed: int) -> None:
    """Serial against prefetched pool encoding, same script, alternating; both must write the same bytes."""
    import hashlib

    from accelstack.engine import probe_model as pm
    from accelstack.engine.probe_architecture import sd1_tensors
    from accelstack.engine.probe_weights import Pools, scales_in_order, write_part

    parts = sd1_tensors()
    times: dict = {"serial": [], "prefetched": []}
    digests: dict = {}
    for _ in range(runs):
        for way in times:
            work = Path(tempfile.mkdtemp(prefix="bench-synth-"))
            try:
                start = time.perf_counter()
                pools = Pools(seed, pm.DTYPE)
                if way == "prefetched":
                    pools.prefetch(scales_in_order(parts))
                for part, tensors in parts.items():
                    write_part(work / f"{part}.safetensors", tensors, pools, pm._meta(part, seed), lambda n: None)
                pools.close()
                times[way].append(time.perf_counter() - start)
                if way not in digests:
                    digests[way] = [hashlib.sha256((work / f"{p}.safetensors").read_bytes()).hexdigest() for p in parts]
            finally:
                shutil.rmtree(work, ignore_errors=True)
    same = digests["serial"] == digests["prefetched"]
    print(f"synthesis (F8_E5M2, {sum(math.prod(s) for t in parts.values() for s in t.values()) / 1e9:.2f} B values), "
          f"{runs} runs each, on {os.cpu_count()} CPUs:")
    for way, values in times.items():
        print(f"  {way:10} {fmt(values)}")
    print(f"  ratio prefetched/serial (min) {min(times['prefetched']) / min(times['serial']):.2f}; same bytes: {same}")
    if not same:
        raise SystemExit("the two ways wrote different bytes")


def fmt(values: list) -> str:
    return f"min {min(values):6.2f} s, median {statistics.median(values):6.2f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--synthesis", action="store_true", help="time only the synthesis: serial against prefetched pools")
    args = ap.parse_args()
    if args.synthesis:
        synthesis(args.runs, args.seed)
        return

    from accelstack.engine.probe_model import ensure_probe_model
    from accelstack.publisher.build import build_ggml

    wheel = Path(build_ggml("cpu").wheel)
    work = Path(tempfile.mkdtemp(prefix="bench-probe-"))
    runtime = work / "runtime"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                    "--no-index", "--target", str(runtime), str(wheel)], check=True)
    old_root, new_root = work / "old-probe", work / "new-probe"
    try:
        old_synth, new_synth, old_verify, new_verify = [], [], [], []
        old_bytes = new_peak = 0
        old_cpu, new_cpu = [], []
        for i in range(args.runs):
            if old_root.exists():
                shutil.rmtree(old_root)
            seconds, old_bytes = write_f16_probe(old_root, args.seed)
            old_synth.append(seconds)
            probe = ensure_probe_model(args.seed, cache_root=new_root)
            new_synth.append(probe.seconds)
            new_peak = probe.size_bytes
            probe.release()
            wall, old_report = verify_cli(runtime, old_root, work)
            old_verify.append(wall)
            wall, report = verify_cli(runtime, new_root, work)
            new_verify.append(wall)
            old_cpu.append(old_report["cpu_seconds"])
            new_cpu.append(report["cpu_seconds"])
            print(f"run {i + 1}: old verify {old_verify[-1]:.2f} s (load {old_report['load_seconds']:.2f} s, step "
                  f"{old_report['step_seconds']:.2f} s); new verify {new_verify[-1]:.2f} s (probe "
                  f"{report['probe_seconds']:.2f} s, load {report['load_seconds']:.2f} s, step "
                  f"{report['step_seconds']:.2f} s); load average {os.getloadavg()[0]:.1f}", flush=True)
        new_kept = du(new_root)
        old_cold = [s + v for s, v in zip(old_synth, old_verify)]
        print()
        print(f"kept on disk:  old {old_bytes / 1e9:.2f} GB per probe cache, new {new_kept / 1e9:.2f} GB "
              f"(temporary while verify runs: {new_peak / 1e9:.2f} GB)")
        print(f"synthesis:     old f16 {fmt(old_synth)}; new F8_E5M2 {fmt(new_synth)}; "
              f"ratio {min(new_synth) / min(old_synth):.2f}")
        print(f"verify warm:   old (kept probe) {fmt(old_verify)}; new (synthesized) {fmt(new_verify)}; "
              f"ratio {min(new_verify) / min(old_verify):.2f}")
        print(f"verify cold:   old (synthesize + verify) {fmt(old_cold)}; new {fmt(new_verify)}; "
              f"ratio {min(new_verify) / min(old_cold):.2f}")
        print(f"verify CPU:    old min {min(old_cpu):6.2f} s, new min {min(new_cpu):6.2f} s (user + system, command and "
              f"worker: the figure contention distorts least); ratio {min(new_cpu) / min(old_cpu):.2f}")
        print(f"load average:  {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (other work on the machine "
              "slows every figure alike)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
