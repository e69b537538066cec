"""Headless text-to-image: load a real model in a supervised worker and write PNGs.

The model path is checked before any process starts (:func:`check_model`), so a missing or
damaged file is reported with its name and the reason, never as the bindings' opaque
"NULL pointer access". Each PNG carries the generation parameters in a ``tEXt`` chunk named
``parameters``, as image-generation tools conventionally do.
"""
from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Union

from .. import __version__, fsio
from ..events import ProgressCallback, null_progress
from ..hardware.live import LiveSystem
from .companions import AppliedLora, Companions, prepare_companions
from .config import EngineOptions
from .errors import GenerationError, InvalidRequestError, OutputPathError
from .memory import UNET_SHARE, MemoryEstimate, check, estimate
from .modelfile import check_model
from .png import parameters_text, write_png
from .protocol import DeviceInfo, GenerateRequest, GenerateResult
from .runtime import Runtime
from .supervisor import Supervisor, SupervisorPolicy

__all__ = ["generate", "GenerateReport", "output_paths", "check_outputs", "save_images", "png_parameters",
           "available_ram", "NAME_MAX"]


@dataclass
class GenerateReport:
    """What ``generate`` wrote, and how fast (seconds)."""

    model: str
    images: List[str] = field(default_factory=list)
    seeds: List[int] = field(default_factory=list)
    width: int = 0
    height: int = 0
    steps: int = 0
    sampler: str = ""
    scheduler: str = ""
    cfg_scale: float = 0.0
    device: Optional[DeviceInfo] = None
    load_seconds: Optional[float] = None
    generate_seconds: float = 0.0  # the worker's generate call (bindings included)
    library_seconds: Optional[float] = None  # stable-diffusion.cpp's own generate_image time
    step_seconds: float = 0.0
    its_per_second: float = 0.0
    total_seconds: float = 0.0
    restarts: int = 0
    loras: List[AppliedLora] = field(default_factory=list)  # the prompt's <lora:...> tags, as applied
    embeddings: List[str] = field(default_factory=list)  # textual-inversion embeddings loaded (prompt words)


def output_paths(output: Union[str, Path], count: int) -> List[Path]:
    """``count`` file names from ``output``: itself for one image; ``%d`` or ``{n}`` in it is
    replaced by 1..count; otherwise ``name-1.png``, ``name-2.png``..."""
    text = str(output)
    if "%d" in text or "{n}" in text:
        return [Path(text.replace("%d", str(i)).replace("{n}", str(i))) for i in range(1, count + 1)]
    p = Path(text)
    if p.suffix.lower() != ".png":
        raise GenerationError(f"output {p} must be a .png file", hint="name the output something.png")
    if count == 1:
        return [p]
    return [p.with_name(f"{p.stem}-{i}{p.suffix}") for i in range(1, count + 1)]


NAME_MAX = 255  # bytes of one path component on the usual file systems (ext4, APFS, NTFS in UTF-16 units)


def _output_error(path: Path, reason: str, hint: str) -> GenerationError:
    return OutputPathError(f"cannot write the image to {path}: {reason}", hint=hint)


def check_outputs(paths: List[Path]) -> List[Path]:
    """Refuse, before any work, output paths the images could not be written to: an existing
    folder or non-regular file (a FIFO would block the write), a path under a file, a name too long,
    a folder that cannot be created or written. Missing parent folders are created when writing,
    so the nearest existing ancestor must be a writable folder. Nothing is created here."""
    for path in paths:
        text = str(path)
        if "\x00" in text:
            raise _output_error(Path(text.replace("\x00", "?")), "the path contains a NUL character",
                                "choose another output path")
        for part in path.parts:
            if len(os.fsencode(part)) > NAME_MAX:
                raise _output_error(path, f"a name in it is longer than {NAME_MAX} bytes", "use a shorter file name")
        problem = fsio.output_problem(path)
        if problem is not None:
            reason, hint = problem
            if reason == "it is an existing folder":
                hint = f"name a file, such as {path / 'image.png'}"
            raise _output_error(path, reason, hint)
    return paths


def png_parameters(request: GenerateRequest, result: GenerateResult, seed: int, model: str,
                   stack: str = "stable-diffusion.cpp", companions: Optional[Companions] = None) -> str:
    extra = companions or Companions()
    return parameters_text(request.prompt, request.negative_prompt, {
        "Steps": request.steps,
        "Sampler": result.sampler or request.sampler,
        "Schedule type": result.scheduler or request.scheduler,
        "CFG scale": request.cfg_scale,
        "Seed": seed,
        "Size": f"{request.width}x{request.height}",
        "Model": Path(model).stem if Path(model).suffix else Path(model).name,
        "Version": f"accelstack {__version__} ({stack})",
        "LoRA": "; ".join(f"{lora.name}:{lora.weight:g}" for lora in extra.loras),
        "Embeddings": "; ".join(extra.embeddings),
    })


def save_images(result: GenerateResult, request: GenerateRequest, output: Union[str, Path], model: str,
                stack: str = "stable-diffusion.cpp", companions: Optional[Companions] = None) -> List[Path]:
    paths = output_paths(output, len(result.images))
    for path, img in zip(paths, result.images):
        try:
            write_png(path, img.width, img.height, img.pixels,
                      {"parameters": png_parameters(request, result, img.seed, model, stack, companions)})
        except OSError as exc:  # checked before the work, but the disk may have filled or changed since
            raise _output_error(path, exc.strerror or str(exc), "free some space or choose another output path") from None
    return paths


def available_ram() -> Optional[int]:
    """RAM available to a new allocation now (None when it cannot be told)."""
    return LiveSystem().memory()[1]


def _check_device_memory(sup: Supervisor, need: MemoryEstimate, request: GenerateRequest,
                         options: EngineOptions) -> None:
    """With the model loaded on a GPU whose free memory the worker reports, check the working
    memory against it before the job (the weights are already in place)."""
    dev = sup.last_status.device if sup.last_status is not None else None
    if not options.memory_check or not need.vram or dev is None or dev.kind == "cpu" or not dev.memory_free:
        return
    # Loaded weights already left the free memory; offloaded ones come in for sampling.
    extra = need.activations + (int(need.weights * UNET_SHARE) if options.offload_to_cpu else 0)
    check(MemoryEstimate(need.weights, need.activations, need.images, ram=0, vram=extra),
          request, options, None, vram_free=dev.memory_free)


def generate(runtime: Runtime, model: Union[str, Path], request: GenerateRequest, output: Union[str, Path],
             options: Optional[EngineOptions] = None, policy: Optional[SupervisorPolicy] = None,
             progress: ProgressCallback = null_progress, attempts: int = 2) -> GenerateReport:
    """Generate ``request`` with ``model`` on ``runtime`` and write the PNG(s) to ``output``.

    A worker crash is retried once on a fresh worker (``attempts``); a model that cannot load
    raises :class:`ModelLoadError` naming the file and the reason.
    """
    start = time.perf_counter()
    request.validate()
    options = (options or EngineOptions()).validate()
    check_outputs(output_paths(output, request.batch_count))  # bad outputs fail before the model loads
    info = check_model(model)
    runtime.check()
    if (request.lora_dir or request.embeddings_dir) and not runtime.traits.companions:
        raise InvalidRequestError(f"LoRAs and embeddings are not supported on the {runtime.traits.library} stack",
                                  hint="generate with a stable-diffusion.cpp runtime, or leave out the LoRA and "
                                  "embeddings folders")
    need = estimate(info.size_bytes, request, options, gpu=runtime.is_gpu)
    if not runtime.traits.memory_estimate:  # the estimate is stable-diffusion.cpp's; diffusers differs
        options = dataclasses.replace(options, memory_check=False)
    if options.memory_check:
        check(need, request, options, available_ram())
    # LoRAs and embeddings: resolved in their folders, staged privately and checked against the
    # model's tensors before the worker starts; the worker gets only the staged copies.
    extra = prepare_companions(request.prompt, request.lora_dir, request.embeddings_dir, info)
    try:
        options = dataclasses.replace(options, embeddings=list(extra.embedding_paths))
        sent = dataclasses.replace(request, lora_dir=extra.lora_dir, embeddings_dir="")
        with Supervisor(runtime, model=info.path, options=options, policy=policy, progress=progress,
                        model_label=Path(model).name) as sup:  # the name given (a probe's folder, not its file)
            _check_device_memory(sup, need, request, options)
            result = sup.generate(sent, attempts=attempts)
            load_seconds = result.load_seconds
    finally:
        extra.cleanup()
    paths = save_images(result, request, output, info.path, runtime.traits.library, extra)
    return GenerateReport(
        model=info.path, images=[str(p) for p in paths], seeds=[img.seed for img in result.images],
        width=request.width, height=request.height, steps=request.steps, sampler=result.sampler,
        scheduler=result.scheduler, cfg_scale=request.cfg_scale, device=result.device, load_seconds=load_seconds,
        generate_seconds=result.seconds, library_seconds=result.library_seconds, step_seconds=round(result.step_seconds, 4),
        its_per_second=round(result.its_per_second, 4), total_seconds=round(time.perf_counter() - start, 4),
        restarts=result.restarts, loras=extra.loras, embeddings=extra.embeddings)
