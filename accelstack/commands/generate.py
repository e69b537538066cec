"""`accelstack generate`: headless text-to-image with a real model, PNGs with their parameters."""
from __future__ import annotations

import argparse
import os
from typing import Optional, Tuple, Union

from .. import core
from ..core import direct
from ..core.direct import SAMPLERS, SCHEDULERS, GenerateRequest
from ..core.direct import protocol as _protocol
from ..errors import AccelstackError
from ..serde import plural, to_dict
from ..settings import Settings
from .common import emit, printable, settings_from_args
from .generate_dry_run import add_dry_run_flags, dry_run
from .progress import progress_renderer
from .verify import (
    PROBE_NOISE,
    add_engine_arguments,
    add_runtime_arguments,
    check_given_dirs,
    engine_options,
    no_runtime_says_what_to_do,
    runtime_from_args,
)

__all__ = ["register", "build_request", "prepare", "run"]

# The request fields the component, img2img and ControlNet flags fill (argparse names them alike).
COMPONENT_FIELDS = tuple(_protocol.COMPONENT_FLAGS) + _protocol.IMAGE_FIELDS + ("strength", "control_strength")
DEFAULT_STRENGTH, DEFAULT_CONTROL_STRENGTH = _protocol.DEFAULT_STRENGTH, _protocol.DEFAULT_CONTROL_STRENGTH
MAX_CONTROL_STRENGTH = _protocol.MAX_CONTROL_STRENGTH
flag_of = _protocol.flag_of


DEFAULT_SIDE = 512  # the size of SD 1.x's training images, and a size every family takes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="generate images from a prompt with a model file (headless)",
        description="Load a model (.safetensors, .gguf, .ckpt, or a diffusers folder) in a supervised worker on "
        "the runtime and generate; each PNG carries the generation parameters in a 'parameters' text chunk.",
        epilog="examples:\n"
        "  accelstack generate --runtime ~/rt/cpu -m sd15.safetensors -p 'a lighthouse at dusk' -o out.png\n"
        "  accelstack generate --runtime ~/rt/cuda --backend cuda -m model.gguf -p cat -W 768 -H 512 "
        "--steps 25 --sampler dpm++2m --scheduler karras -b 4 -o 'cat-%d.png'\n"
        "  accelstack generate -m sd15.safetensors --lora-dir ~/loras --embeddings-dir ~/embeddings \\\n"
        "      -p 'a lighthouse <lora:watercolor:0.8>, glowstyle' -o out.png\n\n"
        "LoRA: <lora:NAME:WEIGHT> in the prompt applies NAME.safetensors (or .gguf or .pt; NAME may be the whole file name) from\n"
        "--lora-dir; NAME is a plain file name (no folders, no leading dot), WEIGHT a number from -10 to 10\n"
        "(about 1 is full strength, 0 changes nothing). Embeddings: every .safetensors/.gguf/.pt/.bin file of\n"
        "--embeddings-dir is loaded and its file name (glowstyle.safetensors -> glowstyle) used in the prompt\n"
        "brings its vectors in. Both are checked against the model before it loads; the result and each\n"
        "PNG name the LoRAs applied and the embeddings loaded.\n\n"
        "Components: --diffusion-model (instead of --model) with --vae, --clip-l, --clip-g, --t5xxl, --llm as the\n"
        "family needs (Flux: --vae ae.safetensors --clip-l clip_l.safetensors --t5xxl t5xxl_fp16.safetensors);\n"
        "with --model, a --vae or text encoder replaces the checkpoint's own. Each file is checked against the\n"
        "model's family first (`accelstack model inspect` shows what a file is and what it needs).\n"
        "img2img: --init-image PNG --strength 0.75 (the size is the PNG's; a --width/--height given must match).\n"
        "ControlNet (SD 1.x, 2.x; an SDXL one aborts stable-diffusion.cpp 0.4.7 and is refused): --control-net PATH "
        "--control-image PNG [--control-strength 0.9].",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_runtime_arguments(p)
    p.add_argument("--model", "-m", default="", metavar="PATH",
                   help="model file or diffusers folder (or give --diffusion-model and its components instead)")
    p.add_argument("--prompt", "-p", required=True, help="the text; <lora:NAME:WEIGHT> applies a LoRA of --lora-dir")
    p.add_argument("--negative-prompt", "-n", default="")
    p.add_argument("--width", "-W", type=int, default=None, help="multiple of 8, of 64 for SD 1.x/2.x/XL (default 512, or the --init-image's or --control-image's)")
    p.add_argument("--height", "-H", type=int, default=None, help="multiple of 8, of 64 for SD 1.x/2.x/XL (default 512, or the --init-image's or --control-image's)")
    _add_family_flags(p)
    p.add_argument("--seed", type=int, default=42, help="-1 for a random seed (default 42)")
    p.add_argument("--batch-count", "-b", type=int, default=1)
    p.add_argument("--output", "-o", default=None,
                   help="PNG path; with several images, %%d or {n} is the number, else name-1.png, name-2.png... "
                   "(default: output.png, or output-2.png, output-3.png... when that exists: no file is overwritten)")
    p.add_argument("--lora-dir", default="", metavar="DIR",
                   help="folder the prompt's <lora:NAME:WEIGHT> tags are looked up in (NAME.safetensors, .gguf or .pt)")
    p.add_argument("--embeddings-dir", default="", metavar="DIR",
                   help="folder of textual-inversion embeddings, each used in the prompt by its file name")
    g = p.add_argument_group("components, img2img and ControlNet")
    g.add_argument("--diffusion-model", default="", metavar="PATH",
                   help="the diffusion model (UNet/transformer) alone, instead of --model (Flux, SD3, Z-Image...)")
    g.add_argument("--vae", default="", metavar="PATH", help="a VAE file (replaces the checkpoint's own)")
    g.add_argument("--clip-l", default="", metavar="PATH", help="CLIP-L text encoder (SD 1.x/XL/3.x, Flux)")
    g.add_argument("--clip-g", default="", metavar="PATH", help="CLIP-G text encoder (SDXL, SD 3.x)")
    g.add_argument("--t5xxl", default="", metavar="PATH", help="T5-XXL text encoder (SD 3.x, Flux, Chroma)")
    g.add_argument("--llm", default="", metavar="PATH",
                   help="LLM text encoder (Qwen3 4B for Z-Image and FLUX.2 klein, Qwen2.5-VL 7B for Qwen-Image, "
                   "Mistral Small 3.2 for FLUX.2 dev)")
    g.add_argument("--taesd", default="", metavar="PATH", help="tiny autoencoder: a fast, rougher decode")
    g.add_argument("--init-image", default="", metavar="PNG",
                   help="img2img: start from this PNG (its size must be --width x --height; nothing is resized)")
    g.add_argument("--strength", type=float, default=DEFAULT_STRENGTH,
                   help=f"img2img: how much of the init image is redrawn, 0 to 1 (default {DEFAULT_STRENGTH:g})")
    g.add_argument("--control-net", default="", metavar="PATH",
                   help="a ControlNet for the model's family (SD 1.x or 2.x); needs --control-image")
    g.add_argument("--control-image", default="", metavar="PNG",
                   help="the control image (an edge map, pose, depth map) of --width x --height")
    g.add_argument("--control-strength", type=float, default=DEFAULT_CONTROL_STRENGTH,
                   help=f"ControlNet strength, 0 to {MAX_CONTROL_STRENGTH:g} (default {DEFAULT_CONTROL_STRENGTH:g})")
    _add_edit_flags(g)
    add_engine_arguments(p)
    add_dry_run_flags(p)  # issue 45: --dry-run, --vram, --ram, --replay
    p.set_defaults(func=run)


def _add_family_flags(p: argparse.ArgumentParser) -> None:
    """Sampling values; each one left out is the model family's reference value (engine/data/family_settings.json)."""
    p.add_argument("--steps", type=int, default=None, help="sampling steps (default: the model family's, else 20)")
    p.add_argument("--cfg-scale", type=float, default=None,
                   help="classifier-free guidance (default: the model family's: 1 for Flux, 4.5 for SD 3.x, else 7)")
    p.add_argument("--guidance", type=float, default=None,
                   help="distilled guidance of guidance-distilled models (default: the family's: 3.5 for FLUX.1)")
    p.add_argument("--flow-shift", type=float, default=None,
                   help="timestep shift of flow models (default: the family's: 3 for Qwen-Image, else the runtime's)")
    p.add_argument("--clip-skip", type=int, default=-1,
                   help="text-encoder layers to skip from the end (-1: the model's default; 2 for many SD 1.x anime models)")
    p.add_argument("--sampler", default="default", metavar="NAME",
                   help="one of: " + ", ".join(SAMPLERS) + " (default: the family's, else the runtime's)")
    p.add_argument("--scheduler", default="default", metavar="NAME", help="one of: " + ", ".join(SCHEDULERS))


def _add_edit_flags(g: argparse._ArgumentGroup) -> None:
    """Inpainting and edits (engine.request.images checks them against the model's family)."""
    g.add_argument("--mask", dest="mask_image", default="", metavar="PNG",
                   help="inpainting: white where the --init-image is redrawn (its size)")
    g.add_argument("--ref-image", dest="ref_images", action="append", default=[], metavar="PNG",
                   help="a reference image for an edit model (FLUX.1 Kontext, Qwen-Image-Edit, FLUX.2), of the "
                   "request's size; repeatable")


def image_size(args: argparse.Namespace) -> Tuple[int, int]:
    """The size asked for: --width/--height, else the --init-image's (img2img redraws that picture;
    nothing is resized) or the --control-image's (the image the ControlNet follows), else 512. An
    unreadable image is reported by the component check."""
    image = args.init_image or args.control_image or (args.ref_images[0] if args.ref_images else "")
    size = direct.input_png_size(image) if image and (args.width is None or args.height is None) else None
    default = size or (DEFAULT_SIDE, DEFAULT_SIDE)
    return (args.width if args.width is not None else default[0], args.height if args.height is not None else default[1])


def build_request(args: argparse.Namespace) -> GenerateRequest:
    """The typed request the arguments describe (checked by :func:`direct.check_generation`)."""
    width, height = image_size(args)
    given = {name: getattr(args, name) for name in ("steps", "cfg_scale") if getattr(args, name) is not None}
    return GenerateRequest(prompt=args.prompt, negative_prompt=args.negative_prompt, width=width,
                           height=height, sampler=args.sampler, guidance=args.guidance, flow_shift=args.flow_shift,
                           clip_skip=args.clip_skip, scheduler=args.scheduler, seed=args.seed, batch_count=args.batch_count,
                           lora_dir=args.lora_dir, embeddings_dir=args.embeddings_dir, ref_images=list(args.ref_images), **given,
                           **{name: getattr(args, name) for name in COMPONENT_FIELDS})


DEFAULT_OUTPUT = "output"  # the name's stem when no -o is given


def free_output(count: int, folder: str = ".") -> str:
    """The output when no -o is given: output.png (output-1.png... for a batch), else the first of
    output-2, output-3... whose files are all absent: an image the user did not name never replaces a file."""
    n = 1
    while True:
        name = os.path.join(folder, DEFAULT_OUTPUT + (f"-{n}" if n > 1 else "") + ".png")
        if not any(os.path.lexists(p) for p in direct.output_paths(name, count)):
            return os.path.relpath(name) if folder == "." else name
        n += 1


def prepare(args: argparse.Namespace, settings: Optional[Settings] = None, *,
            components: bool = True) -> Tuple[GenerateRequest, direct.EngineOptions]:
    """The request and engine options from the arguments, through the one check that `run` makes:
    every value, the output paths and (``components``) the model's and component files' headers.
    Without -o, ``args.output`` becomes a free name (:func:`free_output`)."""
    checked = _check(args, settings, None, read_files=components)
    return checked.request, checked.options


def _check(args: argparse.Namespace, settings: Optional[Settings], runtime: Optional[direct.Runtime], *,
           read_files: bool) -> direct.CheckedGeneration:
    request, options = _request(args, settings)
    return direct.check_generation(request, args.model or None, args.output, options, runtime=runtime,
                                   read_files=read_files)


def _runtime_at_hand(args: argparse.Namespace, settings: Settings) -> Optional[direct.Runtime]:
    """The runtime the command will use when it can be had now and checks out; None otherwise (no
    runtime, a broken one: the error comes where it always did, after the model's checks)."""
    try:
        return _runtime(args, settings).check()
    except AccelstackError:
        return None


def _runtime(args: argparse.Namespace, settings: Settings) -> direct.Runtime:
    """The runtime named by --runtime/--backend, else the installed one (its errors say what to do)."""
    if args.runtime or core.stack_for_backend(args.backend) is not None:  # a runtime given by hand
        return runtime_from_args(args)  # a torch one's packages checked
    with no_runtime_says_what_to_do():
        return core.installed_runtime(settings=settings)


def run(args: argparse.Namespace) -> int:
    s = settings_from_args(args)
    if args.dry_run or args.vram is not None or args.ram is not None or args.replay:
        return _dry_run(args, s)
    request, options = _request(args, s)  # what the arguments themselves get wrong first, before any process starts
    at_hand, later = _runtimes(args, s)
    with progress_renderer(json_mode=args.json) as progress:  # then down once: the core checks, starts, generates
        done = direct.run_generation(request, args.model or None, args.output, options, runtime=at_hand, later=later,
                                     progress=progress)
    return _report(args, done)


def _runtimes(args: argparse.Namespace, s: Settings) -> Tuple[Optional[direct.Runtime], Union[direct.Runtime, AccelstackError]]:
    """The runtime at hand now (checked; None: none), and what stands in for it once the files are checked:
    the runtime found but not checked (its error comes where it always did), or why none was found."""
    try:
        found = _runtime(args, s)
    except AccelstackError as exc:
        return None, exc
    try:
        return found.check(), found
    except AccelstackError:
        return None, found


def _request(args: argparse.Namespace, s: Optional[Settings]) -> Tuple[GenerateRequest, direct.EngineOptions]:
    """The request and engine options the arguments describe, -o chosen when not given (checked by the core)."""
    options = engine_options(args, s)
    if args.output is None:
        args.output, args.output_chosen = free_output(max(1, args.batch_count or 1)), True
    check_given_dirs(args, "--runtime")
    return build_request(args), options


def _dry_run(args: argparse.Namespace, s: Settings) -> int:
    """--dry-run (--vram/--ram/--replay imply it): the planner's decision; no worker, nothing written."""
    request, options = _request(args, s)
    return dry_run(args, s, request, options, lambda: _runtime_at_hand(args, s))


def _report(args: argparse.Namespace, done: direct.Generated) -> int:
    """The result: one JSON object with --json, else what was written and how fast."""
    report = done.report
    dev = report.device
    noise = f"  ({PROBE_NOISE})" if done.probe_model else ""
    chosen = getattr(args, "output_chosen", False) and args.output != DEFAULT_OUTPUT + ".png"
    kept = "  (a free name: the files already there were kept; -o names the file)" if chosen else ""
    lines = [f"wrote {len(report.images)} image{'s' if len(report.images) != 1 else ''}: " + ", ".join(report.images) + noise + kept,
             f"  {report.width}x{report.height}, {report.steps} steps, {report.sampler}/{report.scheduler}, "
             f"cfg {report.cfg_scale:g}{f', guidance {report.guidance:g}' if report.guidance is not None else ''}, seed{'s' if len(report.seeds) > 1 else ''} {', '.join(map(str, report.seeds))}",
             f"  device {dev.name if dev else '?'}{' — ' + dev.description if dev and dev.description else ''}; "
             f"load {report.load_seconds or 0:.2f} s, {report.step_seconds:.2f} s/step ({report.its_per_second:.2f} it/s), "
             f"total {report.total_seconds:.2f} s"]
    if report.loras or report.embeddings:
        lines.append("  " + "; ".join(filter(None, [
            "LoRA " + ", ".join(x.summary() for x in report.loras) if report.loras else "",
            "embeddings " + ", ".join(report.embeddings) if report.embeddings else ""])))
    used = [f"{flag_of(k)} {v}" for k, v in report.components.items()]
    if report.init_image:
        used.append(f"init image {report.init_image} (strength {report.strength:g})")
    if report.control_image:
        used.append(f"control image {report.control_image} (strength {report.control_strength:g})")
    if used:
        lines.append("  " + "; ".join(used))
    lines += [f"  warning: {w}" for w in report.warnings]  # a companion the family needs, left out (named)
    if report.memory is not None and report.memory.changed:  # the planner gave up speed to fit: say why
        lines.append(f"  memory: {report.memory.reason}")
    lines += [f"  warning: {lora.warning}" for lora in report.loras if lora.warning]  # partly applied (issue 44)
    if report.restarts:
        lines.append(f"  (the worker was restarted {plural(report.restarts, 'time')} along the way)")
    data = to_dict(report)
    if noise:
        data["probe_model"] = True  # the image is noise by design
    emit(args, data, "\n".join(printable(line) for line in lines))  # paths and names are the user's (issue 47)
    return 0

