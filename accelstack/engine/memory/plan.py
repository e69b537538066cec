"""Choose the engine's ``auto`` options so that a generation fits this machine's memory.

"Out of memory" is the most common failure after "wrong build": stable-diffusion.cpp allocates
what a request needs and is killed by the OS (or by the GPU driver) after minutes of loading. The
planner estimates, before the worker starts, the peak memory of each phase of a generation (text
encoders, diffusion, VAE decode) from what the model files' headers say (:func:`inspect_model`:
family, parameters per component, weight types; the file size when they cannot be read) and the
requested size, and picks for every option left ``auto`` the cheapest setting that fits:

offload, the text encoders on the CPU, VAE tiling (the largest tile that fits), the VAE on the CPU,
a ``max_vram`` budget for offloaded weights, and last the weights converted on load (q8_0, then q4_k):
the order and the phase placement are :mod:`.levers`' (issue 45).

An option given a value (config.yaml or a flag) is kept as given. When nothing fits,
:class:`InsufficientMemoryError` says how much is needed and what to lower.

Memory per phase (the phases run one after the other; stable-diffusion.cpp frees each phase's
compute buffer after it, ggml_extend.hpp ``GGMLRunner::compute``)::

    weights(part)  = parameters x bytes per parameter as loaded (F8 -> F16, model_io/safetensors_io.cpp;
                     a conversion changes only the tensors model.cpp tensor_should_be_converted picks: rows
                     filling the type's blocks, no bias, scale or embedding; engine.models.conversion); the VAE's decoder only
                     for text-to-image (no encoder is built: :func:`.memory_weights.decode_only`)
    act(text)      = the largest encoder's working memory (T5/LLM: see TEXT_ACT)
    act(diffusion) = CONTEXT + PER_LATENT x latent pixels [+ PAIR x latent pixels^2 without flash attention;
                     PAIR doubled on a GPU, measured on lavapipe: memory_families.GPU_PAIR_SCALE]; CONTEXT:
                     a DiT's text tokens, run beside the image's whatever its size (FLUX.1's 256)
    act(vae)       = VAE_PER_PIXEL x decoded pixels (the image, or one tile of (8 x tile)^2), x levers.GPU_VAE_SCALE
                     on a GPU (the compute buffer stable-diffusion.cpp logs: 7680 B per pixel)
    CPU:                  RAM  = all weights + BASE + max(act) + images
    GPU, weights on GPU:  VRAM = GPU phases' weights + BASE + max(act);  RAM = BASE + images + CPU phases' (weights + act)
    GPU, offloaded:       VRAM = BASE + max(weights(phase) + act(phase)); RAM = all weights + BASE + images + CPU act
    (a phase kept on the CPU, keep_clip_on_cpu/keep_vae_on_cpu, counts in RAM only; max_vram caps a GPU phase's
    weights at once: levers.need)

Where the constants come from (each :class:`FamilyMemory` names it): SD 1.x's were measured on
this machine's CPU build (the table in :mod:`accelstack.engine.memory.estimate`, checked again by
benchmarks/bench_memory.py), and the other families' on their probes by the same benchmark. The
families without a probe (FLUX.2, the SDXL refiner...) are derived from the architecture each header
fixes, scaled from a measured family, and are deliberately on the high side.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence, Union

from ..config import AUTO, EngineOptions
from ..errors import InsufficientMemoryError
from ..worker.protocol import MAX_SIDE, MIN_SIDE, SIDE_MULTIPLE
from .estimate import GIB, MemoryEstimate
from .families import BASE, FAMILIES, SD1, FamilyMemory
from .levers import CONVERSIONS, TILE_SIZES, Need, PhaseEstimate, Setting, candidates, fits, need
from .weights import ComponentWeights, components_of, decode_only, shares, weights_of

__all__ = ["MemoryPlan", "PhaseEstimate", "FamilyMemory", "FAMILIES", "ComponentWeights", "plan", "plan_for_files",
           "components_of", "weights_of", "TILE_SIZES", "CONVERSIONS", "COMPONENT_FIELDS"]

COMPONENT_FIELDS = ("diffusion_model", "vae", "clip_l", "clip_g", "t5xxl", "llm", "control_net")  # EngineOptions paths


@dataclass
class MemoryPlan:
    """The options the planner chose, the estimate behind them and the one-line reason."""

    __derived__ = ("changed",)  # in the JSON result too (serde.to_dict)

    family: str
    device: str  # cpu | gpu
    width: int
    height: int
    batch: int
    offload_to_cpu: bool
    vae_tiling: bool
    vae_tile_size: int
    weight_type: str
    keep_clip_on_cpu: bool = False
    keep_vae_on_cpu: bool = False
    max_vram: float = 0.0  # GiB (0: no graph cut)
    chosen: List[str] = field(default_factory=list)  # the options that were auto (the planner set them)
    savings: List[str] = field(default_factory=list)  # what it did to fit, in words ("tiling the VAE (tile 16)")
    phases: List[PhaseEstimate] = field(default_factory=list)
    weights: int = 0
    images: int = 0
    ram_need: int = 0
    vram_need: int = 0  # 0 on a CPU runtime
    vram_loaded: int = 0  # of vram_need: the weights already in VRAM once the model is loaded
    ram_free: Optional[int] = None  # as seen when planning (None: unknown)
    vram_free: Optional[int] = None
    fits: bool = True
    reason: str = ""

    @property
    def changed(self) -> bool:
        """The plan gave up speed or quality to fit (tiling, offloading, conversion)."""
        return bool(self.savings)

    def apply(self, options: EngineOptions) -> EngineOptions:
        """``options`` with their ``auto`` values replaced by this plan's choices."""
        return options.concrete({"offload_to_cpu": self.offload_to_cpu, "vae_tiling": self.vae_tiling,
                                 "vae_tile_size": self.vae_tile_size, "weight_type": self.weight_type,
                                 "keep_clip_on_cpu": self.keep_clip_on_cpu, "keep_vae_on_cpu": self.keep_vae_on_cpu,
                                 "max_vram": self.max_vram})

    def estimate(self) -> MemoryEstimate:
        """The totals as :mod:`accelstack.engine.memory.estimate` reports them (for its ``check``)."""
        act = max((p.activations for p in self.phases), default=0) + BASE
        return MemoryEstimate(self.weights, act, self.images, ram=self.ram_need, vram=self.vram_need,
                              loaded=self.vram_loaded)


def _gib(n: float, digits: int = 1) -> str:
    return f"{n / GIB:.{digits}f} GiB"


def plan(family: str, parts: Sequence[ComponentWeights], width: int, height: int, batch: int,
         options: EngineOptions, *, gpu: bool, ram_free: Optional[int], vram_free: Optional[int] = None,
         variant: str = "") -> MemoryPlan:
    """Choose the ``auto`` options for a generation of ``width`` x ``height`` x ``batch`` (see the
    module's docstring); raise :class:`InsufficientMemoryError` when nothing fits (unless
    ``options.memory_check`` is off: then the most economical setting without conversion is used).
    ``ram_free``/``vram_free`` None: not known (not checked; an unknown GPU keeps weights in RAM)."""
    fam = FAMILIES.get(f"{family}-{variant}") or FAMILIES.get(family, SD1)  # a variant's own constants first
    parts = shares(list(parts))
    if not options.vae_encode:  # text-to-image: the VAE is loaded without its encoder
        parts = decode_only(parts)
    flash = options.flash_attention
    vram = vram_free if gpu else None
    settings = candidates(options, gpu, vram, parts, width, height)
    first = need(fam, parts, width, height, batch, flash, gpu, settings[0])
    chosen, found = settings[0], first
    fit = True
    for s in settings:
        n = need(fam, parts, width, height, batch, flash, gpu, s)
        if fits(n, ram_free, vram):
            chosen, found = s, n
            break
    else:
        fit = False
        if options.memory_check:
            raise _refusal(fam, parts, width, height, batch, options, gpu, ram_free, vram, _most_economical(settings))
        plain = [s for s in settings if s.weight_type in ("default", options.weight_type)]
        chosen = _most_economical(plain) if plain else settings[-1]
        found = need(fam, parts, width, height, batch, flash, gpu, chosen)
    result = MemoryPlan(
        family=family, device="gpu" if gpu else "cpu", width=width, height=height, batch=batch,
        offload_to_cpu=chosen.offload, vae_tiling=chosen.tiling, vae_tile_size=chosen.tile,
        weight_type=chosen.weight_type, keep_clip_on_cpu=chosen.clip_cpu, keep_vae_on_cpu=chosen.vae_cpu,
        max_vram=chosen.max_vram, chosen=options.auto_keys(), phases=found.phases, weights=found.weights,
        images=found.images, ram_need=found.ram, vram_need=found.vram, vram_loaded=found.loaded, ram_free=ram_free,
        vram_free=vram, fits=fit)
    result.savings = _savings(result, options, gpu, vram is not None)
    result.reason = _reason(fam, result, first, gpu, vram is not None)
    return result


def _most_economical(settings: List[Setting]) -> Setting:
    """The setting that needs the least (the costliest lever of each kind): what a refusal names as tried."""
    return max(settings, key=Setting.cost)


def _savings(p: MemoryPlan, options: EngineOptions, gpu: bool, vram_known: bool) -> List[str]:
    out = []
    if options.offload_to_cpu == AUTO and gpu and vram_known and p.offload_to_cpu:
        out.append("offloading weights to RAM")
    if options.keep_clip_on_cpu == AUTO and p.keep_clip_on_cpu:
        out.append("keeping the text encoders on the CPU")
    if options.vae_tiling == AUTO and p.vae_tiling:
        out.append(f"tiling the VAE (tile {p.vae_tile_size})")
    if options.keep_vae_on_cpu == AUTO and p.keep_vae_on_cpu:
        out.append("keeping the VAE on the CPU")
    if options.max_vram == AUTO and p.max_vram:
        out.append(f"streaming the weights in graph segments of a {p.max_vram:g} GiB VRAM budget (max_vram)")
    if options.weight_type == AUTO and p.weight_type != "default":
        out.append(f"converting the weights to {p.weight_type} on load")
    return out


def _reason(fam: FamilyMemory, p: MemoryPlan, first: Need, gpu: bool, vram_known: bool) -> str:
    size = f"{p.width}x{p.height}" + (f" x{p.batch}" if p.batch > 1 else "")
    if gpu and vram_known:
        wanted, free, what = first.vram, p.vram_free, "GPU memory"
    else:
        wanted, free, what = first.ram, p.ram_free, "RAM"
    digits = 2 if free is not None and _gib(wanted) == _gib(free) and wanted != free else 1  # 2.07 vs 2.11, not 2.1 vs 2.1
    head = f"{fam.name} at {size} needs ~{_gib(wanted, digits)} of {what}"
    seen = f"{_gib(free, digits)} free" if free is not None else f"free {what} unknown"
    if p.savings:
        tail = " and ".join(p.savings)
    elif gpu and not vram_known and "offload_to_cpu" in p.chosen:
        tail = "GPU memory is not known before the worker starts: keeping weights in RAM until needed"
    else:
        tail = "no memory savings needed" if (free is None or wanted <= free) else "fits as set"
    if not p.fits:
        tail += f" (does not fit by the estimate: needs ~{_gib(p.vram_need if gpu and vram_known else p.ram_need)}; " \
                "the memory check is off)"
    return f"{head}; {seen}: {tail}"


def _largest_side(fam: FamilyMemory, parts: List[ComponentWeights], batch: int, options: EngineOptions, gpu: bool,
                  ram_free: Optional[int], vram_free: Optional[int], best: Setting) -> int:
    low, high, found = MIN_SIDE // SIDE_MULTIPLE, MAX_SIDE // SIDE_MULTIPLE, 0
    while low <= high:
        mid = (low + high) // 2
        side = mid * SIDE_MULTIPLE
        if fits(need(fam, parts, side, side, batch, options.flash_attention, gpu, best), ram_free, vram_free):
            found, low = side, mid + 1
        else:
            high = mid - 1
    return found


def _refusal(fam: FamilyMemory, parts: List[ComponentWeights], width: int, height: int, batch: int,
             options: EngineOptions, gpu: bool, ram_free: Optional[int], vram_free: Optional[int],
             best: Setting) -> InsufficientMemoryError:
    n = need(fam, parts, width, height, batch, options.flash_attention, gpu, best)
    over_vram = gpu and vram_free is not None and n.vram > vram_free
    wanted, have, what = (n.vram, vram_free, "GPU memory") if over_vram else (n.ram, ram_free, "RAM")
    assert have is not None
    size = f"{width}x{height}" + (f" x{batch}" if batch > 1 else "")
    tried = []
    if best.offload and gpu:
        tried.append("weights offloaded to RAM")
    if best.tiling:
        tried.append(f"VAE tiles of {best.tile}")
    if best.clip_cpu and gpu:
        tried.append("text encoders on the CPU")
    if best.vae_cpu and gpu:
        tried.append("the VAE on the CPU")
    if best.max_vram and gpu:
        tried.append(f"a {best.max_vram:g} GiB VRAM budget")
    if best.weight_type not in ("default",):
        tried.append(f"weights as {best.weight_type}")
    act = max(p.activations for p in n.phases) + BASE
    ways = []
    side = _largest_side(fam, parts, batch, options, gpu, ram_free, vram_free, best)
    if side and side < max(width, height):
        ways.append(f"a smaller image (about {side}x{side} fits: --width {side} --height {side})")
    if not best.tiling:
        ways.append("VAE tiling (--vae-tiling)")
    if not options.flash_attention:
        ways.append("flash attention (--flash-attention)")
    if batch > 1:
        ways.append("a smaller batch (--batch-count)")
    if over_vram and not best.offload:
        ways.append("weights kept in RAM until needed (--offload-to-cpu)")
    if over_vram and not best.clip_cpu:
        ways.append("the text encoders on the CPU (--clip-on-cpu)")
    if over_vram and not best.vae_cpu:
        ways.append("the VAE on the CPU (--vae-on-cpu)")
    if over_vram and best.offload and not best.max_vram:
        ways.append("a VRAM budget for the offloaded weights (--max-vram GiB)")
    if not over_vram and gpu and (best.clip_cpu or best.vae_cpu):
        ways.append("more RAM, or the text encoders and VAE on the GPU (--clip-on-cpu off --vae-on-cpu off)")
    if n.weights > have // 2:
        ways.append("a smaller (quantized) model")
    return InsufficientMemoryError(
        f"{fam.name} at {size} needs about {_gib(wanted)} of {what} (model {_gib(n.weights)} + working memory "
        f"{_gib(act)} + images {_gib(n.images)}" + (f", with {', '.join(tried)}" if tried else "")
        + f"), but {_gib(have)} is available",
        hint="use " + (", or ".join(ways) if ways else "a machine with more memory")
        + "; if the estimate is wrong, --no-memory-check turns the check off (memory_check: false in config.yaml)")


def plan_for_files(paths: Sequence[Union[str, Path]], width: int, height: int, batch: int, options: EngineOptions,
                   *, gpu: bool, ram_free: Optional[int], vram_free: Optional[int] = None) -> MemoryPlan:
    """:func:`plan` for the model file(s) (the model, then any component files named in ``options``)."""
    files = [f for f in paths if f] + [getattr(options, k) for k in COMPONENT_FIELDS if getattr(options, k, "")]
    family, variant, parts = components_of(dict.fromkeys(str(f) for f in files))
    return plan(family, parts, width, height, batch, options, gpu=gpu, ram_free=ram_free, vram_free=vram_free,
                variant=variant)
