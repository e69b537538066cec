"""The memory planner's estimate against the peak measured on this machine (issue 26).

For the SD 1.x probe model on the CPU build (the cached ``cpu`` wheel, installed once into a
temporary folder), for each VAE setting (untiled, tiles of 8 and 16 latent pixels) one worker
loads the model with the options the planner would send, then generates 1-step images of growing
sizes. Before each generation the worker's peak RSS is reset (``5`` into ``/proc/PID/clear_refs``);
after it, the peak above the RSS it had before (``VmHWM - VmRSS``) is the working memory measured,
as the table in :mod:`accelstack.engine.memory.estimate` was. The planner's working memory is its RAM need
less the weights (``BASE + the largest phase's activations + images``). Printed per row: the
estimate, the measurement, their ratio; and once per worker the loaded RSS against the planner's
weights (the RSS also holds Python and the library). Goal: every ratio within 15 % (0.85 .. 1.15);
the estimate is meant to stay on the high side (a ratio >= 1 refuses nothing that fits).

``--family sdxl`` runs the SDXL probe instead (engine.probes.families: Segmind Vega's UNet at SDXL's
real widths, full CLIP-L and CLIP-G, but a quarter-width VAE decoder): its diffusion and text-encoder
memory are SDXL's, its VAE's is not, so only tiled rows (``--tiles 8``: the decode is a few MiB) check
the planner's SDXL constants. ``--family sd2`` and ``--family sd3`` are the same case (the full SD 2.x UNet;
SD3-medium's own MMDiT). ``--family qwen-image`` has one DiT block at the real width (its blocks run one
after the other, so one block's working memory is the real model's) and the real Wan VAE decoder.
``--family z-image`` is Z-Image's whole DiT (Q4_0) with a quarter-width VAE (``--tiles 8``). The flux and
chroma probes are 128 wide (real: 3072) and check nothing: ``--family flux-wide`` is made here instead, one
double and one single FLUX.1 [dev] block at the real 3072 width (24 heads of 128; the depths are read from
the block names, src/flux.hpp), with the probe's CLIP-L and quarter-width VAE (``--tiles 8``): the blocks run
one after the other, so one of each has the real model's working memory; ``--family chroma-wide``, Chroma's.

``--convert q8_0,q4_k`` measures the weights converted on load instead (issue 45): for each type one worker loads
the model with ``weight_type`` set and no converted-weights cache (so stable-diffusion.cpp converts in memory, as
the cache's first load does), and its RSS after loading is set against the planner's weights for that type; the
peak during loading (``VmHWM``: the conversion's read and convert buffers on top) is printed beside it.
``--sizes 1024 --tiles 16`` measures a 1024x1024 image (untiled, SD 1.x's decode alone wants 6.6 GiB).

Linux only (``/proc``). Runs one generation at a time; on 2 cores, a few minutes.

    python benchmarks/bench_memory.py [--family sd1|sd2|sdxl|sd3|qwen-image|z-image|flux|flux-wide|chroma-wide|sd3-large]
                                      [--t5xxl] [--sizes 128,256,384] [--tiles 0,8,16]
                                      [--threads N] [--json] [--convert q8_0,q4_k]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
MIB = 1 << 20
# --family -> the verify family whose CFG scale it runs with (the bench-only probes: their family's)
FAMILY_OF = {"sd1": "sd1", "sd2": "sd2", "sdxl": "sdxl", "sd3": "sd3", "qwen-image": "qwen-image", "z-image": "z-image",
             "flux-wide": "flux", "chroma-wide": "chroma", "sd3-large": "sd3"}


def _status(pid: int) -> Dict[str, int]:
    """VmRSS and VmHWM of ``pid`` in bytes."""
    out: Dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS (proc(5))


def _flux_wide(cache: Path, seed: int, chroma: bool = False):
    """The Flux (``chroma``: Chroma) probe with its blocks at the real width (a temporary probe, removed at exit)."""
    from accelstack.engine.probes import families as pf
    from accelstack.engine.probes.model import ProbeRecipe, ensure_probe

    family = "chroma" if chroma else "flux"

    def parts():
        return {**pf.FAMILIES[family].parts(), "model.diffusion_model.": pf.flux_tensors(hidden=3072, chroma=chroma)}

    recipe = ProbeRecipe(f"{family}-wide-s{seed}", f"wide {family} probe model", parts,
                         {"format": "pt", "generator": "accelstack bench_memory"}, {}, 1)
    return ensure_probe(recipe, seed, cache)


def _sd3_large(work: Path, seed: int):
    """SD3.5-large's MMDiT (38 joint blocks of 2432: its depth fixes its width, src/mmdit.hpp) as a Q4_0 GGUF in
    bare names (8.1 G parameters, 4.6 GB), with the SD3 probe's CLIP-L, CLIP-G and VAE as files of their own:
    (the model, {component: file})."""
    from accelstack.engine.probes.families import FAMILIES
    from accelstack.engine.probes.gguf import write_gguf
    from accelstack.engine.probes.sd3 import mmdit_tensors
    from accelstack.engine.probes.weights import Pools, write_parts

    dit = work / "sd3.5_large-Q4_0.gguf"
    write_gguf(dit, {"": mmdit_tensors(38)}, Pools(seed, "F16"), {}, lambda n: None,
               lambda name, shape: name.startswith("joint_blocks."))
    parts, files, pools = FAMILIES["sd3"].parts(), {"diffusion_model": str(dit)}, Pools(seed, "F8_E5M2")
    for name, prefix in (("clip_l", "text_encoders.clip_l.transformer."), ("clip_g", "text_encoders.clip_g.transformer."),
                         ("vae", "vae.")):
        files[name] = str(work / f"{name}.safetensors")
        write_parts(Path(files[name]), {"": parts[prefix]}, pools, {}, lambda n: None)
    return str(dit), files


def _conversions(runtime, model: str, files: List[str], types: List[str], threads: int) -> List[dict]:
    """One worker per weight type, converting on load: its RSS after loading against the planner's weights."""
    from accelstack.engine.config import EngineOptions
    from accelstack.engine.memory.plan import plan_for_files
    from accelstack.engine.supervision.supervisor import Supervisor

    rows: List[dict] = []
    for weight_type in types:
        given = EngineOptions(weight_type=weight_type, vae_tiling=False, offload_to_cpu=False, threads=threads,
                              converted_dir="")
        planned = plan_for_files(files, 64, 64, 1, given, gpu=False, ram_free=None)
        with Supervisor(runtime, model=model, options=planned.apply(given)) as sup:
            assert sup.pid is not None
            status = _status(sup.pid)
        loaded, peak = status["VmRSS"], status["VmHWM"]
        rows.append({"weight_type": weight_type, "estimate_mib": round(planned.weights / MIB, 1),
                     "measured_mib": round(loaded / MIB, 1), "load_peak_mib": round(peak / MIB, 1),
                     "ratio": round(planned.weights / loaded, 3)})
        r = rows[-1]
        print(f"{weight_type:>6}  weights estimate {r['estimate_mib']:>7.0f} MiB  loaded RSS {r['measured_mib']:>7.0f} MiB"
              f"  ratio {r['ratio']:.2f}  (peak while loading {r['load_peak_mib']:.0f} MiB)", file=sys.stderr)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="128,256,384", help="image sides to generate (ascending)")
    ap.add_argument("--tiles", default="0,8,16", help="VAE tile sizes in latent pixels; 0: untiled")
    ap.add_argument("--threads", type=int, default=0, help="worker threads (default: the physical cores)")
    ap.add_argument("--family", default="sd1", choices=(*FAMILY_OF, "flux"),
                    help="the probe: sd1 (default); sd2, sdxl, sd3 (their UNet or MMDiT at real widths, a "
                         "quarter-width VAE: use --tiles 8); qwen-image (one DiT block at its real width, the real "
                         "Wan VAE decoder); z-image (its whole DiT, Q4_0); flux (128 wide: with --t5xxl only); "
                         "flux-wide, chroma-wide, sd3-large (made here at the real widths, bench-only)")
    ap.add_argument("--t5xxl", action="store_true",
                    help="give the flux probes T5-XXL (24 x 4096, fixed: synthesized as the Q4_0 GGUF "
                         "tests/engine/component_files.t5xxl_gguf writes, 2.7 GB) to measure its text phase")
    ap.add_argument("--json", action="store_true", help="print the rows as one JSON document")
    ap.add_argument("--convert", default="", help="weight types to load converted (q8_0,q4_k): the loaded RSS "
                                                  "against the planner's weights, no generation")
    args = ap.parse_args()

    from accelstack.engine.config import EngineOptions
    from accelstack.engine.memory.plan import plan_for_files
    from accelstack.engine.probes.families import family_spec
    from accelstack.engine.probes.family_files import ensure_family_probe
    from accelstack.engine.probes.model import DEFAULT_SEED
    from accelstack.engine.runtime import Runtime
    from accelstack.engine.supervision.supervisor import Supervisor
    from accelstack.engine.worker.protocol import GenerateRequest
    from accelstack.publisher.build import build_ggml
    from accelstack.settings import Settings

    settings = Settings.resolve()
    components: Dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as work:
        if args.family in ("flux-wide", "chroma-wide"):
            model = _flux_wide(settings.probe_cache, DEFAULT_SEED, chroma=args.family == "chroma-wide").path
        elif args.family == "sd3-large":
            model, components = _sd3_large(Path(work), DEFAULT_SEED)
        else:
            model = ensure_family_probe(args.family, DEFAULT_SEED, settings.probe_cache, keep=args.family == "sd1").path
        cfg = family_spec(FAMILY_OF.get(args.family, args.family)).cfg_scale  # the probe's own, as verify --family runs it
        sizes = sorted(int(s) for s in args.sizes.split(","))
        rows: List[dict] = []
        files = [model, *(path for name, path in components.items() if name != "diffusion_model")]
        if args.t5xxl:  # the tests' synthesized T5-XXL GGUF (llama.cpp names, Q4_0)
            sys.path.insert(0, str(REPO / "tests" / "engine"))
            from component_files import t5xxl_gguf  # type: ignore[import-not-found]

            files.append(str(t5xxl_gguf(Path(work) / "t5xxl-Q4_0.gguf")))
        wheel = Path(build_ggml("cpu", settings).wheel)
        runtime_dir = Path(work) / "runtime"
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                        "--no-index", "--target", str(runtime_dir), str(wheel)], check=True)
        runtime = Runtime(path=runtime_dir, backend="cpu")
        if args.convert:
            rows = _conversions(runtime, model, files, args.convert.split(","), args.threads)
        for tile in (int(t) for t in args.tiles.split(",") if not args.convert):
            given = EngineOptions(vae_tiling=bool(tile), vae_tile_size=tile or 32, threads=args.threads,
                                  t5xxl=files[1] if args.t5xxl else "",
                                  chroma_dit_mask=args.family != "chroma-wide",  # off for Chroma, as generate runs it
                                  **components)
            first = plan_for_files(files, sizes[0], sizes[0], 1, given, gpu=False, ram_free=None)
            options = first.apply(given)
            with Supervisor(runtime, model=model, options=options) as sup:
                pid = sup.pid
                assert pid is not None
                loaded = _status(pid)["VmRSS"]
                print(f"# tiles {tile or 'off'}: loaded RSS {loaded / MIB:.0f} MiB, planner's weights "
                      f"{first.weights / MIB:.0f} MiB (ratio {first.weights / loaded:.2f})", file=sys.stderr)
                for side in sizes:
                    if tile and side // 8 <= tile:
                        continue  # one tile holds the whole latent: the same as untiled
                    plan = plan_for_files(files, side, side, 1, given, gpu=False, ram_free=None)
                    before = _status(pid)["VmRSS"]
                    _reset_peak(pid)
                    sup.generate(GenerateRequest(prompt="a red cube", width=side, height=side, steps=1, seed=1,
                                                 cfg_scale=cfg), attempts=1)
                    measured = _status(pid)["VmHWM"] - before
                    estimate = plan.ram_need - plan.weights
                    rows.append({"side": side, "tile": tile, "estimate_mib": round(estimate / MIB, 1),
                                 "measured_mib": round(measured / MIB, 1), "ratio": round(estimate / measured, 3),
                                 "loaded_rss_mib": round(loaded / MIB, 1), "weights_mib": round(plan.weights / MIB, 1)})
                    r = rows[-1]
                    print(f"{side:>5} {('tile ' + str(tile)) if tile else 'untiled':>8}  estimate {r['estimate_mib']:>7.0f} MiB"
                          f"  measured {r['measured_mib']:>7.0f} MiB  ratio {r['ratio']:.2f}", file=sys.stderr)
    within = all(0.85 <= r["ratio"] <= 1.15 for r in rows)
    if args.json:
        print(json.dumps({"rows": rows, "within_15_percent": within}, indent=2))
    else:
        print(f"{'all' if within else 'NOT all'} estimates within 15% of the measured peak")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
