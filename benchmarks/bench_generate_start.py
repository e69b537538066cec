"""`accelstack generate` against stable-diffusion.cpp's `sd-cli`, whole processes, on the ~1 s Flux probe (issue 46).

Both programs generate the same image from the same probe file (FLUX.1 family probe, 128 px, 4 steps, the
same seed, sampler, scheduler, threads, flash attention and --offload-to-cpu), the CPU runtime wheel and
sd-cli built from the same source with the same CMake options (benchmarks/bench_engine.py builds both
once into the build cache). The runs alternate (A B A B...) after one untimed run of each (the bytecode
is written, the model file read into the page cache), and it prints min and median of each and the ratio
of the medians and of the minimums (goal: <= 1.05). Pair by pair ratios are printed too, since the
machine is shared. `--start` also times the CLI's fixed start-up alone: the interpreter, the imports
and the request's check up to the moment the worker is started, and the worker's interpreter up to
the runtime's import.

Cross-check with farm-bench (whole-process timer from outside): the script prints both command lines.

    python benchmarks/bench_generate_start.py [--runs 7] [--size 128] [--steps 4] [--keep-probe]
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import build_sd_cli, runtime_dir, timed  # noqa: E402  (the same builds as the engine benchmark)


def _summary(name: str, xs) -> str:
    return f"{name:20} min {min(xs):6.3f} s  median {statistics.median(xs):6.3f} s  ({', '.join(f'{x:.3f}' for x in xs)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--keep-probe", action="store_true", help="keep the work folder (the probe and both PNGs)")
    args = ap.parse_args()

    from accelstack.engine.probes.families import family_spec
    from accelstack.engine.probes.family_files import ensure_family_probe
    from accelstack.publisher.build import build_ggml
    from accelstack.publisher.build_cache import build_cache_dir
    from accelstack.settings import Settings

    cache = build_cache_dir(Settings.resolve())
    result = build_ggml("cpu", Settings.resolve())
    rt = runtime_dir(Path(result.wheel), cache)
    sdist = next((cache / "sdist").glob("stable_diffusion_cpp_python-*.tar.gz"))
    sd_cli = build_sd_cli(sdist, result.cmake_args, cache)
    work = Path(tempfile.mkdtemp(prefix="bench-start-"))
    try:
        spec = family_spec("flux")
        probe = ensure_family_probe(spec.family, 4321, cache_root=work / "probe", keep=True)
        flash = dict(spec.options).get("flash_attention", True)
        cfg, threads = f"{spec.cfg_scale:g}", str(os.cpu_count() or 1)
        common = ["-p", "a lighthouse on a cliff at dusk", "-W", str(args.size), "-H", str(args.size),
                  "--steps", str(args.steps), "--cfg-scale", cfg, "--scheduler", "discrete", "--offload-to-cpu"]
        ours = [sys.executable, "-m", "accelstack", "generate", "--runtime", str(rt), "-m", probe.model, *common,
                "--seed", str(args.seed), "--sampler", "euler", "--threads", threads,
                "--flash-attention" if flash else "--no-flash-attention", "-o", str(work / "ours.png"), "--json"]
        theirs = [str(sd_cli), "-m", probe.model, *common, "-s", str(args.seed), "--sampling-method", "euler",
                  "-t", threads, *(["--diffusion-fa"] if flash else []), "-o", str(work / "sdcli.png")]
        # as installed: bytecode (pip compiles at install), kept in a folder of this run
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(ACCELSTACK_CACHE=str(work / "cache"), ACCELSTACK_CONFIG=str(work / "none.yaml"),
                   PYTHONPYCACHEPREFIX=str(work / "pycache"))
        print("farm-bench cross-check:\n  " + " ".join(f"{k}={shlex.quote(env[k])}" for k in
              ("ACCELSTACK_CACHE", "ACCELSTACK_CONFIG", "PYTHONPYCACHEPREFIX")) +
              f" farm-bench -n {args.runs} --vs {shlex.quote(shlex.join(theirs))} -- {shlex.join(ours)}")
        timed(theirs)
        timed(ours, env)
        a, b = [], []
        for _ in range(args.runs):
            b.append(timed(theirs)[0])
            a.append(timed(ours, env)[0])
        print(f"flux probe {args.size}x{args.size}, {args.steps} steps, {threads} threads, {args.runs} runs each, alternating")
        print(_summary("sd-cli", b))
        print(_summary("accelstack generate", a))
        pairs = [x / y for x, y in zip(a, b)]
        print(f"ratio accelstack/sd-cli  median {statistics.median(a) / statistics.median(b):.3f}  "
              f"min {min(a) / min(b):.3f}  pairwise median {statistics.median(pairs):.3f}   (goal: <= 1.05)")
        print(f"difference of medians {statistics.median(a) - statistics.median(b):+.3f} s")
        _start_figures(env, rt)
    finally:
        if args.keep_probe:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _start_figures(env, rt: Path) -> None:
    """The fixed costs alone, min and median of 7: the CLI's interpreter and imports up to `generate --help`, and
    the worker's interpreter (its real command line's flags and bootstrap) with its entry module imported, no runtime."""
    import subprocess

    from accelstack.engine.runtime import Runtime

    def best(cmd, extra=None) -> str:
        out = []
        for _ in range(7):
            t = time.perf_counter()
            subprocess.run(cmd, env=dict(env, **(extra or {})), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           check=True)
            out.append(time.perf_counter() - t)
        return f"min {min(out):.3f} s, median {statistics.median(out):.3f} s"

    runtime = Runtime(rt, "cpu")
    worker = runtime.worker_command()
    probe = "import sys; exec(sys.argv.pop(1).split('runpy.run_module')[0]); import accelstack.engine.worker.main"
    print(f"start-up: bare python {best([sys.executable, '-c', 'pass'])}; `generate --help` "
          f"{best([sys.executable, '-m', 'accelstack', 'generate', '--help'])}")
    print(f"worker entry imported ({worker[1]}): {best([worker[0], worker[1], probe, worker[2]], runtime.worker_env())}")


if __name__ == "__main__":
    main()
