"""`accelstack generate`: headless text-to-image with a real model, PNGs with their parameters."""
from __future__ import annotations

import argparse
import dataclasses
from typing import Optional, Tuple

from .. import core
from ..core import direct
from ..core.direct import SAMPLERS, SCHEDULERS, GenerateRequest
from ..serde import plural, to_dict
from ..settings import Settings
from .common import emit, settings_from_args
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

__all__ = ["register", "prepare", "run"]


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
        "PNG name the LoRAs applied and the embeddings loaded.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_runtime_arguments(p)
    p.add_argument("--model", "-m", required=True, metavar="PATH", help="model file or diffusers folder")
    p.add_argument("--prompt", "-p", required=True, help="the text; <lora:NAME:WEIGHT> applies a LoRA of --lora-dir")
    p.add_argument("--negative-prompt", "-n", default="")
    p.add_argument("--width", "-W", type=int, default=512, help="multiple of 8 (default 512)")
    p.add_argument("--height", "-H", type=int, default=512, help="multiple of 8 (default 512)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--cfg-scale", type=float, default=7.0)
    p.add_argument("--sampler", default="default", metavar="NAME", help="one of: " + ", ".join(SAMPLERS))
    p.add_argument("--scheduler", default="default", metavar="NAME", help="one of: " + ", ".join(SCHEDULERS))
    p.add_argument("--seed", type=int, default=42, help="-1 for a random seed (default 42)")
    p.add_argument("--batch-count", "-b", type=int, default=1)
    p.add_argument("--output", "-o", default="output.png",
                   help="PNG path; with several images, %%d or {n} is the number, else name-1.png, name-2.png...")
    p.add_argument("--lora-dir", default="", metavar="DIR",
                   help="folder the prompt's <lora:NAME:WEIGHT> tags are looked up in (NAME.safetensors, .gguf or .pt)")
    p.add_argument("--embeddings-dir", default="", metavar="DIR",
                   help="folder of textual-inversion embeddings, each used in the prompt by its file name")
    add_engine_arguments(p)
    p.set_defaults(func=run)


def prepare(args: argparse.Namespace, settings: Optional[Settings] = None) -> Tuple[GenerateRequest, direct.EngineOptions]:
    """The request and engine options from the arguments, every value checked, the output paths
    and the model file too: all that can be refused is refused here, before any work starts."""
    request = GenerateRequest(prompt=args.prompt, negative_prompt=args.negative_prompt, width=args.width,
                              height=args.height, steps=args.steps, cfg_scale=args.cfg_scale, sampler=args.sampler,
                              scheduler=args.scheduler, seed=args.seed, batch_count=args.batch_count,
                              lora_dir=args.lora_dir, embeddings_dir=args.embeddings_dir).validate()
    options = engine_options(args, settings)
    direct.check_outputs(direct.output_paths(args.output, request.batch_count))
    check_given_dirs(args, "--runtime")
    direct.check_model(args.model)  # a missing or damaged model is reported before anything else starts
    return request, options


def run(args: argparse.Namespace) -> int:
    s = settings_from_args(args)
    request, options = prepare(args, s)
    with progress_renderer(json_mode=args.json) as progress:
        if args.runtime or core.stack_for_backend(args.backend) is not None:  # a runtime given by hand: the engine alone
            runtime = runtime_from_args(args)  # a torch one's engine packages checked, with the pip command adding them
            report = direct.generate(runtime, args.model, request, args.output, options=options, progress=progress)
        else:  # the installed runtime, through the core
            wanted = {k: v for k, v in dataclasses.asdict(request).items() if k != "prompt"}
            with no_runtime_says_what_to_do():
                report = core.generate(args.model, args.prompt, args.output, settings=s,
                                       options=options, on_progress=progress, **wanted)
    dev = report.device
    noise = f"  ({PROBE_NOISE})" if direct.is_probe_model(args.model) else ""
    lines = [f"wrote {len(report.images)} image{'s' if len(report.images) != 1 else ''}: " + ", ".join(report.images) + noise,
             f"  {report.width}x{report.height}, {report.steps} steps, {report.sampler}/{report.scheduler}, "
             f"cfg {report.cfg_scale:g}, seed{'s' if len(report.seeds) > 1 else ''} {', '.join(map(str, report.seeds))}",
             f"  device {dev.name if dev else '?'}{' — ' + dev.description if dev and dev.description else ''}; "
             f"load {report.load_seconds or 0:.2f} s, {report.step_seconds:.2f} s/step ({report.its_per_second:.2f} it/s), "
             f"total {report.total_seconds:.2f} s"]
    if report.loras or report.embeddings:
        lines.append("  " + "; ".join(filter(None, [
            "LoRA " + ", ".join(f"{x.name} {x.weight:g}" for x in report.loras) if report.loras else "",
            "embeddings " + ", ".join(report.embeddings) if report.embeddings else ""])))
    if report.restarts:
        lines.append(f"  (the worker was restarted {plural(report.restarts, 'time')} along the way)")
    data = to_dict(report)
    if noise:
        data["probe_model"] = True  # the image is noise by design
    emit(args, data, "\n".join(lines))
    return 0

