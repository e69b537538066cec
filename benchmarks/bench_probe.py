"""The verify probe: disk kept and `accelstack verify` time, the old way (a 2.1 GB f16 probe kept in
every probe cache) against the new one (1.07 GB of F8_E5M2 synthesized per run, removed after), same
script, same machine, alternating runs.

The old way is reproduced with today's code: the same values written as f16 into a kept folder
where ``ensure_probe_model`` finds it (its marker says f16), so both ways run the same verify and
differ only in the probe. Prints, per way, the bytes left on disk, synthesis time, and `accelstack
verify` wall time through the real command (min and median over ``--runs``), then the ratios
new/old. (No CPU time: verify does not wait for its worker's exit, so the worker's CPU time is not
the command's.) "Old cold" is the old synthesis plus an old warm verify (the old first run did both).

    python benchmarks/bench_probe.py [--runs 3] [--seed 4321]
    python benchmarks/bench_probe.py --synthesis [--runs 5]

``--synthesis`` times only the probe's synthesis (F8_E5M2, the whole SD 1.x model, into a temporary
folder, then removed): the scaled pools encoded when first needed (the baseline), encoded ahead on a
helper thread while the file is written, and read from the kept pools file (what ``ensure_probe_model``
does), alternating, and checks that every way wrote the same bytes.
"""
from __future__ import annotations

import argparse
import json
import math
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


def write_f16_probe(root: Path, seed: int) -> tuple:
    """The old probe (every value f16, 2.1 GB) as a kept folder; returns (seconds, bytes)."""
    from accelstack.engine.probes import layout as probe_layout
    from accelstack.engine.probes import model as pm
    from accelstack.engine.probes.architecture import sd1_tensors
    from accelstack.engine.probes.weights import Pools, write_parts

    start = time.perf_counter()
    folder = root / pm.probe_dir_name(seed)
    folder.mkdir(parents=True, exist_ok=True)
    parts = sd1_tensors()
    write_parts(folder / pm.WEIGHTS, {probe_layout.PREFIXES[p]: parts[p] for p in pm.PARTS}, Pools(seed, "F16"),
                pm._meta(seed), lambda n: None)
    size = (folder / pm.WEIGHTS).stat().st_size
    (folder / pm.MARKER).write_text(json.dumps({"seed": seed, "format_version": pm.FORMAT_VERSION, "dtype": "F16",
                                                "parameters": 1_066_235_307, "size": size}))
    return time.perf_counter() - start, size


def du(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()) if path.exists() else 0


def verify_cli(runtime: Path, probe_cache: Path, work: Path) -> tuple:
    env = dict(os.environ, ACCELSTACK_PROBE_CACHE=str(probe_cache), ACCELSTACK_CACHE=str(work / "cache"),
               ACCELSTACK_HOME=str(work / "home"), ACCELSTACK_CONFIG=str(work / "none.yaml"),
               PYTHONPATH=str(REPO))
    start = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "accelstack", "verify", "--runtime", str(runtime), "--json", "-q"],
                         capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if res.returncode != 0:
        raise SystemExit(f"verify failed ({res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    report = json.loads(res.stdout.strip().splitlines()[-1])["result"]
    return wall, report


def synthesis(runs: int, seed: int) -> None:
    """Three ways to the same probe file, same script, alternating: the scaled pools encoded when first
    needed (the baseline), encoded ahead on a helper thread, and read from the kept pools file (what
    ``ensure_probe_model`` does once that file exists). All three must write the same bytes."""
    import hashlib

    from accelstack.engine.probes import layout as probe_layout
    from accelstack.engine.probes import model as pm
    from accelstack.engine.probes.architecture import sd1_tensors
    from accelstack.engine.probes.weights import Pools, pack_pools, scales_in_order, unpack_pools, write_parts

    parts = sd1_tensors()
    prefixed = {probe_layout.PREFIXES[p]: parts[p] for p in pm.PARTS}
    scales = scales_in_order(prefixed)
    pools_file = Path(tempfile.mkdtemp(prefix="bench-pools-")) / pm.pools_file_name(seed)
    made = Pools(seed, pm.DTYPE)
    pools_file.write_bytes(pack_pools(made, list(dict.fromkeys(scales))))
    times: dict = {"serial": [], "prefetched": [], "kept pools": []}
    digests: dict = {}
    try:
        for _ in range(runs):
            for way in times:
                work = Path(tempfile.mkdtemp(prefix="bench-synth-"))
                try:
                    start = time.perf_counter()
                    pools = Pools(seed, pm.DTYPE)
                    if way == "prefetched":
                        pools.prefetch(scales)
                    elif way == "kept pools":
                        found = unpack_pools(pools_file.read_bytes(), seed, pm.DTYPE, scales)
                        assert found is not None
                        pools.preload(found)
                    write_parts(work / pm.WEIGHTS, prefixed, pools, pm._meta(seed), lambda n: None)
                    pools.close()
                    times[way].append(time.perf_counter() - start)
                    if way not in digests:
                        digests[way] = hashlib.sha256((work / pm.WEIGHTS).read_bytes()).hexdigest()
                finally:
                    shutil.rmtree(work, ignore_errors=True)
    finally:
        shutil.rmtree(pools_file.parent, ignore_errors=True)
    same = len(set(digests.values())) == 1
    print(f"synthesis (F8_E5M2, {sum(math.prod(s) for t in parts.values() for s in t.values()) / 1e9:.2f} B values, "
          f"one file), {runs} runs each, on {os.cpu_count()} CPUs:")
    for way, values in times.items():
        print(f"  {way:10} {fmt(values)}")
    print(f"  ratio prefetched/serial (min) {min(times['prefetched']) / min(times['serial']):.2f}, "
          f"kept pools/serial {min(times['kept pools']) / min(times['serial']):.2f}; same bytes: {same}")
    if not same:
        raise SystemExit("the ways wrote different bytes")


def fmt(values: list) -> str:
    return f"min {min(values):6.2f} s, median {statistics.median(values):6.2f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--synthesis", action="store_true",
                    help="time only the synthesis: serial, prefetched and kept pools")
    args = ap.parse_args()
    if args.synthesis:
        synthesis(args.runs, args.seed)
        return

    from accelstack.engine.probes.model import ensure_probe_model
    from accelstack.publisher.build import build_ggml
    from accelstack.settings import Settings

    wheel = Path(build_ggml("cpu", Settings.resolve()).wheel)
    work = Path(tempfile.mkdtemp(prefix="bench-probe-"))
    runtime = work / "runtime"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                    "--no-index", "--target", str(runtime), str(wheel)], check=True)
    old_root, new_root = work / "old-probe", work / "new-probe"
    try:
        old_synth, new_synth, old_verify, new_verify = [], [], [], []
        old_bytes = new_peak = 0
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
        print(f"load average:  {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (other work on the machine "
              "slows every figure alike)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
