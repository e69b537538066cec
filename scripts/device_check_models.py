"""Full-size synthesized weights for scripts/device-check.sh. Prints one JSON object of generate's arguments
per model: {"sdxl": ["--model", PATH], "flux": ["--diffusion-model", PATH, ...]}.

    python scripts/device_check_models.py headers DIR    # header-only, every file at its published size
                                                          # (sparse: no disk), for the planner's estimates
    python scripts/device_check_models.py loadable DIR   # files stable-diffusion.cpp loads and runs:

FLUX.1-dev's whole DiT (19 double and 38 single blocks of 3072, 11.9 B parameters in F16, 23.8 GB written) with
a full-width decode-only VAE and the Flux probe's CLIP-L, no T5 (its 256 tokens run as zeros, as without T5);
SDXL: the SDXL family probe (Segmind Vega's UNet layout at SDXL's widths, full CLIP-L and CLIP-G), there being
no full SDXL UNet synthesizer yet: its step time is below full SDXL's. Random weights run at the speed of real
ones; the images are noise.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def headers(out: Path) -> dict:
    sys.path[:0] = [str(ROOT / "tests" / "engine"), str(ROOT / "tests" / "engine" / "memory")]  # header synthesis: model_specs, memory/test_memory_plan
    from test_memory_plan import flux_files, sdxl_file

    flux = flux_files(out)
    return {"sdxl": ["--model", str(sdxl_file(out))],
            "flux": ["--diffusion-model", flux["model"], "--vae", flux["vae"], "--clip-l", flux["clip_l"],
                     "--t5xxl", flux["t5xxl"]]}


def loadable(out: Path) -> dict:
    from accelstack.engine.probes import families as pf
    from accelstack.engine.probes.family_files import ensure_family_probe
    from accelstack.engine.probes.weights import Pools, write_parts

    flux = out / "flux1-dev-synth.safetensors"
    if not flux.exists():
        parts = {**pf.FAMILIES["flux"].parts(),
                 "model.diffusion_model.": pf.flux_tensors(hidden=3072, double=19, single=38),
                 "vae.": pf.vae_decoder_tensors(pf.FLUX_LATENT, ch=128)}
        tmp = flux.with_suffix(".part")
        write_parts(tmp, parts, Pools(42, "F16"), {"format": "pt", "generator": "accelstack device-check"},
                    lambda n: None)
        tmp.replace(flux)
    sdxl = ensure_family_probe("sdxl", 42, out / "probes", keep=True).path
    return {"sdxl": ["--model", str(sdxl)], "flux": ["--model", str(flux)]}


if __name__ == "__main__":
    mode, folder = sys.argv[1], Path(sys.argv[2])
    folder.mkdir(parents=True, exist_ok=True)
    print(json.dumps(headers(folder) if mode == "headers" else loadable(folder)))
