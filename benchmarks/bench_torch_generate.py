"""`accelstack generate --backend torch` vs the same pipeline driven by diffusers directly, same run.

Both generate the same work in one process each, after loading: ``--images`` images (default 4) of
the synthesized Stable Diffusion 1.x probe model (no download) at ``--size`` (512) with ``--steps``
(20) Euler steps, CFG 7, seeds 42, 43, ... on the torch runtime's best device, in the dtype the
torch worker picks there (fp16 on CUDA/XPU/MPS, fp32 elsewhere). The first image includes the
device's warm-up in both (the prompt embeddings are computed inside it on both sides, as the
worker does per request). Prints each side's load time, first image, steady-state seconds per
image (the median of images 2..N; accelstack's from the timestamps of its per-step ``--json``
events: one image is from one image's last step to the next one's, its VAE decode included, as
the baseline's is) and the ratios accelstack / diffusers of both; the product goal (<= 1.10,
within 10 % of the best speed the hardware allows) is judged on the steady state, and the first
image, where one-time warm-up lands differently on each side, is shown beside it.

    python benchmarks/bench_torch_generate.py --runtime VENV_OR_TARGET_DIR [--size 512] [--steps 20] [--images 4]

The runtime needs torch, diffusers, transformers and safetensors; accelstack is imported from this
checkout. With ``$OUT`` set, the figures are also written to ``$OUT/bench-torch-generate.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parent.parent

BASELINE = textwrap.dedent("""
    import json, sys, time
    import torch
    sys.path.insert(0, sys.argv[1])
    from accelstack.engine.verification.torch_check import build_probe_pipeline, fixed_prompt_embeds
    probe, steps, size, images = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    kind = "cuda" if torch.cuda.is_available() else "cpu"
    dev, dtype = torch.device(kind), (torch.float16 if kind == "cuda" else torch.float32)
    sync = torch.cuda.synchronize if kind == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    pipe = build_probe_pipeline(torch, probe, dev, dtype)
    pipe.set_progress_bar_config(disable=True)
    sync()
    load = time.perf_counter() - t0
    each = []
    for i in range(images):
        g = torch.Generator(device=dev).manual_seed(42 + i)
        sync(); t = time.perf_counter()
        if i == 0:
            emb = fixed_prompt_embeds(torch, pipe.text_encoder, dev, dtype)
        pipe(prompt_embeds=emb, negative_prompt_embeds=emb, width=size, height=size, num_inference_steps=steps,
             guidance_scale=7.0, generator=g, output_type="pil")
        sync(); each.append(time.perf_counter() - t)
    print("RESULT " + json.dumps({"device": kind, "load": load, "each": each, "total": sum(each)}))
""")


def image_times(events: List[Dict[str, Any]], steps: int, images: int) -> List[float]:
    """Seconds per image of a ``generate --json`` run, from its step events (``done`` counts the
    steps of all images): the first from the generation's start to its last step, each next one
    from the previous image's last step to its own."""
    seen: Dict[int, float] = {}
    start = None
    for e in events:
        if e.get("event") != "progress" or e.get("stage") != "generate" or not e.get("ts"):
            continue
        t = datetime.fromisoformat(e["ts"].replace("Z", "+00:00")).timestamp()
        if (e.get("extra") or {}).get("unit") == "step" and isinstance(e.get("done"), int):
            if start is None:
                start = t
            seen.setdefault(e["done"], t)
    marks = [start] + [seen.get(steps * (i + 1)) for i in range(images)]
    if any(m is None for m in marks):
        return []
    return [float(marks[i + 1]) - float(marks[i]) for i in range(images)]  # type: ignore[arg-type]


def interpreter(runtime: Path) -> str:
    for cand in (runtime / "bin" / "python3", runtime / "bin" / "python", runtime / "Scripts" / "python.exe"):
        if cand.is_file():
            return str(cand)
    return sys.executable  # a pip --target folder: this interpreter with it on the path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runtime", required=True, type=Path)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--images", type=int, default=4)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from accelstack.engine.probes.model import DEFAULT_SEED, ensure_probe_model

    work = Path(tempfile.mkdtemp(prefix="bench-torch-"))
    probe_root = Path(os.environ.get("ACCELSTACK_PROBE_CACHE") or work / "probe")
    t = time.perf_counter()
    probe = ensure_probe_model(DEFAULT_SEED, probe_root, keep=True).path
    print(f"probe model: {probe} ({time.perf_counter() - t:.1f} s)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p),
           "ACCELSTACK_CACHE": str(work / "cache"), "ACCELSTACK_HOME": str(work / "home"),
           "ACCELSTACK_CONFIG_DIR": str(work / "config")}
    cmd = [sys.executable, "-m", "accelstack", "generate", "--backend", "torch", "--runtime", str(args.runtime),
           "--model", str(probe), "--prompt", "a lighthouse at dusk", "-W", str(args.size), "-H", str(args.size),
           "--steps", str(args.steps), "--seed", "42", "--cfg-scale", "7", "-b", str(args.images),
           "-o", str(work / "acc-%d.png"), "--json"]
    t = time.perf_counter()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    acc_wall = time.perf_counter() - t
    last = json.loads(res.stdout.strip().splitlines()[-1]) if res.stdout.strip() else {}
    if res.returncode != 0 or "result" not in last:
        print(f"accelstack generate failed (exit {res.returncode}): {last or res.stderr[-2000:]}")
        return 1
    acc = last["result"]
    events = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    acc_each = image_times(events, args.steps, args.images)
    t = time.perf_counter()
    base = subprocess.run([interpreter(args.runtime), "-c", BASELINE, str(ROOT), str(probe), str(args.steps), str(args.size),
                           str(args.images)], env=env, capture_output=True, text=True)
    base_wall = time.perf_counter() - t
    line = next((x for x in base.stdout.splitlines() if x.startswith("RESULT ")), "")
    if base.returncode != 0 or not line:
        print(f"the diffusers baseline failed (exit {base.returncode}): {base.stderr[-2000:]}")
        return 1
    b = json.loads(line[len("RESULT "):])
    ratio = acc["generate_seconds"] / b["total"]
    steady_acc = statistics.median(acc_each[1:]) if len(acc_each) > 1 else float("nan")
    steady_base = statistics.median(b["each"][1:]) if len(b["each"]) > 1 else float("nan")
    steady = steady_acc / steady_base
    out = {"size": args.size, "steps": args.steps, "images": args.images, "device": acc["device"],
           "accelstack": {"load_s": acc["load_seconds"], "generate_s": acc["generate_seconds"],
                          "each_s": [round(x, 3) for x in acc_each], "steady_s": round(steady_acc, 3),
                          "its_per_second": acc["its_per_second"], "process_wall_s": round(acc_wall, 2)},
           "diffusers": {"load_s": round(b["load"], 3), "generate_s": round(b["total"], 3),
                         "each_s": [round(x, 3) for x in b["each"]], "steady_s": round(steady_base, 3),
                         "process_wall_s": round(base_wall, 2)},
           "ratio_steady": round(steady, 3), "ratio_generate": round(ratio, 3)}
    print(f"device: {acc['device'].get('description') or acc['device'].get('name')} ({b['device']})")
    print(f"{args.images} images {args.size}x{args.size}, {args.steps} steps:")
    print(f"  accelstack generate: load {acc['load_seconds']:.1f} s, generate {acc['generate_seconds']:.2f} s "
          f"(each: {', '.join(f'{x:.2f}' for x in acc_each)}), process {acc_wall:.1f} s")
    print(f"  diffusers directly:  load {b['load']:.1f} s, generate {b['total']:.2f} s "
          f"(each: {', '.join(f'{x:.2f}' for x in b['each'])}), process {base_wall:.1f} s")
    print(f"ratio accelstack / diffusers, steady state (median of images 2..{args.images}): {steady:.3f}  "
          f"(goal <= 1.10: {'met' if steady <= 1.10 else 'MISSED'})")
    print(f"ratio accelstack / diffusers, all images with the first one's warm-up: {ratio:.3f}")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bench-torch-generate.json").write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
