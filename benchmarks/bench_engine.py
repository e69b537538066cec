"""`accelstack generate` vs stable-diffusion.cpp's own `sd-cli`, same image, same run.

Builds `sd-cli` (the library's example program, CMake SD_BUILD_EXAMPLES=ON) from the same source
distribution and with the same CMake options as the CPU runtime wheel (cached by source hash +
options, so only the first run compiles), then generates the same image (same probe model, size,
steps, seed, sampler, scheduler, threads, flash attention) with both, alternating, and prints:
both times (min over runs; whole process, model load included), their ratio, the library's own
generate_image time in each, and the largest pixel difference. Also: probe-model synthesis time
(into a fresh folder) and `verify` total time. accelstack runs as installed, from bytecode (pip
compiles it at install; a shell with PYTHONDONTWRITEBYTECODE=1 would add ~0.17 s of compiling to
every run): the bytecode goes to a folder of the run, written by one untimed run of each program
before the timed ones.

Goal (issue 6): accelstack within 5% of sd-cli; pixels identical when built with the same flags.

With ``--vs-native`` (issue 12) it measures instead the published ``cpu`` variant (x86-64-v3: AVX2,
FMA, F16C) against a ``GGML_NATIVE=ON`` build of the same source for this very CPU (AVX-512 where
the CPU has it; built once into the build cache under its own key): both generate the same image
with the same probe model (default 256x256, 4 steps), alternating, and it prints both times and
the ratio cpu/native (product goal: <= 1.10, within 10% of the best speed the hardware allows).

With ``--family F`` (issue 26) the same comparison runs on family F's synthesized probe
(:mod:`accelstack.engine.probes.families`: ``sd2``, ``sdxl``, ``flux``, ``chroma``, ``qwen-image``; ``sd1`` is the default), one
file loaded with ``-m`` by both, with the family's CFG scale (1 for the DiTs and SDXL) and its forced
options (Chroma: flash attention off); the verify line is ``verify --family F``.

    python benchmarks/bench_engine.py [--size 128] [--steps 4] [--runs 2] [--keep-probe]
    python benchmarks/bench_engine.py --family flux [--size 128] [--steps 4] [--runs 2]
    python benchmarks/bench_engine.py --vs-native [--size 256] [--steps 4] [--runs 2]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

GEN_RE = re.compile(r"generate_image completed in ([0-9.]+)s")


def sd_cli_path(sdist: Path, cmake_args, cache: Path) -> Path:
    """Where sd-cli built from ``sdist`` with ``cmake_args`` lies in the build cache (built or not): its slot is
    keyed by the source's hash and the options, so a test compares against the build of this very source."""
    from accelstack.publisher.build_cache import sha256_file

    key = hashlib.sha256(json.dumps({"src": sha256_file(sdist), "cmake": cmake_args}).encode()).hexdigest()[:16]
    return cache / f"sd-cli-{key}" / "build" / "bin" / "sd-cli"


def build_sd_cli(sdist: Path, cmake_args, cache: Path) -> Path:
    """Compile sd-cli from ``sdist`` once per (source, options); return the binary."""
    exe = sd_cli_path(sdist, cmake_args, cache)
    slot = exe.parents[2]
    if exe.is_file():
        return exe
    src = slot / "src"
    shutil.rmtree(slot, ignore_errors=True)
    src.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(src)
    root = next(src.iterdir()) / "vendor" / "stable-diffusion.cpp"
    build = slot / "build"
    jobs = str(os.cpu_count() or 2)
    log = open(slot / "build.log", "w")
    subprocess.run(["cmake", "-S", str(root), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DSD_BUILD_EXAMPLES=ON",
                    "-DSD_WEBP=OFF", "-DSD_WEBM=OFF", *cmake_args], check=True, stdout=log, stderr=subprocess.STDOUT)
    subprocess.run(["cmake", "--build", str(build), "--target", "sd-cli", "-j", jobs], check=True, stdout=log,
                   stderr=subprocess.STDOUT)
    return exe


def runtime_dir(wheel: Path, cache: Path) -> Path:
    target = cache / f"runtime-{hashlib.sha256(wheel.read_bytes()).hexdigest()[:16]}"
    if not (target / "stable_diffusion_cpp").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                        "--no-index", "--target", str(target), str(wheel)], check=True)
    return target


def timed(cmd, env=None):
    t = time.perf_counter()
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    wall = time.perf_counter() - t
    if res.returncode != 0:
        raise SystemExit(f"command failed ({res.returncode}): {' '.join(map(str, cmd))}\n{res.stdout[-3000:]}")
    return wall, res.stdout


def library_seconds(out: str) -> float:
    """``library_seconds`` of ``accelstack generate --json``'s result line (JSON Lines: events first)."""
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            data = json.loads(line)
            if data.get("event") == "result":
                return data["result"].get("library_seconds") or float("nan")
            if "library_seconds" in data:  # the single JSON object of older versions
                return data["library_seconds"] or float("nan")
    return float("nan")


def generate_cmd(rt: Path, probe_path: str, out: Path, size: int, steps: int, seed: int, threads: str):
    return [sys.executable, "-m", "accelstack", "generate", "--runtime", str(rt), "-m", probe_path,
            "-p", "a lighthouse on a cliff at dusk", "-W", str(size), "-H", str(size), "--steps", str(steps),
            "--seed", str(seed), "--sampler", "euler", "--scheduler", "discrete", "--cfg-scale", "7",
            "--threads", threads, "-o", str(out), "--json"]


def vs_native(args) -> None:
    """The ``cpu`` variant against a GGML_NATIVE=ON build of the same source, same image."""
    import psutil

    from accelstack.engine.png import read_png
    from accelstack.engine.probes.model import ensure_probe_model
    from accelstack.publisher.build import build_ggml
    from accelstack.publisher.build_cache import build_cache_dir
    from accelstack.settings import Settings

    cache = build_cache_dir(Settings.resolve())
    builds = {}
    for name, extra in (("cpu", []), ("native", ["-DGGML_NATIVE=ON"])):
        t = time.perf_counter()
        result = build_ggml("cpu", Settings.resolve(), extra_cmake_args=extra)
        builds[name] = runtime_dir(Path(result.wheel), cache)
        print(f"{name:6} runtime: {' '.join(result.cmake_args)} ({'cached' if result.cache_hit else 'built'}, "
              f"{time.perf_counter() - t:.1f} s, key {result.key})")
    probe = ensure_probe_model(4321, Settings.resolve().probe_cache)  # synthesized for this run (a kept one in the probe cache is used)
    threads = str(psutil.cpu_count(logical=False) or os.cpu_count() or 1)
    work = Path(tempfile.mkdtemp(prefix="bench-native-"))
    env = dict(os.environ, ACCELSTACK_CACHE=str(work / "cache"), ACCELSTACK_CONFIG=str(work / "none.yaml"))
    wall = {name: [] for name in builds}
    lib = {name: [] for name in builds}
    try:
        for _ in range(args.runs):
            for name, rt in builds.items():
                seconds, out = timed(generate_cmd(rt, probe.path, work / f"{name}.png", args.size, args.steps, args.seed,
                                                  threads), env)
                wall[name].append(seconds)
                lib[name].append(library_seconds(out))
        a, b = read_png(work / "cpu.png").rgb(), read_png(work / "native.png").rgb()
        worst = max((abs(x - y) for x, y in zip(a, b)), default=0) if len(a) == len(b) else None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"image: {args.size}x{args.size}, {args.steps} steps euler/discrete, seed {args.seed}, {threads} threads, "
          f"{args.runs} runs each (min)")
    for name in builds:
        print(f"{name:6} {min(wall[name]):7.2f} s whole process  (generate_image {min(lib[name]):.2f} s; "
              f"runs {', '.join(f'{t:.1f}' for t in wall[name])} s)")
    print(f"ratio cpu/native  {min(wall['cpu']) / min(wall['native']):6.3f} whole process, "
          f"{min(lib['cpu']) / min(lib['native']):6.3f} generate_image   (goal: <= 1.10)")
    print(f"largest pixel difference {worst if worst is not None else 'sizes differ'} (0-255)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=None, help="image side (default 128; 256 with --vs-native)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--keep-probe", action="store_true", help="keep the freshly synthesized probe folder")
    ap.add_argument("--family", default="sd1", metavar="F",
                    help="the model family whose synthesized probe both generate with (default sd1)")
    ap.add_argument("--vs-native", action="store_true",
                    help="compare the cpu variant with a GGML_NATIVE=ON build for this CPU instead of sd-cli")
    args = ap.parse_args()
    if args.vs_native:
        args.size = args.size or 256
        vs_native(args)
        return
    args.size = args.size or 128

    from accelstack.engine.config import EngineOptions
    from accelstack.engine.png import read_png
    from accelstack.engine.probes.families import family_spec
    from accelstack.engine.probes.family_files import ensure_family_probe
    from accelstack.engine.runtime import Runtime
    from accelstack.engine.verification.probe_verify import verify
    from accelstack.publisher.build import build_ggml
    from accelstack.publisher.build_cache import build_cache_dir
    from accelstack.settings import Settings

    cache = build_cache_dir(Settings.resolve())
    t = time.perf_counter()
    result = build_ggml("cpu", Settings.resolve())
    print(f"cpu runtime wheel: {Path(result.wheel).name} ({'cached' if result.cache_hit else 'built'}, "
          f"{time.perf_counter() - t:.1f} s)")
    rt = runtime_dir(Path(result.wheel), cache)
    sdist = next((cache / "sdist").glob("stable_diffusion_cpp_python-*.tar.gz"))
    t = time.perf_counter()
    sd_cli = build_sd_cli(sdist, result.cmake_args, cache)
    print(f"sd-cli: {sd_cli} ({time.perf_counter() - t:.1f} s, same CMake options: {' '.join(result.cmake_args)})")

    work = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    try:
        # a fresh folder: measures synthesis (kept with --keep-probe, else removed when this script ends)
        spec = family_spec(args.family)
        probe = ensure_family_probe(spec.family, 4321, cache_root=work / "probe", keep=args.keep_probe)
        print(f"{spec.family} probe synthesis:  {probe.seconds:7.2f} s for {probe.parameters / 1e9:.2f} B values "
              f"({probe.size_bytes / 1e9:.2f} GB of {probe.dtype})")
        forced = dict(spec.options)
        flash = forced.get("flash_attention", True)
        cfg = f"{spec.cfg_scale:g}"

        # As installed: pip byte-compiles a package when it installs it, so the CLI and its worker run from
        # bytecode; a shell with PYTHONDONTWRITEBYTECODE=1 would compile ~150 modules on every run (0.17 s).
        # The bytecode goes to a folder of this run (PYTHONPYCACHEPREFIX), written by an untimed first run.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(ACCELSTACK_CACHE=str(work / "cache"), ACCELSTACK_CONFIG=str(work / "none.yaml"),
                   PYTHONPYCACHEPREFIX=str(work / "pycache"))
        t = time.perf_counter()
        report = verify(Runtime(rt, "cpu"), output=work / "verify.png", probe_seed=4321, probe_cache=work / "probe",
                        records=work / "cache" / "verify", options=EngineOptions(),
                        families=None if spec.family == "sd1" else [spec.family])
        verify_total = time.perf_counter() - t
        print(f"verify total:     {verify_total:7.2f} s ({report.verdict}; load {report.load_seconds or 0:.2f} s, "
              f"step {report.step_seconds or 0:.2f} s, probe cached{'' if report.ok else '; ' + report.reason})")

        import psutil

        threads = str(psutil.cpu_count(logical=False) or os.cpu_count() or 1)
        common = dict(prompt="a lighthouse on a cliff at dusk", size=str(args.size), steps=str(args.steps),
                      seed=str(args.seed))
        ours_cmd = [sys.executable, "-m", "accelstack", "generate", "--runtime", str(rt), "-m", probe.path,
                    "-p", common["prompt"], "-W", common["size"], "-H", common["size"], "--steps", common["steps"],
                    "--seed", common["seed"], "--sampler", "euler", "--scheduler", "discrete", "--cfg-scale", cfg,
                    "--threads", threads, "--offload-to-cpu", "--flash-attention" if flash else "--no-flash-attention",
                    "-o", str(work / "ours.png"), "--json"]
        model = probe.model  # the probe's one weights file, for both (sd-cli's -m does not take the probe's folder)
        ours_cmd[ours_cmd.index(probe.path)] = model
        cli_cmd = [str(sd_cli), "-m", model, "-p", common["prompt"], "-W", common["size"], "-H", common["size"],
                   "--steps", common["steps"], "-s", common["seed"], "--sampling-method", "euler",
                   "--scheduler", "discrete", "--cfg-scale", cfg, "-t", threads, *(["--diffusion-fa"] if flash else []),
                   "--offload-to-cpu", "-o", str(work / "sdcli.png"), "-v"]
        ours_t, cli_t, ours_gen, cli_gen = [], [], [], []
        timed(cli_cmd)  # untimed: writes the bytecode, and both read the model once before the timed runs
        timed(ours_cmd, env)
        for _ in range(args.runs):
            wall, out = timed(cli_cmd)
            cli_t.append(wall)
            m = GEN_RE.findall(out)
            cli_gen.append(float(m[-1]) if m else float("nan"))
            wall, out = timed(ours_cmd, env)
            ours_t.append(wall)
            ours_gen.append(library_seconds(out))
        a, b = read_png(work / "ours.png"), read_png(work / "sdcli.png")
        pa, pb = a.rgb(), b.rgb()
        worst = max((abs(x - y) for x, y in zip(pa, pb)), default=0) if len(pa) == len(pb) else None
        print(f"{spec.family} probe, image: {args.size}x{args.size}, {args.steps} steps euler/discrete, cfg {cfg}, "
              f"seed {args.seed}, {threads} threads, {args.runs} runs each (min)")
        print(f"sd-cli             {min(cli_t):7.2f} s  (generate_image {min(cli_gen):.2f} s)")
        print(f"accelstack generate{min(ours_t):7.2f} s  (generate_image {min(ours_gen):.2f} s)")
        print(f"ratio accelstack/sd-cli  {min(ours_t) / min(cli_t):6.3f} whole process, "
              f"{min(ours_gen) / min(cli_gen):6.3f} generate_image   (goal: <= 1.05)")
        print(f"outside generate_image   sd-cli {min(cli_t) - min(cli_gen):.2f} s, accelstack {min(ours_t) - min(ours_gen):.2f} s "
              "(loading, and for accelstack Python's start, its imports, the checks and the worker's start)")
        print(f"largest pixel difference {worst if worst is not None else 'sizes differ'} (0-255; goal: 0 with the same flags)")
    finally:
        if not args.keep_probe:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")


if __name__ == "__main__":
    main()
