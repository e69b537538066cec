"""A rough estimate of the memory a generation needs, checked before any work starts.

stable-diffusion.cpp allocates what a request needs and, when the machine lacks it, is killed by
the OS (or swaps for minutes) after the model has loaded: a 4096x4096 image wants over 100 GiB.
The estimate is deliberately simple, calibrated by measuring the worker's peak RSS above its RSS
after loading (``VmHWM``, reset between runs) on the CPU build 0.4.7 with the SD 1.x probe model
(f16, 2.0 GB of files, 1.97 GB loaded), one step, flash attention on:

    side   VAE tiling        measured   formula
    64     off                36 MiB     58 MiB
    128    off               128 MiB    135 MiB
    256    off               425 MiB    445 MiB
    384    off               956 MiB    960 MiB
    256    8-latent tiles     40 MiB     78 MiB
    384    8-latent tiles    106 MiB    136 MiB
    384    32-latent tiles   431 MiB    445 MiB
    384    16-latent tiles,  204 MiB    216 MiB
           no flash attention

The VAE decoder dominates: about 6.6 KiB per decoded pixel (the whole image, or one tile with
VAE tiling); the UNet (flash attention) needs about 46 KiB per latent pixel (an image pixel is
1/64 of one); they run one after the other, so the larger counts. Without flash attention the
UNet also holds attention scores, quadratic in the latent pixels: measured ~16 bytes per pair of
latent pixels (the table's last row). Formula::

    activations = BASE + max(VAE_PER_PIXEL * decoded pixels, UNET_PER_LATENT * w*h/64 [+ 16 * (w*h/64)^2])
    images      = IMAGE_PER_PIXEL * w * h * batch   (RGB in the worker, base64 + JSON both sides, PNG)
    weights     = the model's file size
    RAM  (CPU)  = weights + activations + images
    RAM  (GPU)  = weights + images                  VRAM = activations + weights (x UNET_SHARE with offload)

Batches are sampled and decoded one image at a time, so only the images grow with the batch.
It is an estimate, for refusing what cannot fit, not for packing memory. These are SD 1.x's
constants; :mod:`accelstack.engine.memory.plan` holds every family's (derived from these), splits
the need by phase and chooses the ``auto`` options; ``estimate`` and ``check`` here remain for the
SD 1.x probe and for callers that plan nothing (an ``auto`` option counts as its safe default:
weights offloaded, the VAE untiled).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..config import EngineOptions
from ..errors import InsufficientMemoryError
from ..worker.protocol import MAX_SIDE, MIN_SIDE, SIDE_MULTIPLE, GenerateRequest

__all__ = ["MemoryEstimate", "estimate", "check", "activations", "largest_side", "UNET_SHARE", "MIB", "GIB"]

MIB = 1 << 20
GIB = 1 << 30
BASE = 32 * MIB  # graph, tokens, latents, allocator slack
VAE_PER_PIXEL = 6600  # bytes per decoded pixel (measured: 956 MiB at 384x384)
UNET_PER_LATENT = 46 * 1024  # bytes per latent pixel with flash attention (measured: 106 MiB at 48x48)
ATTENTION_PER_PAIR = 16  # bytes per pair of latent pixels without flash attention (measured: +70 MiB at 48x48)
IMAGE_PER_PIXEL = 16  # bytes per output pixel on both sides of the worker's API
UNET_SHARE = 0.85  # the UNet's part of an SD checkpoint's weights (held in VRAM while sampling)
LATENT_SCALE = 8  # image pixels per latent pixel, per side


@dataclass
class MemoryEstimate:
    """Bytes a generation needs: its parts, and the totals for RAM and (GPU) VRAM."""

    weights: int
    activations: int
    images: int
    ram: int
    vram: int  # 0 for a CPU runtime
    loaded: int = 0  # of vram: what the loaded model already holds (weights not offloaded)

    def describe(self) -> str:
        return (f"model {_gib(self.weights)} + working memory {_gib(self.activations)} + images {_gib(self.images)}")


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def activations(width: int, height: int, options: EngineOptions) -> int:
    """Working memory of one image (see the module's formula)."""
    pixels = width * height
    decoded = pixels
    if options.vae_tiling is True:  # "auto" not planned: untiled, the most it needs
        size = options.vae_tile_size if isinstance(options.vae_tile_size, int) else 32  # auto: the old default
        tile = (size * LATENT_SCALE) ** 2
        decoded = min(pixels, tile)
    latent = pixels // (LATENT_SCALE * LATENT_SCALE)
    unet = UNET_PER_LATENT * latent
    if not options.flash_attention:
        unet += ATTENTION_PER_PAIR * latent * latent
    return BASE + max(VAE_PER_PIXEL * decoded, unet)


def estimate(model_bytes: int, request: GenerateRequest, options: EngineOptions, gpu: bool = False) -> MemoryEstimate:
    act = activations(request.width, request.height, options)
    images = IMAGE_PER_PIXEL * request.width * request.height * request.batch_count
    if not gpu:
        return MemoryEstimate(model_bytes, act, images, ram=model_bytes + act + images, vram=0)
    offload = options.offload_to_cpu is not False  # "auto" not planned: the safe default (weights in RAM)
    resident = int(model_bytes * UNET_SHARE) if offload else model_bytes
    return MemoryEstimate(model_bytes, act, images, ram=model_bytes + images, vram=act + resident,
                          loaded=0 if offload else model_bytes)


def largest_side(budget: int, fixed: int, options: EngineOptions, batch: int) -> int:
    """The largest square side (a multiple of 8) whose need fits ``budget`` bytes, or 0."""
    best = 0
    low, high = MIN_SIDE // SIDE_MULTIPLE, MAX_SIDE // SIDE_MULTIPLE
    while low <= high:
        mid = (low + high) // 2
        side = mid * SIDE_MULTIPLE
        need = fixed + activations(side, side, options) + IMAGE_PER_PIXEL * side * side * batch
        if need <= budget:
            best, low = side, mid + 1
        else:
            high = mid - 1
    return best


def check(est: MemoryEstimate, request: GenerateRequest, options: EngineOptions,
          ram_available: Optional[int], vram_free: Optional[int] = None) -> None:
    """Raise :class:`InsufficientMemoryError` with the numbers and what to lower when ``est``
    does not fit (an unknown amount of memory is not checked)."""
    size = f"{request.width}x{request.height}" + (f" x{request.batch_count}" if request.batch_count > 1 else "")
    for what, need, have, fixed in (("RAM", est.ram, ram_available, est.weights if not est.vram else None),
                                    ("GPU memory", est.vram, vram_free, est.vram - est.activations)):
        if not need or have is None or need <= have:
            continue
        if fixed is None:  # on a GPU, only the weights and images live in RAM: the model is the problem
            raise InsufficientMemoryError(
                f"this generation needs about {_gib(need)} of RAM ({est.describe()}), but {_gib(have)} is available",
                hint="close other programs or use a smaller (quantized) model")
        ways = []
        side = largest_side(have, fixed, options, request.batch_count)
        if side and side < max(request.width, request.height):
            ways.append(f"a smaller image (about {side}x{side} fits: --width {side} --height {side})")
        if options.vae_tiling is not True:
            ways.append("VAE tiling (--vae-tiling)")
        if not options.flash_attention:
            ways.append("flash attention (--flash-attention)")
        if request.batch_count > 1:
            ways.append("a smaller batch (--batch-count)")
        if what == "GPU memory" and options.offload_to_cpu is False:
            ways.append("weights kept in RAM until needed (--offload-to-cpu)")
        if est.weights > have // 2:
            ways.append("a smaller (quantized) model")
        raise InsufficientMemoryError(
            f"a {size} generation needs about {_gib(need)} of {what} ({est.describe()}), "
            f"but {_gib(have)} is available",
            hint="use " + (", or ".join(ways) if ways else "a machine with more memory")
            + "; if the estimate is wrong, --no-memory-check turns the check off (memory_check: false in config.yaml)")
