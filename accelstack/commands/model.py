"""`accelstack model inspect PATH...`: what a model file is, and what it still needs, before loading it."""
from __future__ import annotations

import argparse
import os
from typing import Any, List, Optional, Tuple

from ..core.models import inspect_models
from ..serde import plural, size_text
from .common import emit, needs_subcommand, printable

__all__ = ["register", "run_inspect", "inspection_text", "COMPONENT_WORDS", "ROLE_USES"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "model",
        help="inspect a model file: its family, size, weight types, and the companion files it still needs",
        description="Know a model before loading it. `inspect` reads only the file's headers (safetensors, GGUF, a "
        "torch .ckpt's zip directory and pickle opcodes; nothing is unpickled or loaded) and says which family it "
        "is (SD 1.x, SD 2.x, SDXL, SDXL refiner, SD3, FLUX.1 dev/schnell, Chroma, Z-Image, Qwen-Image, ... or "
        "unknown, with the evidence), how many parameters it has, its weight types and quantization, which parts "
        "it holds (diffusion model, VAE, text encoders) and which the family still needs, with the file names "
        "they usually come under. The rules follow stable-diffusion.cpp's own version detection.",
        epilog="examples:\n"
        "  accelstack model inspect flux1-dev.safetensors\n"
        "  accelstack model inspect sd_xl_base_1.0.safetensors ae.safetensors clip_l.safetensors\n"
        "  accelstack model inspect ./my-diffusers-folder --json\n"
        "exit codes: 0 every file inspected (an unknown family is an answer, not a failure), 1 a file cannot be "
        "read as a model (damaged, truncated, not a model format), 2 usage error or a path that does not exist.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    msub = p.add_subparsers(dest="model_command", metavar="ACTION")
    ins = msub.add_parser(
        "inspect", help="family, size, weight types, parts and missing companions of model files",
        description="Read each model file's headers (never its weights) and report its family, parameter count, "
        "weight types and quantization, the parts it holds and the companion files its family still needs.",
        epilog="examples:\n  accelstack model inspect flux1-schnell-Q4_K.gguf\n"
        "  accelstack model inspect v1-5-pruned-emaonly.ckpt -v       with the evidence for the family\n"
        "  accelstack model inspect t5xxl_fp16.safetensors --json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ins.add_argument("paths", nargs="+", metavar="PATH",
                     help="a .safetensors, .gguf or .ckpt file, or a diffusers folder (several may be given)")
    ins.set_defaults(func=run_inspect)
    p.set_defaults(func=needs_subcommand(p))


def run_inspect(args: argparse.Namespace) -> int:
    results = inspect_models(args.paths)
    verbose = getattr(args, "verbosity", 0) > 0
    emit(args, {"models": results}, "\n\n".join(inspection_text(r, verbose) for r in results))
    return 0


COMPONENT_WORDS = {"diffusion_model": "diffusion model", "vae": "VAE", "text_encoder": "text encoder", "other": "other"}


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


def _count(n: int) -> str:
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return str(n)


# How generate takes each file that is no model (engine.models.roles), for the report's "use" line.
ROLE_USES = {
    "lora": "put it in the folder given as --lora-dir and apply it from the prompt: <lora:NAME:WEIGHT>",
    "controlnet": "give it as --control-net, with --control-image, next to a model of its family",
    "embedding": "put it in the folder given as --embeddings-dir; its file name is the word that triggers it",
    "taesd": "give it as --taesd next to a model whose latents it decodes (a fast, rougher VAE)",
    "upscaler": "an ESRGAN upscaler stable-diffusion.cpp runs after generating (src/esrgan.hpp); generate does not take one yet",
}


def _role_head(r: Any) -> Optional[Tuple[str, str]]:
    """(what the file is, how generate takes it) for a file that is no model; None for a model's file."""
    d = r.details
    if d is None:
        return None
    family = f"{r.family_name} ({r.family})" if r.family not in ("none", "unknown") else "a family not told here"
    if r.role == "lora":
        rank = f", rank {d.rank}" if d.rank is not None else ""
        what = f"a {d.kind}{' (LyCORIS)' if d.kind != 'LoRA' else ''} for {family}{rank}, {plural(d.modules or 0, 'module')}"
    elif r.role == "controlnet":
        what = f"a ControlNet for {family}"
    elif r.role == "embedding":
        what = (f"a textual-inversion embedding for {family}: {plural(d.vectors or 0, 'vector')} of {d.width} values "
                f"(the prompt tokens it stands for)")
    elif d.kind == "TAESD":
        what = f"a tiny autoencoder (TAESD) for {d.width}-channel latents" if d.width else "a tiny autoencoder (TAESD)"
        return what, ROLE_USES["taesd"]
    elif r.role == "upscaler":
        what = f"an ESRGAN upscaler (x{d.scale})"
    else:
        return None
    return what, ROLE_USES[r.role]


def inspection_text(r: Any, verbose: bool = False) -> str:
    """The report for people: family first, then size, weights, parts, what is missing. Every line
    goes through :func:`printable`: names in it were read from the file (or are its name)."""
    name = os.path.basename(r.path.rstrip("/\\")) or r.path
    role = _role_head(r)
    if role:
        head = f"{name}: {role[0]}"
    elif r.family not in ("none", "unknown"):
        head = f"{name}: {r.family_name} ({r.family}{', ' + r.variant if r.variant else ''})"
    elif r.family == "none":
        kinds = ", ".join(p.name for p in r.parts)
        head = f"{name}: no diffusion model; a {r.role.replace('_', ' ')} file ({kinds})"
    else:
        head = f"{name}: unknown family"
    lines: List[str] = [head]
    counts = (f"{plural(r.tensors, 'tensor')}, {_count(r.parameters)} parameters" if r.parameters is not None
              else "no tensor names read")  # no count is claimed for a file whose names are unknown
    lines.append(f"  file         {r.format}, {size_text(r.size_bytes)}, {counts}")
    if r.weight_types:
        total = sum(w.parameters for w in r.weight_types)
        mix = ", ".join(f"{w.dtype} {_share(w.parameters, total)}" for w in r.weight_types[:5])
        quant = f" (quantized: {r.quantization})" if r.quantization else ""
        lines.append(f"  weights      {mix}{quant}")
    for i, part in enumerate(r.parts):
        where = f"under {part.prefix!r}" if part.prefix else f"{part.layout} layout"
        label = "holds" if i == 0 else ""
        lines.append(f"  {label:<12} {COMPONENT_WORDS.get(part.component, part.component)}: {part.name} ({where}, "
                     f"{_count(part.parameters)} parameters)")
    if role:
        lines.append(f"  use          {role[1]}")
    elif r.needs:
        lines.append("  still needs")
        for c in r.needs:
            usual = f": usually {' or '.join(c.files)}" if c.files else ""
            lines.append(f"    {COMPONENT_WORDS.get(c.component, c.component)} {c.name}{usual}")
    elif r.family not in ("none", "unknown") and r.role not in ROLE_USES:
        lines.append("  still needs  nothing: the file holds every part its family uses")
    if r.fits:
        lines.append(f"  serves       {', '.join(r.fits)}")
    if verbose or r.family == "unknown":
        lines += [f"  evidence     {e}" for e in r.evidence]
    return "\n".join(printable(line) for line in lines)
