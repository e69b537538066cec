"""Reference images (``--ref-image``, repeatable) and the inpainting mask (``--mask``): checked like
``--init-image`` before any worker starts, and against the model's family.

stable-diffusion.cpp VAE-encodes each reference image to a latent that only the edit-capable diffusion
models read (data/family_settings.json ``ref_images``: FLUX.1 Kontext, FLUX.2, Qwen-Image-Edit, Z-Image,
Anima); any other family would ignore them, so they are refused there. A mask marks (white) what of the
init image is redrawn (src/stable-diffusion.cpp: rounded to 0/1, applied to the latent); it must be the
init image's size and comes only with one. Each is read by the bounded PNG reader, with the request's
size (nothing is resized: the pixels the worker gets are the user's).
"""
from __future__ import annotations

from typing import List, Tuple

from ..errors import InvalidRequestError
from ..models.families import knowledge
from ..models.settings import family_settings, settings_for
from ..worker.protocol import GenerateRequest, read_pixels
from .components import CheckedComponents, _read_image

__all__ = ["check_edit_images", "edit_families"]


def edit_families() -> List[str]:
    """The families that read reference images (data/family_settings.json)."""
    return sorted(f for f, rule in family_settings().items() if rule.ref_images)


def check_edit_images(request: GenerateRequest, found: CheckedComponents, library: str = "",
                      supported: bool = True) -> Tuple[bytes, List[bytes]]:
    """(mask RGB, [reference RGB...]) of ``request``, read and checked; InvalidRequestError naming the flag."""
    refs = request.ref_images or request.ref_pixels
    if (refs or request.mask_image or request.mask_pixels) and not supported:
        raise InvalidRequestError(f"{'--ref-image' if refs else '--mask'}: not supported on the {library} stack",
                                  hint="generate with a stable-diffusion.cpp runtime, or leave them out")
    if refs and not settings_for(found.family).ref_images:
        rule = knowledge().by_id.get(found.family)
        raise InvalidRequestError(
            f"--ref-image: the model's family, {rule.name if rule else found.family}, reads no reference images: "
            f"stable-diffusion.cpp gives them only to {', '.join(edit_families())} (FLUX.1 Kontext, FLUX.2, "
            "Qwen-Image-Edit...; src/stable-diffusion.cpp ref_latents)",
            hint="leave out --ref-image, or use an edit model (flux1-kontext-dev, Qwen-Image-Edit, FLUX.2); "
                 "to start from a picture use --init-image")
    ref_rgb = [_read_image("ref_images", path, request) for path in request.ref_images] or \
        [read_pixels(path, request) for path in request.ref_pixels]
    mask = _read_image("mask_image", request.mask_image, request) if request.mask_image else \
        read_pixels(request.mask_pixels, request) if request.mask_pixels else b""
    return mask, ref_rgb
