"""Choose the engine's ``auto`` options so that a generation fits this machine's memory.

"Out of memory" is the most common failure after "wrong build": stable-diffusion.cpp allocates
what a request needs and is killed by the OS (or by the GPU driver) after minutes of loading. The
planner estimates, before the worker starts, the peak memory of each phase of a generation (text
encoders, diffusion, VAE decode) from what the model files' headers say (:func:`inspect_model`:
family, parameters per component, weight types; the file size when they cannot be read) and the
requested size, and picks for every option left ``auto`` the cheapest setting that fits:

1. weights on the GPU when they fit, else kept in RAM and moved in per phase (``offload_to_cpu``:
   a no-op on a CPU runtime, ggml_extend.hpp ``GGMLRunner`` only offloads off a CPU backend);
2. no VAE tiling unless the decode would not fit, then the largest tile that fits;
3. the weights as stored, converting them on load to q8_0, then q4_k, only as a last resort.

An option given a value (config.yaml or a flag) is kept as given. When nothing fits,
:class:`InsufficientMemoryError` says how much is needed and what to lower.

Memory per phase (the phases run one after the other; stable-diffusion.cpp frees each phase's
compute buffer after it, ggml_extend.hpp ``GGMLRunner::compute``)::

    weights(part)  = parameters x bytes per parameter as loaded (F8 -> F16, model_io/safetensors_io.cpp;
                     a conversion applies to all weights but biases, scales and embeddings, model.cpp
                     tensor_should_be_converted: counted here on all of them); the VAE's decoder only
                     for text-to-image (no encoder is built: :func:`.memory_weights.decode_only`)
    act(text)      = the largest encoder's working memory (T5/LLM: see TEXT_ACT)
    act(diffusion) = CONTEXT + PER_LATENT x latent pixels [+ PAIR x latent pixels^2 without flash attention;
                     PAIR doubled on a GPU, measured on lavapipe: memory_families.GPU_PAIR_SCALE]; CONTEXT:
                     a DiT's text tokens, run beside the image's whatever its size (FLUX.1's 256)
    act(vae)       = VAE_PER_PIXEL x decoded pixels (the image, or one tile of (8 x tile)^2)
    CPU:                  RAM  = all weights + BASE + max(act) + images
    GPU, weights on GPU:  VRAM = all weights + BASE + max(act);         RAM = BASE + images
    GPU, offloaded:       VRAM = BASE + max(weights(phase) + act(phase)); RAM = all weights + BASE + images

Where the constants come from (each :class:`FamilyMemory` names it): SD 1.x's were measured on
this machine's CPU build (the table in :mod:`accelstack.engine.memory.estimate`, checked again by
benchmarks/bench_memory.py), and the other families' on their probes by the same benchmark. The
families without a probe (FLUX.2, the SDXL refiner...) are derived from the architecture each header
fixes, scaled from a measured family, and are deliberately on the high side.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

from ..config import AUTO, LEGACY, EngineOptions
from ..errors import InsufficientMemoryError
from ..worker.protocol import MAX_SIDE, MIN_SIDE, SIDE_MULTIPLE
from .estimate import GIB, IMAGE_PER_PIXEL, LATENT_SCALE, MemoryEstimate
from .families import BASE, FAMILIES, GPU_PAIR_SCALE, SD1, TEXT_ACT, FamilyMemory
from .weights import ComponentWeights, components_of, conversion_bytes, decode_only, shares, weights_of

__all__ = ["MemoryPlan", "PhaseEstimate", "FamilyMemory", "FAMILIES", "ComponentWeights", "plan", "plan_for_files",
           "components_of", "weights_of", "TILE_SIZES", "CONVERSIONS", "COMPONENT_FIELDS"]

TILE_SIZES = (64, 48, 32, 24, 16, 8)  # latent pixels per tile edge the planner tries, largest first
CONVERSIONS = ("q8_0", "q4_k")  # the last resort, in order (ggml block sizes: 34 bytes / 32 weights, 144 / 256)
PHASES = ("text encoders", "diffusion", "vae decode")
COMPONENT_FIELDS = ("diffusion_model", "vae", "clip_l", "clip_g", "t5xxl", "llm", "control_net")  # EngineOptions paths


@dataclass
class PhaseEstimate:
    """One phase's peak: its weights and its working memory (bytes)."""

    phase: str  # text encoders | diffusion | vae decode
    weights: int
    activations: int


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
                                 "vae_tile_size": self.vae_tile_size, "weight_type": self.weight_type})

    def estimate(self) -> MemoryEstimate:
        """The totals as :mod:`accelstack.engine.memory.estimate` reports them (for its ``check``)."""
        act = max((p.activations for p in self.phases), default=0) + BASE
        return MemoryEstimate(self.weights, act, self.images, ram=self.ram_need, vram=self.vram_need,
                              loaded=self.vram_loaded)


def _gib(n: float, digits: int = 1) -> str:
    return f"{n / GIB:.{digits}f} GiB"


# -- the estimate -----------------------------------------------------------------------------------------
@dataclass
class _Setting:
    offload: bool
    tiling: bool
    tile: int
    weight_type: str


@dataclass
class _Need:
    phases: List[PhaseEstimate]
    weights: int
    images: int
    ram: int
    vram: int
    loaded: int


def _phase_weights(parts: List[ComponentWeights], weight_type: str) -> Dict[str, int]:
    out = {"text encoders": 0, "diffusion": 0, "vae decode": 0}
    phase_of = {"text_encoder": "text encoders", "vae": "vae decode"}
    for p in parts:
        size = p.loaded_bytes
        if weight_type not in ("default", AUTO) and p.parameters:  # a quantized file is requantized (model.cpp)
            size = int(p.parameters * conversion_bytes(weight_type))
        out[phase_of.get(p.component, "diffusion")] += size
    return out


def _need(fam: FamilyMemory, parts: List[ComponentWeights], width: int, height: int, batch: int, flash: bool,
          gpu: bool, s: _Setting) -> _Need:
    pixels = width * height
    latent = pixels // (LATENT_SCALE * LATENT_SCALE)
    pair = fam.pair * (GPU_PAIR_SCALE if gpu else 1)
    diffusion = fam.context + fam.per_latent * latent + (0 if flash else pair * latent * latent)
    decoded = min(pixels, (s.tile * LATENT_SCALE) ** 2) if s.tiling else pixels
    text = max((TEXT_ACT.get(p.kind, 0) for p in parts if p.component == "text_encoder"), default=0)
    acts = {"text encoders": text, "diffusion": diffusion, "vae decode": fam.vae_per_pixel * decoded}
    held = _phase_weights(parts, s.weight_type)
    phases = [PhaseEstimate(name, held[name], acts[name]) for name in PHASES]
    weights = sum(held.values())
    images = IMAGE_PER_PIXEL * pixels * batch
    peak_act = max(acts.values())
    if not gpu:
        return _Need(phases, weights, images, ram=weights + BASE + peak_act + images, vram=0, loaded=0)
    if s.offload:
        vram = BASE + max(p.weights + p.activations for p in phases)
        return _Need(phases, weights, images, ram=weights + BASE + images, vram=vram, loaded=0)
    return _Need(phases, weights, images, ram=BASE + images, vram=weights + BASE + peak_act, loaded=weights)


def _fits(need: _Need, ram_free: Optional[int], vram_free: Optional[int]) -> bool:
    return (ram_free is None or need.ram <= ram_free) and (vram_free is None or not need.vram or need.vram <= vram_free)


def _candidates(options: EngineOptions, gpu: bool, vram_known: bool, parts: List[ComponentWeights],
                width: int, height: int) -> List[_Setting]:
    """Settings from the cheapest (fastest, as stored) to the most economical."""
    if options.offload_to_cpu != AUTO:
        offloads = [bool(options.offload_to_cpu)]
    elif not gpu or not vram_known:  # a no-op on CPU; an unknown GPU keeps the safe default
        offloads = [True]
    else:
        offloads = [False, True]
    latent_side = max(width, height) // LATENT_SCALE
    given = options.vae_tile_size != AUTO  # a tile size given is the one tiling uses; auto: the largest that fits
    sizes = [int(options.vae_tile_size)] if given else [t for t in TILE_SIZES if t < latent_side] or [TILE_SIZES[-1]]
    untiled = int(options.vae_tile_size) if given else LEGACY["vae_tile_size"]
    if options.vae_tiling == AUTO:
        tilings = [(False, untiled)] + [(True, t) for t in sizes]
    elif options.vae_tiling:
        tilings = [(True, t) for t in sizes]
    else:
        tilings = [(False, untiled)]
    if options.weight_type != AUTO:
        types = [options.weight_type]
    else:
        stored = sum(_phase_weights(parts, "default").values())  # a conversion only where it makes them smaller
        types = ["default"] + [c for c in CONVERSIONS if sum(_phase_weights(parts, c).values()) < stored]
    return [_Setting(o, t, size, w) for w in types for o in offloads for t, size in tilings]


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
    settings = _candidates(options, gpu, vram is not None, parts, width, height)
    first = _need(fam, parts, width, height, batch, flash, gpu, settings[0])
    chosen, need = settings[0], first
    fits = True
    for s in settings:
        n = _need(fam, parts, width, height, batch, flash, gpu, s)
        if _fits(n, ram_free, vram):
            chosen, need = s, n
            break
    else:
        fits = False
        if options.memory_check:
            raise _refusal(fam, parts, width, height, batch, options, gpu, ram_free, vram, settings[-1])
        plain = [s for s in settings if s.weight_type in ("default", options.weight_type)]
        chosen = plain[-1] if plain else settings[-1]
        need = _need(fam, parts, width, height, batch, flash, gpu, chosen)
    result = MemoryPlan(
        family=family, device="gpu" if gpu else "cpu", width=width, height=height, batch=batch,
        offload_to_cpu=chosen.offload, vae_tiling=chosen.tiling, vae_tile_size=chosen.tile,
        weight_type=chosen.weight_type, chosen=options.auto_keys(), phases=need.phases, weights=need.weights,
        images=need.images, ram_need=need.ram, vram_need=need.vram, vram_loaded=need.loaded, ram_free=ram_free,
        vram_free=vram, fits=fits)
    result.savings = _savings(result, options, gpu, vram is not None)
    result.reason = _reason(fam, result, first, gpu, vram is not None)
    return result


def _savings(p: MemoryPlan, options: EngineOptions, gpu: bool, vram_known: bool) -> List[str]:
    out = []
    if options.offload_to_cpu == AUTO and gpu and vram_known and p.offload_to_cpu:
        out.append("offloading weights to RAM")
    if options.vae_tiling == AUTO and p.vae_tiling:
        out.append(f"tiling the VAE (tile {p.vae_tile_size})")
    if options.weight_type == AUTO and p.weight_type != "default":
        out.append(f"converting the weights to {p.weight_type} on load")
    return out


def _reason(fam: FamilyMemory, p: MemoryPlan, first: _Need, gpu: bool, vram_known: bool) -> str:
    size = f"{p.width}x{p.height}" + (f" x{p.batch}" if p.batch > 1 else "")
    if gpu and vram_known:
        need, free, what = first.vram, p.vram_free, "GPU memory"
    else:
        need, free, what = first.ram, p.ram_free, "RAM"
    digits = 2 if free is not None and _gib(need) == _gib(free) and need != free else 1  # 2.07 vs 2.11, not 2.1 vs 2.1
    head = f"{fam.name} at {size} needs ~{_gib(need, digits)} of {what}"
    seen = f"{_gib(free, digits)} free" if free is not None else f"free {what} unknown"
    if p.savings:
        tail = " and ".join(p.savings)
    elif gpu and not vram_known and "offload_to_cpu" in p.chosen:
        tail = "GPU memory is not known before the worker starts: keeping weights in RAM until needed"
    else:
        tail = "no memory savings needed" if (free is None or need <= free) else "fits as set"
    if not p.fits:
        tail += f" (does not fit by the estimate: needs ~{_gib(p.vram_need if gpu and vram_known else p.ram_need)}; " \
                "the memory check is off)"
    return f"{head}; {seen}: {tail}"


def _largest_side(fam: FamilyMemory, parts: List[ComponentWeights], batch: int, options: EngineOptions, gpu: bool,
                  ram_free: Optional[int], vram_free: Optional[int], best: _Setting) -> int:
    low, high, found = MIN_SIDE // SIDE_MULTIPLE, MAX_SIDE // SIDE_MULTIPLE, 0
    while low <= high:
        mid = (low + high) // 2
        side = mid * SIDE_MULTIPLE
        if _fits(_need(fam, parts, side, side, batch, options.flash_attention, gpu, best), ram_free, vram_free):
            found, low = side, mid + 1
        else:
            high = mid - 1
    return found


def _refusal(fam: FamilyMemory, parts: List[ComponentWeights], width: int, height: int, batch: int,
             options: EngineOptions, gpu: bool, ram_free: Optional[int], vram_free: Optional[int],
             best: _Setting) -> InsufficientMemoryError:
    n = _need(fam, parts, width, height, batch, options.flash_attention, gpu, best)
    over_vram = gpu and vram_free is not None and n.vram > vram_free
    need, have, what = (n.vram, vram_free, "GPU memory") if over_vram else (n.ram, ram_free, "RAM")
    assert have is not None
    size = f"{width}x{height}" + (f" x{batch}" if batch > 1 else "")
    tried = []
    if best.offload and gpu:
        tried.append("weights offloaded to RAM")
    if best.tiling:
        tried.append(f"VAE tiles of {best.tile}")
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
    if n.weights > have // 2:
        ways.append("a smaller (quantized) model")
    return InsufficientMemoryError(
        f"{fam.name} at {size} needs about {_gib(need)} of {what} (model {_gib(n.weights)} + working memory "
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
