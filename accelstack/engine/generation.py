"""Headless text-to-image: load a real model in a supervised worker and write PNGs.

The model path is checked before any process starts (:func:`check_model`), so a missing or
damaged file is reported with its name and the reason, never as the bindings' opaque
"NULL pointer access". Each PNG carries the generation parameters in a ``tEXt`` chunk named
``parameters``, as image-generation tools conventionally do.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Union

from .. import __version__
from ..events import ProgressCallback, null_progress
from .config import EngineOptions
from .memory.device import MachineMemory
from .memory.estimate import MemoryEstimate, check, estimate
from .memory.plan import MemoryPlan, plan_for_files
from .png import parameters_text, write_png
from .request.check import CheckedGeneration, check_generation
from .request.companions import AppliedLora, Companions, prepare_companions
from .request.components import CheckedComponents
from .request.identity import IDENTITY_KIND, file_identity
from .request.outputs import NAME_MAX, check_outputs, output_error, output_paths
from .runtime import Runtime
from .supervision import workdirs
from .supervision.supervisor import Supervisor, SupervisorPolicy
from .worker.protocol import PATH_FIELDS, DeviceInfo, GenerateRequest, GenerateResult

__all__ = ["generate", "generate_checked", "GenerateReport", "Prepared", "prepare", "run_prepared", "output_paths", "check_outputs", "save_images", "png_parameters", "wire_images",
           "NAME_MAX"]


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
    guidance: Optional[float] = None  # distilled guidance (Flux), None where the family has none and none was given
    flow_shift: Optional[float] = None
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
    memory: Optional[MemoryPlan] = None  # the memory planner's estimate and choices (None: not estimated, torch)
    # Component files given on their own, by request field ("vae": "vae-ft-mse.safetensors"): names only.
    components: Dict[str, str] = field(default_factory=dict)
    init_image: str = ""  # img2img: the init image's file name, with the denoising strength
    strength: Optional[float] = None
    control_image: str = ""  # ControlNet (components["control_net"]): the control image's name, its strength
    control_strength: Optional[float] = None
    warnings: List[str] = field(default_factory=list)  # what the run lacked but did without (a companion the family needs)
    # a session's worker already had this model loaded with these load-time settings (issue 46): no load
    reused_worker: bool = False


def png_parameters(request: GenerateRequest, result: GenerateResult, seed: int, model: str,
                   stack: str = "stable-diffusion.cpp", companions: Optional[Companions] = None,
                   components: Optional[CheckedComponents] = None) -> str:
    extra = companions or Companions()
    names = components.names() if components is not None else {}
    img2img = components is not None and bool(components.init_rgb)
    control = components is not None and bool(components.control_rgb)
    return parameters_text(request.prompt, request.negative_prompt, {
        "Steps": request.steps,
        "Sampler": result.sampler or request.sampler,
        "Schedule type": result.scheduler or request.scheduler,
        "CFG scale": request.cfg_scale,
        "Guidance": f"{request.guidance:g}" if request.guidance is not None else "",  # distilled (Flux), as used
        "Flow shift": f"{request.flow_shift:g}" if request.flow_shift is not None else "",
        "Clip skip": request.clip_skip if request.clip_skip > 0 else "",
        "Seed": seed,
        "Size": f"{request.width}x{request.height}",
        "Model": Path(model).stem if Path(model).suffix else Path(model).name,
        "Version": f"accelstack {__version__} ({stack})",
        "Runtime": result.extra.get("runtime", ""),  # the library's own version and commit, as the worker loaded it
        **_hashes(model, components),
        "LoRA": "; ".join(f"{lora.name}:{lora.weight:g}" for lora in extra.loras),
        "LoRA applied": "; ".join(lora.summary() for lora in extra.loras),  # as stable-diffusion.cpp counts them
        "Embeddings": "; ".join(extra.embeddings),
        # A1111's names where it has one ("Denoising strength", "VAE"); file names only, never paths.
        "Denoising strength": f"{request.strength:g}" if img2img else "",
        "VAE": names.get("vae", ""),
        "Text encoders": "; ".join(names[k] for k in ("clip_l", "clip_g", "t5xxl", "llm") if k in names),
        "TAESD": names.get("taesd", ""),
        "ControlNet": f"{names.get('control_net', '')} {request.control_strength:g}" if control else "",
        "Mask": _given_name(request.mask_image) if components is not None and components.mask_rgb else "",
        "Reference images": "; ".join(map(_given_name, request.ref_images)) if components is not None else "",
    })


def _hashes(model: str, components: Optional[CheckedComponents]) -> Dict[str, str]:
    """Which files made the image: a cheap identity of each (engine.request.identity: sha256 of the size and
    the first and last MiB, not a full sha256, which takes minutes on the large files)."""
    own = file_identity(model)
    parts = {name: file_identity(path) for name, path in (components.paths if components is not None else {}).items()}
    return {"Model hash": f"{own} ({IDENTITY_KIND})" if own else "",
            "Hashes": "; ".join(f"{name}: {value}" for name, value in parts.items() if value and name != "diffusion_model")}


def save_images(result: GenerateResult, request: GenerateRequest, output: Union[str, Path], model: str,
                stack: str = "stable-diffusion.cpp", companions: Optional[Companions] = None,
                components: Optional[CheckedComponents] = None) -> List[Path]:
    paths = output_paths(output, len(result.images))
    for path, img in zip(paths, result.images):
        try:
            write_png(path, img.width, img.height, img.pixels,
                      {"parameters": png_parameters(request, result, img.seed, model, stack, companions, components)})
        except OSError as exc:  # checked before the work, but the disk may have filled or changed since
            raise output_error(path, exc.strerror or str(exc), "free some space or choose another output path") from None
    return paths


def _check_device_memory(sup: Supervisor, need: MemoryEstimate, request: GenerateRequest,
                         options: EngineOptions) -> None:
    """With the model loaded on a GPU whose free memory the worker reports, check the working
    memory against it before the job (the weights are already in place)."""
    dev = sup.last_status.device if sup.last_status is not None else None
    if not options.memory_check or not need.vram or dev is None or dev.kind == "cpu" or not dev.memory_free:
        return
    # Loaded weights already left the free memory; the working memory (and offloaded weights) come in.
    extra = need.vram - need.loaded
    check(MemoryEstimate(need.weights, need.activations, need.images, ram=0, vram=extra),
          request, options, None, vram_free=dev.memory_free)


def generate(runtime: Runtime, model: Optional[Union[str, Path]], request: GenerateRequest, output: Union[str, Path],
             options: Optional[EngineOptions] = None, policy: Optional[SupervisorPolicy] = None,
             progress: ProgressCallback = null_progress, attempts: int = 2,
             worker: Optional[Supervisor] = None, machine: Optional[MachineMemory] = None) -> GenerateReport:
    """Generate ``request`` with ``model`` on ``runtime`` and write the PNG(s) to ``output``: the one
    check (:func:`~accelstack.engine.request.check.check_generation`), then :func:`generate_checked`.

    A worker crash is retried once on a fresh worker (``attempts``); a model that cannot load
    raises :class:`ModelLoadError` naming the file and the reason. ``model`` may be None when the
    request names a diffusion model of its own (``request.diffusion_model``). ``worker``: one that
    :func:`~accelstack.engine.supervision.supervisor.early_worker` started for ``runtime`` (its ``policy`` is
    used); it is stopped when this returns or raises, whatever happened. ``machine``: the RAM and GPUs
    the memory planner fits the generation to, read by the caller (the core) from its ``System``;
    None: unknown (nothing refused for RAM, weights offloaded on a GPU).
    """
    try:
        checked = check_generation(request, model, output, options, traits=runtime.traits)
    except BaseException:
        if worker is not None:
            worker.let_go()
        raise
    return generate_checked(runtime, checked, policy=policy, progress=progress, attempts=attempts, worker=worker,
                            machine=machine)


def generate_checked(runtime: Runtime, checked: CheckedGeneration, *, policy: Optional[SupervisorPolicy] = None,
                     progress: ProgressCallback = null_progress, attempts: int = 2, worker: Optional[Supervisor] = None,
                     machine: Optional[MachineMemory] = None) -> GenerateReport:
    """Run a request :func:`~accelstack.engine.request.check.check_generation` checked for ``runtime``'s
    stack, without checking it again (see :func:`generate` for the rest)."""
    try:
        if worker is not None and worker.runtime != runtime:  # another directory, backend or environment
            raise ValueError("the early worker was started for another runtime")
        if checked.traits != runtime.traits:
            raise ValueError(f"the request was checked for the {checked.traits.library} stack, not {runtime.traits.library}")
        return _generate(runtime, checked, policy, progress, attempts, worker, machine or MachineMemory())
    finally:
        if worker is not None:
            worker.let_go()  # stopped unless it already is (or was asked to exit)


@dataclass
class Prepared:
    """A checked job made ready for a worker: its files, the load-time options the memory planner
    resolved (component files and staged embeddings included), its LoRAs and embeddings staged."""

    checked: CheckedComponents
    options: EngineOptions
    need: MemoryEstimate
    memory_plan: Optional[MemoryPlan]
    extra: Companions
    label: str


def prepare(runtime: Runtime, job: CheckedGeneration, machine: MachineMemory) -> Prepared:
    """Everything before a worker: the files read, the memory planned, LoRAs and embeddings staged (the
    caller removes them: ``extra.cleanup()``)."""
    request, options, model = job.read_files().request, job.options, job.model  # its values resolved (family defaults)
    # The model or diffusion model, each component file (--vae, --clip-l..., --control-net) and image
    # (--init-image, --control-image), checked against the model's family by the one check.
    checked = job.files()
    info = checked.model
    runtime.check()
    options = dataclasses.replace(options, vae_encode=bool(checked.init_rgb or checked.ref_rgb))  # img2img loads the VAE's encoder
    memory_plan: Optional[MemoryPlan] = None
    if runtime.traits.memory_estimate:  # the planner (engine.memory.plan) resolves every "auto" so that it fits
        memory_plan = plan_for_files([info.path, *checked.paths.values()],
                                     request.width, request.height, request.batch_count, options, gpu=runtime.is_gpu,
                                     ram_free=machine.ram_available, vram_free=machine.vram_free(runtime.backend))
        options, need = memory_plan.apply(options), memory_plan.estimate()
    else:  # the estimate is stable-diffusion.cpp's; diffusers differs: "auto" is the old default there
        options = dataclasses.replace(options.concrete(), memory_check=False)
        need = estimate(info.size_bytes, request, options, gpu=runtime.is_gpu)
    if checked.family == "chroma" and options.flash_attention:  # see EngineOptions.chroma_dit_mask
        options = dataclasses.replace(options, chroma_dit_mask=False)
    # LoRAs and embeddings: resolved in their folders, staged privately and checked against the
    # model's tensors before the worker starts; the worker gets only the staged copies.
    extra = prepare_companions(request.prompt, request.lora_dir, request.embeddings_dir, info, encoders=checked.paths,
                               weight_type=options.weight_type)  # quantized: LoRAs apply at run time (lora_check)
    files: Dict[str, Any] = dict(checked.paths)
    options = dataclasses.replace(options, embeddings=list(extra.embedding_paths), **files)
    label = Path(model).name if model else Path(info.path).name  # the name given (a probe's folder, not its file)
    return Prepared(checked, options, need, memory_plan, extra, label)


def run_prepared(runtime: Runtime, job: CheckedGeneration, prep: Prepared, sup: Supervisor, *, attempts: int,
                 keep: bool = False, start: Optional[float] = None) -> GenerateReport:
    """Run a prepared job on ``sup`` (started here if it is not running) and write its PNGs. ``keep``: the
    worker stays loaded for the next job (a session's); else it is asked to exit as soon as the images are
    back, so that it frees the model's memory while they are written."""
    start = time.perf_counter() if start is None else start
    request, checked = job.request, prep.checked
    with wire_images(request, checked) as wired:
        sup.start()
        sent = dataclasses.replace(request, lora_dir=prep.extra.lora_dir, embeddings_dir="", **wired)
        _check_device_memory(sup, prep.need, request, prep.options)
        result = sup.generate(sent, attempts=attempts)
        if not keep:
            sup.stop(wait=False)
    paths = save_images(result, request, job.output, checked.model.path, runtime.traits.library, prep.extra, checked)
    return GenerateReport(
        model=checked.model.path, images=[str(p) for p in paths], seeds=[img.seed for img in result.images],
        width=request.width, height=request.height, steps=request.steps, sampler=result.sampler,
        scheduler=result.scheduler, cfg_scale=request.cfg_scale, guidance=request.guidance,
        flow_shift=request.flow_shift, device=result.device, load_seconds=result.load_seconds,
        generate_seconds=result.seconds, library_seconds=result.library_seconds, step_seconds=round(result.step_seconds, 4),
        its_per_second=round(result.its_per_second, 4), total_seconds=round(time.perf_counter() - start, 4),
        restarts=result.restarts, warnings=list(job.warnings) + [w for w in (result.extra.get("decode_retry"),) if w], loras=prep.extra.loras, embeddings=prep.extra.embeddings, components=checked.names(),
        memory=prep.memory_plan, **_image_report(request, checked))


def _generate(runtime: Runtime, job: CheckedGeneration, policy: Optional[SupervisorPolicy], progress: ProgressCallback,
              attempts: int, worker: Optional[Supervisor], machine: MachineMemory) -> GenerateReport:
    start = time.perf_counter()
    prep = prepare(runtime, job, machine)
    sup: Optional[Supervisor] = None
    try:
        if worker is not None:
            sup = worker
            sup.progress = progress
            sup.configure(prep.checked.model.path, prep.options, model_label=prep.label)
        else:
            sup = Supervisor(runtime, model=prep.checked.model.path, options=prep.options, policy=policy,
                             progress=progress, model_label=prep.label)
        return run_prepared(runtime, job, prep, sup, attempts=attempts, start=start)
    finally:
        if sup is not None:
            sup.let_go()  # one that was asked is not waited for (POSIX); any other is stopped here
        prep.extra.cleanup()


@contextmanager
def wire_images(request: GenerateRequest, checked: CheckedComponents) -> Iterator[Dict[str, Any]]:
    """The request's image and component fields as the worker gets them: the components travel in
    the engine options, and the images' RGB bytes in files of a private folder of the run (mode 0700,
    marked: a killed run's goes with the stale-folder cleanup), removed when the block ends. Not in the
    request's body: the worker reads at most 256 KiB of one (limits.WORKER_MAX_BODY_BYTES)."""
    fields: Dict[str, Any] = {name: "" for name in PATH_FIELDS}
    fields["control_net"] = checked.paths.get("control_net", "")  # validate(): a control image needs it
    folder: Optional[Path] = None
    try:
        fields["ref_images"], fields["ref_pixels"] = [], []
        refs = [(f"ref_pixels-{i}", rgb) for i, rgb in enumerate(checked.ref_rgb)]  # --ref-image: engine.request.images
        for name, rgb in (("init_pixels", checked.init_rgb), ("control_pixels", checked.control_rgb),
                          ("mask_pixels", checked.mask_rgb), *refs):
            if rgb:
                folder = folder or workdirs.make()
                target = folder / f"{name}.rgb"
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o600)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(rgb)
                if name.startswith("ref_pixels-"):
                    fields["ref_pixels"].append(str(target))
                else:
                    fields[name] = str(target)
        yield fields
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def _image_report(request: GenerateRequest, checked: CheckedComponents) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    if checked.init_rgb:
        out.update(init_image=_given_name(request.init_image), strength=request.strength)
    if checked.control_rgb:
        out.update(control_image=_given_name(request.control_image), control_strength=request.control_strength)
    return out


def _given_name(path: str) -> str:
    return os.path.basename(path) if path else "(pixels)"
