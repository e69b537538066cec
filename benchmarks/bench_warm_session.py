"""Four images of one model: through a warm session, and as four one-off generates, against one
batch of four (issue 46), in one run, on a family's probe (``--family sd1`` the SD 1.x-sized one, the
default; ``--family flux`` the reduced FLUX.1) and the CPU build.

- ``batch``: one engine ``generate`` with ``batch_count=4`` (what `accelstack generate -b 4` runs, less
  the CLI's process start): one load, four images; its time / 4 is the reference per image.
- ``session``: :class:`accelstack.engine.session.WarmSession`, four jobs of one image each (what the core's
  ``open_session`` and the service's generate jobs run): one load, then the worker reused.
- ``one-off``: four engine ``generate`` calls of one image each: four loads (how the service ran jobs before).
- ``service`` (``--service``): four generate jobs posted one after another to a real ``accelstack serve`` on
  127.0.0.1 (a home of this run with the CPU runtime installed from the build cache), each followed to its
  result over HTTP: one load, then the service's loaded worker reused.

Each ratio is per image against the batch's per-image time, measured in the same run (goal for the
session: <= 1.10x). Seeds differ per image, as a batch's do.

    python benchmarks/bench_warm_session.py [--family flux] [--service] [--size 128] [--steps 4] [--runs 2]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
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
    ap.add_argument("--family", default="sd1", help="the probe's family (sd1, flux...: engine.probes.families)")
    ap.add_argument("--service", action="store_true", help="also four jobs through a real `accelstack serve`")
    args = ap.parse_args()

    from accelstack.engine.config import EngineOptions
    from accelstack.engine.generation import generate
    from accelstack.engine.probes.families import family_spec
    from accelstack.engine.probes.family_files import ensure_family_probe
    from accelstack.engine.probes.model import DEFAULT_SEED
    from accelstack.engine.request.check import check_generation
    from accelstack.engine.runtime import Runtime
    from accelstack.engine.session import WarmSession
    from accelstack.engine.worker.protocol import GenerateRequest
    from accelstack.publisher.build import build_ggml
    from accelstack.settings import Settings

    s = Settings.resolve()
    rt = Runtime(args.runtime or runtime_dir(Path(build_ggml("cpu", s).wheel), s.cache / "bench"), "cpu")
    spec = family_spec(args.family)
    probe = ensure_family_probe(spec.family, DEFAULT_SEED, cache_root=args.probe_cache or s.probe_cache, keep=True)
    options = EngineOptions(**dict(spec.options))  # what the family's probe runs with (e.g. Chroma: no flash attention)
    work = Path(tempfile.mkdtemp(prefix="accelstack-bench-warm-"))
    image = dict(prompt="a lighthouse", width=args.size, height=args.size, steps=args.steps, sampler="euler",
                 cfg_scale=spec.cfg_scale)

    def request(seed: int, batch: int = 1) -> GenerateRequest:
        return GenerateRequest(seed=seed, batch_count=batch, **image)

    def batch() -> None:
        generate(rt, probe.path, request(1, 4), work / "batch.png", options=options)

    def one_off() -> None:
        for i in range(4):
            generate(rt, probe.path, request(1 + i), work / f"one-{i}.png", options=options)

    firsts: List[float] = []

    def session() -> None:
        with WarmSession(rt) as warm:
            for i in range(4):
                t = time.perf_counter()
                warm.generate(check_generation(request(1 + i), probe.path, work / f"warm-{i}.png", options))
                if i == 0:
                    firsts.append(time.perf_counter() - t)

    b = best(batch, args.runs) / 4
    w = best(session, args.runs) / 4
    o = best(one_off, args.runs) / 4
    print(f"{spec.family} probe, {args.size}x{args.size}, {args.steps} steps, CPU build; best of {args.runs} runs, s per image")
    print(f"{'batch of 4 (generate -b 4)':32s}{b:8.3f}   1.00x")
    print(f"{'warm session, 4 jobs':32s}{w:8.3f}{w / b:7.2f}x   (goal <= 1.10x; first job {min(firsts):.3f} s)")
    print(f"{'4 one-off generates':32s}{o:8.3f}{o / b:7.2f}x")
    if args.service:
        v = service_per_image(Path(probe.path), image, dict(spec.options), work, args.runs)
        print(f"{'service, 4 generate jobs':32s}{v:8.3f}{v / b:7.2f}x   (goal <= 1.10x)")
    return 0


def service_per_image(probe: Path, image: dict, engine: dict, work: Path, runs: int) -> float:
    """Seconds per image of four generate jobs through a real service (best of ``runs`` services): each job
    posted when the previous one's result came, over HTTP on 127.0.0.1, as an app drives it."""
    import requests

    import accelstack
    from accelstack.core.verifiers import import_verifier
    from accelstack.settings import Settings

    home, cache, models = work / "home", work / "cache", work / "models"
    models.mkdir(exist_ok=True)
    if not (models / "probe").exists():
        (models / "probe").symlink_to(probe, target_is_directory=True)
        s = Settings.resolve(home=home, cache=cache, manifests=[])
        accelstack.install(None, stack="ggml", report=accelstack.detect(settings=s), settings=s, verifier=import_verifier())
    env = {**os.environ, "ACCELSTACK_HOME": str(home), "ACCELSTACK_CACHE": str(cache)}
    times: List[float] = []
    for _ in range(runs):
        proc = subprocess.Popen([sys.executable, "-m", "accelstack", "serve", "--json", "--models-dir", str(models)],
                                env=env, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            announced = json.loads(proc.stdout.readline())
            url = announced["url"].rstrip("/")
            auth = {"Authorization": "Bearer " + Path(announced["token_file"]).read_text().strip()}
            t = time.perf_counter()
            for i in range(4):
                options = {**image, "model": "probe", "seed": 1 + i, **({"engine": engine} if engine else {})}
                job = requests.post(f"{url}/api/v1/jobs", json={"kind": "generate", "options": options}, headers=auth,
                                    timeout=60).json()["job"]["id"]
                while True:
                    state = requests.get(f"{url}/api/v1/jobs/{job}", headers=auth, timeout=60).json()["job"]["state"]
                    if state not in ("queued", "running"):
                        break
                    time.sleep(0.01)
                if state != "succeeded":
                    raise SystemExit(f"service job {i} {state}")
            times.append(time.perf_counter() - t)
        finally:
            proc.terminate()
            proc.wait(60)
    return min(times) / 4


if __name__ == "__main__":
    raise SystemExit(main())
