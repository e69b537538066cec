"""Each model family's working-memory constants for the planner (:mod:`accelstack.engine.memory.plan`).

Kept apart from the planner's logic because they are data with a source each: SD 1.x's and SDXL's
diffusion measured on this machine's CPU build (benchmarks/bench_memory.py), the others derived from
the widths stable-diffusion.cpp's headers fix and NOT measured (each entry's ``source`` says so).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

from . import estimate as memory

__all__ = ["FamilyMemory", "FAMILIES", "SD1", "BASE", "MIB", "LOADED_BYTES", "TEXT_ACT", "GPU_PAIR_SCALE"]

MIB = 1 << 20
# SD 1.x re-measured by benchmarks/bench_memory.py (CPU build 0.4.7, the probe, 1 step, flash
# attention; peak RSS above the loaded RSS): untiled 128/256/384 px 119/421/944 MiB = the VAE's
# 6600 B per pixel (engine.memory.estimate, confirmed within 2%) + 9..16 MiB; tiles of 8 at 384 px: 69 MiB,
# the UNet's ~23 KiB per latent pixel over BASE (engine.memory.estimate's 46 KiB was measured on an earlier
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
    # CLIP: 77 tokens, inside BASE (measured with SD 1.x). The others measured on probes, below (the
    # layers of T5 and the LLMs run one after the other: one layer's working memory is the model's).
    # Qwen2.5-VL 7B measured on the Qwen-Image probe (one layer at its real widths; the layers run one after
    # the other): a whole 128x128 generation with a short prompt peaked 41 MiB above the loaded RSS (it was
    # taken at 512 MiB); 128 MiB leaves room for a 256-token prompt (its 18944-wide MLP: ~230 KB a token).
    # Qwen3 4B measured on the Z-Image probe (one layer at Qwen3-4B's widths): a whole 128x128 generation
    # peaked 24 MiB above the loaded RSS (it was taken at 384 MiB); 128 MiB as Qwen2.5-VL's, its MLP narrower.
    # T5-XXL measured with the Flux probe and a synthesized T5-XXL (bench_memory.py --family flux --t5xxl: its
    # fixed 24 x 4096 as a Q4_0 GGUF, FLUX.1's 256-token chunk): a 128x128 generation peaked 78 MiB above the
    # loaded RSS (it was taken at 256 MiB, derived); 80 MiB (estimate 1.24x the measured).
    "t5xxl": 80 * MIB, "qwen3-4b": 128 * MIB, "qwen2.5-vl-7b": 128 * MIB,
}


@dataclass(frozen=True)
class FamilyMemory:
    """One family's working-memory constants (bytes), with where each comes from."""

    name: str
    per_latent: int  # diffusion, per latent pixel (image pixels / 64), flash attention on
    pair: int  # diffusion without flash attention, per pair of latent pixels (attention scores)
    vae_per_pixel: int  # VAE decode, per decoded image pixel
    source: str
    context: int = 0  # diffusion, whatever the size: the text tokens a DiT runs beside the image's


SD1 = FamilyMemory("Stable Diffusion 1.x", SD1_PER_LATENT, memory.ATTENTION_PER_PAIR, memory.VAE_PER_PIXEL,
                   "measured on the CPU build (benchmarks/bench_memory.py; engine.memory.estimate's table)")
FAMILIES: Dict[str, FamilyMemory] = {
    "sd1": SD1,
    # SD 2.x measured on the SD 2.x probe (the full SD 2.x UNet; benchmarks/bench_memory.py --family sd2
    # --tiles 8, CPU build, flash attention): 38/80/126 MiB above the loaded RSS at 256/384/512 px, i.e.
    # 9 MiB + 29.3 KiB per latent pixel; 28 KiB with BASE: estimates 45/81/132 MiB (1.18/1.01/1.05).
    "sd2": FamilyMemory("Stable Diffusion 2.x", 28 * 1024, memory.ATTENTION_PER_PAIR, memory.VAE_PER_PIXEL,
                        "diffusion measured on the SD 2.x probe (its full UNet; bench_memory.py --family sd2); "
                        "VAE as SD 1.x's (the same decoder)"),
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
    # SD3 measured on the SD3 probe (SD3-medium's own MMDiT; bench_memory.py --family sd3 --tiles 8, CPU
    # build, flash attention): 39/40/84/126/160 MiB above the loaded RSS at 256/384/512/640/768 px, i.e.
    # 23 MiB + 15.2 KiB per latent pixel from 512 px up (below, other phases' floor). 17 KiB with BASE:
    # estimates 43/56/88/128/178 MiB (1.10/1.40/1.05/1.02/1.11; it was 32 KiB, derived: 1.24 to 2.24).
    # SD3.5-large's MMDiT is wider (38 x 64) and is taken at the same constant, not measured. Pairs: 24 heads x 2
    # bytes per token pair / 16 (derived).
    "sd3": FamilyMemory("Stable Diffusion 3.x", 17 * 1024, 3, memory.VAE_PER_PIXEL,
                        "diffusion measured on the SD3 probe (SD3-medium's MMDiT; bench_memory.py --family sd3)"),
    # SD3.5-large (model_inspect's variant "large": 38 joint blocks of 2432) measured with its whole MMDiT as Q4_0
    # (bench_memory.py --family sd3-large --tiles 8): 51/66/126/157 MiB at 256/384/512/640 px, where SD3-medium's
    # constants said 0.84/0.86/0.69/0.82 of that (under). 24 KiB per latent pixel and 16 MiB for the 154 text
    # tokens: 1.12/1.32/1.02/1.17. Pairs: 38 heads x 2 bytes per token pair / 16 (derived).
    "sd3-large": FamilyMemory("Stable Diffusion 3.5 Large", 24 * 1024, 5, memory.VAE_PER_PIXEL,
                              "diffusion measured on SD3.5-large's whole MMDiT (bench_memory.py --family sd3-large)",
                              context=16 * MIB),
    # FLUX.1 measured at its real width (bench_memory.py --family flux-wide --tiles 8: one double and one single
    # block of 3072, which run one after the other as the real model's 19 + 38 do; CPU build, flash attention):
    # 108/174/244 MiB above the loaded RSS at 256/384/512 px. 40 KiB per latent pixel between 384 and 512 px
    # (the figure derived from src/flux.hpp's widths: a single block's linear1 output is 21504 floats a token)
    # plus a part no image size changes: the 256 T5 tokens (FluxCLIPEmbedder's chunk, zeros without T5) run
    # through every block beside the image's. Without it the estimate was 0.53/0.62/0.74 of the measured
    # peak (under: an out-of-memory the planner did not see); with 72 MiB, 1.19/1.03/1.02. 24 heads x 2
    # bytes per token pair / 16 = 3 per latent pair (derived).
    "flux": FamilyMemory("FLUX.1", 40 * 1024, 3, memory.VAE_PER_PIXEL,
                         "diffusion measured on FLUX.1's blocks at its real width (bench_memory.py --family flux-wide)",
                         context=72 * MIB),
    # Chroma measured the same way (--family chroma-wide, its DiT mask off as generate runs it): 112/174/237 MiB
    # at 256/384/512 px; FLUX.1's constants estimate 1.15/1.03/1.06 of that.
    "chroma": FamilyMemory("Chroma", 40 * 1024, 3, memory.VAE_PER_PIXEL,
                           "FLUX.1's, measured on Chroma's blocks at its real width (bench_memory.py --family "
                           "chroma-wide)", context=72 * MIB),
    "flux2": FamilyMemory("FLUX.2", 48 * 1024, 3, memory.VAE_PER_PIXEL, "FLUX.1's, widened (src/flux.hpp); not measured"),
    # The Wan VAE measured on the Qwen-Image probe (its real decoder; bench_memory.py --family qwen-image,
    # untiled): 500/1073 MiB above the loaded RSS at 256/384 px, 7334 B per pixel + 42 MiB: 7800 B per
    # pixel with BASE gives 1.01/1.04 (it was taken at 1.5x the SD VAE's, 9900: 1.27/1.31).
    # Its diffusion, one block at the real width (the blocks run one after the other), tiles of 8: 68/90 MiB
    # at 256/384 px, 17.6 KiB per latent pixel between them; 24 KiB kept (it was 40, derived).
    "qwen-image": FamilyMemory("Qwen-Image", 24 * 1024, 3, 7800,
                               "the Wan VAE and the diffusion measured on the Qwen-Image probe (bench_memory.py "
                               "--family qwen-image: one block at the real width, the real Wan decoder)"),
    # Z-Image measured on the Z-Image probe (its whole DiT, Q4_0; bench_memory.py --family z-image --tiles 8,
    # CPU build, flash attention): 24/53/113 MiB above the loaded RSS at 128/256/384 px, 47 KiB per latent
    # pixel from 256 to 384 px: the 48 KiB derived from src/z_image.hpp's widths (hidden 3840, feed-forward
    # 10240, 2x2 patches) stands, now measured. Pairs: 30 heads x 2 bytes per token pair / 16 (derived).
    "z-image": FamilyMemory("Z-Image", 48 * 1024, 4, memory.VAE_PER_PIXEL,
                            "diffusion measured on the Z-Image probe (its whole DiT; bench_memory.py --family z-image)"),
}
# The Flux/SD3 16-channel VAE has the SD VAE's decoder widths (src/auto_encoder_kl.hpp: ch 128,
# ch_mult {1,2,4,4}; only z_channels differ), so memory.VAE_PER_PIXEL, measured with SD 1.x, applies to both.
