"""Each model family's working-memory constants for the planner (:mod:`accelstack.engine.memory_plan`).

Kept apart from the planner's logic because they are data with a source each: SD 1.x's and SDXL's
diffusion measured on this machine's CPU build (benchmarks/bench_memory.py), the others derived from
the widths stable-diffusion.cpp's headers fix and NOT measured (each entry's ``source`` says so).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

from . import memory

__all__ = ["FamilyMemory", "FAMILIES", "SD1", "BASE", "MIB", "LOADED_BYTES", "TEXT_ACT", "GPU_PAIR_SCALE"]

MIB = 1 << 20
# SD 1.x re-measured by benchmarks/bench_memory.py (CPU build 0.4.7, the probe, 1 step, flash
# attention; peak RSS above the loaded RSS): untiled 128/256/384 px 119/421/944 MiB = the VAE's
# 6600 B per pixel (engine.memory, confirmed within 2%) + 9..16 MiB; tiles of 8 at 384 px: 69 MiB,
# the UNet's ~23 KiB per latent pixel over BASE (engine.memory's 46 KiB was measured on an earlier
# build and is kept below as the margin for the families that are not measured).
BASE = 16 * MIB  # graph, tokens, latents, allocator slack
# Without flash attention, a GPU backend allocates the attention scores in full: on lavapipe the SD 1.x
# UNet's compute buffer grew by 32 bytes per latent pixel pair (8 heads of f32 scores; 192 MiB at
# 384 px, 560 MiB at 512 px: benchmarks/bench_memory_vulkan.py), twice the per-pair growth of the CPU
# build's RSS (memory.ATTENTION_PER_PAIR). Every family's pair constant is doubled on a GPU.
GPU_PAIR_SCALE = 2
SD1_PER_LATENT = 24 * 1024
# Bytes per parameter once loaded, for the types ggml has no block type for.
LOADED_BYTES = {"F32": 4.0, "F16": 2.0, "BF16": 2.0, "F8_E4M3": 2.0, "F8_E5M2": 2.0, "F64": 4.0, "I64": 4.0}
TEXT_ACT = {  # working memory of one encoder pass, by encoder kind
    # CLIP: 77 tokens, inside BASE (measured with SD 1.x). T5-XXL: 512 tokens x 4096 wide, 64 heads,
    # 10240-wide feed-forward (src/t5.hpp): ~64 MiB of f32 attention scores + ~40 MiB feed-forward,
    # doubled for the graph allocator (derived, not measured). LLM encoders (src/llm.hpp): the same
    # order of magnitude for their wider layers (derived, not measured).
    "t5xxl": 256 * MIB, "qwen3-4b": 384 * MIB, "qwen2.5-vl-7b": 512 * MIB,
}


@dataclass(frozen=True)
class FamilyMemory:
    """One family's working-memory constants (bytes), with where each comes from."""

    name: str
    per_latent: int  # diffusion, per latent pixel (image pixels / 64), flash attention on
    pair: int  # diffusion without flash attention, per pair of latent pixels (attention scores)
    vae_per_pixel: int  # VAE decode, per decoded image pixel
    source: str


SD1 = FamilyMemory("Stable Diffusion 1.x", SD1_PER_LATENT, memory.ATTENTION_PER_PAIR, memory.VAE_PER_PIXEL,
                   "measured on the CPU build (benchmarks/bench_memory.py; engine.memory's table)")
FAMILIES: Dict[str, FamilyMemory] = {
    "sd1": SD1,
    # src/unet.hpp: SD 2.x keeps SD 1.x's channel_mult {1,2,4,4} and attention at every level.
    "sd2": FamilyMemory("Stable Diffusion 2.x", memory.UNET_PER_LATENT, memory.ATTENTION_PER_PAIR,
                        memory.VAE_PER_PIXEL, "SD 1.x's earlier (higher) calibration; same UNet widths "
                        "(src/unet.hpp channel_mult {1,2,4,4}); not measured"),
    # SDXL measured on the SDXL probe (benchmarks/bench_memory.py --family sdxl --tiles 8: Segmind Vega's
    # UNet at SDXL's real widths, CPU build, flash attention): 41/77/130 MiB above the loaded RSS at
    # 256/384/512 px, i.e. 11 MiB + 29.7 KiB per latent pixel. Full SDXL's deeper transformer stacks
    # (src/unet.hpp: depth 10 at the last level) keep no more tensors alive than Vega's (no extra skip
    # connections), so the constant is taken for both. Without flash attention, pairs only at 1/4 of
    # the pixels or less (attention_resolutions {4,2}, 10 heads): 1/16 of the pairs x 10/8 heads
    # (derived, not measured).
    "sdxl": FamilyMemory("Stable Diffusion XL", 30 * 1024, 2, memory.VAE_PER_PIXEL,
                         "diffusion measured on the SDXL probe (Vega layout, SDXL widths; bench_memory.py --family "
                         "sdxl); VAE as SD 1.x's (the same decoder, src/auto_encoder_kl.hpp)"),
    "sdxl-refiner": FamilyMemory("Stable Diffusion XL refiner", 30 * 1024, 2, memory.VAE_PER_PIXEL,
                                 "as SDXL (src/unet.hpp); not measured"),
    # src/mmdit.hpp: 2x2 patches (a token per 4 latent pixels), hidden 64 x depth (1536 for medium),
    # joint attention over image and text tokens: ~128 KiB of f32 per token for qkv + MLP + the
    # context stream, i.e. 32 KiB per latent pixel; 24 heads x 2 bytes per token pair / 16.
    "sd3": FamilyMemory("Stable Diffusion 3.x", 32 * 1024, 3, memory.VAE_PER_PIXEL,
                        "derived from src/mmdit.hpp widths, scaled from SD 1.x; not measured"),
    # src/flux.hpp FluxParams: hidden 3072, 24 heads, MLP ratio 4, 2x2 patches: a single block's
    # linear1 output is 3*3072+12288 = 21504 floats per token; with the residual stream and the
    # double blocks' two streams ~160 KiB per token = 40 KiB per latent pixel; 24 heads x 2 bytes
    # per token pair / 16 = 3 per latent pair.
    "flux": FamilyMemory("FLUX.1", 40 * 1024, 3, memory.VAE_PER_PIXEL,
                         "derived from src/flux.hpp FluxParams, scaled from SD 1.x; not measured"),
    "chroma": FamilyMemory("Chroma", 40 * 1024, 3, memory.VAE_PER_PIXEL, "as FLUX.1 (src/flux.hpp); not measured"),
    "flux2": FamilyMemory("FLUX.2", 48 * 1024, 3, memory.VAE_PER_PIXEL, "FLUX.1's, widened (src/flux.hpp); not measured"),
    "qwen-image": FamilyMemory("Qwen-Image", 40 * 1024, 3, memory.VAE_PER_PIXEL * 3 // 2,
                               "src/qwen_image.hpp (FLUX.1's widths); the Wan VAE (src/wan.hpp) taken at 1.5x "
                               "the SD VAE; not measured"),
    # src/z_image.hpp: hidden 3840, 30 heads, feed-forward 10240, 2x2 patches.
    "z-image": FamilyMemory("Z-Image", 48 * 1024, 4, memory.VAE_PER_PIXEL,
                            "derived from src/z_image.hpp widths, scaled from SD 1.x; not measured"),
}
# The Flux/SD3 16-channel VAE has the SD VAE's decoder widths (src/auto_encoder_kl.hpp: ch 128,
# ch_mult {1,2,4,4}; only z_channels differ), so memory.VAE_PER_PIXEL, measured with SD 1.x, applies to both.
