"""The settings the memory planner weighs and what each needs, phase by phase (:mod:`.plan` picks one).

A setting is one value of every lever the bundled engine has (stable_diffusion_cpp 0.4.7's
``StableDiffusion(...)``), tried in order of cost, the cheapest first:

1. weights offloaded to RAM and moved in per phase (docs/performance.md: "saving VRAM without reducing
   generation speed");
2. the text encoders on the CPU (``keep_clip_on_cpu``; docs/flux.md runs FLUX.1 with ``--clip-on-cpu``):
   their weights and their pass in RAM, a few seconds of CPU per prompt;
3. VAE tiling, the largest tile that fits (tiles cost a little time and may show seams);
4. the VAE on the CPU (``keep_vae_on_cpu``): the decode in RAM, tens of seconds on a CPU at 1024x1024,
   so after tiling;
5. ``max_vram``, with the weights offloaded: stable-diffusion.cpp cuts each graph into segments whose
   weights and working memory fit the budget (src/ggml_graph_cut.cpp ``apply_max_vram_budget``) and streams
   the weights in per segment, every step: the slowest that keeps the weights as stored;
6. the weights converted on load (q8_0, then q4_k): the last resort, quality given up.

Phase placement: a phase on the CPU holds its weights and working memory in RAM; with offload, a GPU
phase's weights come into VRAM for that phase only; with ``max_vram`` B, a phase holds at most
max(B - working memory, weights / MIN_SEGMENTS) of its weights at once (a segment is at least one block:
derived from the cut code, not measured). The VAE's working memory on a GPU is the compute buffer
stable-diffusion.cpp allocates (:data:`GPU_VAE_SCALE`), on the CPU the measured RSS.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from ..config import AUTO, LEGACY, EngineOptions
from .estimate import GIB, IMAGE_PER_PIXEL, LATENT_SCALE, VAE_PER_PIXEL
from .families import BASE, GPU_PAIR_SCALE, TEXT_ACT, FamilyMemory
from .weights import ComponentWeights, converted_bytes

__all__ = ["Setting", "Need", "PhaseEstimate", "need", "fits", "candidates", "phase_weights", "TILE_SIZES", "CONVERSIONS",
           "PHASES", "GPU_VAE_SCALE", "MIN_SEGMENTS", "budget_for"]

TILE_SIZES = (64, 48, 32, 24, 16, 8)  # latent pixels per tile edge the planner tries, largest first
CONVERSIONS = ("q8_0", "q4_k")  # the last resort, in order (ggml block sizes: 34 bytes / 32 weights, 144 / 256)
PHASES = ("text encoders", "diffusion", "vae decode")
# An untiled SDXL 1024x1024 decode: "vae compute buffer size: 7680.25 MB(VRAM)" in stable-diffusion.cpp's own
# log (leejet/stable-diffusion.cpp PR #890, CUDA, without vae-conv-direct), 7680 bytes per decoded pixel; the
# CPU build's RSS grew 6600 (estimate.VAE_PER_PIXEL, measured here). The SD, SDXL and Flux VAEs share the
# decoder's widths (src/auto_encoder_kl.hpp), so every family's VAE figure is scaled by this on a GPU.
GPU_VAE_SCALE = 7680 / VAE_PER_PIXEL
MIN_SEGMENTS = 16  # a max_vram segment holds at least 1/16 of a phase's weights (derived: >= 1 block; not measured)
MAX_VRAM_SHARE = 0.9  # auto's max_vram: this share of the free VRAM (a margin: the cut is not measured here)


@dataclass
class PhaseEstimate:
    """One phase's peak: its weights and its working memory (bytes), and where it runs."""

    phase: str  # text encoders | diffusion | vae decode
    weights: int
    activations: int
    device: str = "cpu"  # cpu | gpu: where this phase computes (its weights' home, unless offloaded)


@dataclass(frozen=True)
class Setting:
    """One value for every lever."""

    offload: bool
    tiling: bool
    tile: int
    weight_type: str
    clip_cpu: bool = False
    vae_cpu: bool = False
    max_vram: float = 0.0  # GiB; 0: no graph cut

    def cost(self) -> tuple:
        """Sort key, the costliest lever first (the module's order): conversion, max_vram, VAE on CPU,
        tiling (a smaller tile costs more), text encoders on CPU, offload."""
        rank = 0 if self.weight_type in ("default", AUTO) else 1 + (CONVERSIONS.index(self.weight_type)
                                                                    if self.weight_type in CONVERSIONS else 0)
        tile = 1 + (TILE_SIZES.index(self.tile) if self.tile in TILE_SIZES else len(TILE_SIZES)) if self.tiling else 0
        return rank, self.max_vram > 0, self.vae_cpu, tile, self.clip_cpu, self.offload


@dataclass
class Need:
    phases: List[PhaseEstimate]
    weights: int
    images: int
    ram: int
    vram: int
    loaded: int


def phase_weights(parts: List[ComponentWeights], weight_type: str) -> Dict[str, int]:
    out = {"text encoders": 0, "diffusion": 0, "vae decode": 0}
    phase_of = {"text_encoder": "text encoders", "vae": "vae decode"}
    for p in parts:
        size = p.loaded_bytes
        if weight_type not in ("default", AUTO) and p.parameters:  # a quantized file is requantized (model.cpp)
            size = converted_bytes(p, weight_type)
        out[phase_of.get(p.component, "diffusion")] += size
    return out


def _held(p: PhaseEstimate, budget: int) -> int:
    """The weights a GPU phase holds at once: all of them, or with a max_vram budget one segment's worth."""
    if not budget:
        return p.weights
    return min(p.weights, max(budget - p.activations, p.weights // MIN_SEGMENTS))


def need(fam: FamilyMemory, parts: List[ComponentWeights], width: int, height: int, batch: int, flash: bool,
         gpu: bool, s: Setting) -> Need:
    pixels = width * height
    latent = pixels // (LATENT_SCALE * LATENT_SCALE)
    pair = fam.pair * (GPU_PAIR_SCALE if gpu else 1)
    diffusion = fam.context + fam.per_latent * latent + (0 if flash else pair * latent * latent)
    decoded = min(pixels, (s.tile * LATENT_SCALE) ** 2) if s.tiling else pixels
    text = max((TEXT_ACT.get(p.kind, 0) for p in parts if p.component == "text_encoder"), default=0)
    on_gpu = {"text encoders": gpu and not s.clip_cpu, "diffusion": gpu, "vae decode": gpu and not s.vae_cpu}
    vae = fam.vae_per_pixel * decoded * (GPU_VAE_SCALE if on_gpu["vae decode"] else 1)
    acts = {"text encoders": text, "diffusion": diffusion, "vae decode": int(vae)}
    held = phase_weights(parts, s.weight_type)
    phases = [PhaseEstimate(name, held[name], acts[name], "gpu" if on_gpu[name] else "cpu") for name in PHASES]
    weights = sum(held.values())
    images = IMAGE_PER_PIXEL * pixels * batch
    if not gpu:
        return Need(phases, weights, images, ram=weights + BASE + max(acts.values()) + images, vram=0, loaded=0)
    gpu_phases = [p for p in phases if p.device == "gpu"]
    cpu_phases = [p for p in phases if p.device == "cpu"]
    cpu_act = max((p.activations for p in cpu_phases), default=0)
    if s.offload:
        budget = int(s.max_vram * GIB)
        vram = BASE + max(_held(p, budget) + p.activations for p in gpu_phases)
        return Need(phases, weights, images, ram=weights + BASE + cpu_act + images, vram=vram, loaded=0)
    on_card = sum(p.weights for p in gpu_phases)
    return Need(phases, weights, images, ram=BASE + images + sum(p.weights for p in cpu_phases) + cpu_act,
                vram=on_card + BASE + max(p.activations for p in gpu_phases), loaded=on_card)


def fits(n: Need, ram_free: Optional[int], vram_free: Optional[int]) -> bool:
    return (ram_free is None or n.ram <= ram_free) and (vram_free is None or not n.vram or n.vram <= vram_free)


def budget_for(vram_free: int) -> float:
    """auto's max_vram (GiB): a share of the free VRAM above BASE, in steps of 1/8 GiB."""
    return max(0.0, math.floor((vram_free - BASE) * MAX_VRAM_SHARE / GIB * 8) / 8)


def _choices(value: Any, auto: Sequence[Any]) -> List[Any]:
    return list(auto) if value == AUTO else [value]


def candidates(options: EngineOptions, gpu: bool, vram_free: Optional[int], parts: List[ComponentWeights],
               width: int, height: int) -> List[Setting]:
    """Every setting the options leave open, from the cheapest (fastest, as stored) to the most economical."""
    levers = gpu and vram_free is not None  # the GPU levers matter only where the GPU's memory is known
    if options.offload_to_cpu != AUTO:
        offloads = [bool(options.offload_to_cpu)]
    elif not levers:  # a no-op on CPU; an unknown GPU keeps the safe default
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
    texts = any(p.component == "text_encoder" for p in parts)
    clips = _choices(options.keep_clip_on_cpu, [False, True] if levers and texts else [False])
    vaes = _choices(options.keep_vae_on_cpu, [False, True] if levers else [False])
    budgets = _choices(options.max_vram, [0.0] + ([budget_for(vram_free)] if levers and vram_free else []))
    if options.weight_type != AUTO:
        types = [options.weight_type]
    else:
        stored = sum(phase_weights(parts, "default").values())  # a conversion only where it makes them smaller
        types = ["default"] + [c for c in CONVERSIONS if sum(phase_weights(parts, c).values()) < stored]
    out = [Setting(o, t, size, w, bool(c), bool(v), float(b))
           for w in types for o in offloads for t, size in tilings for c in clips for v in vaes for b in budgets
           if not (b and not o and options.max_vram == AUTO)]  # it cuts offloaded weights' graphs only (ggml_extend.hpp)
    return sorted(out, key=Setting.cost) or [Setting(True, False, untiled, types[0])]
