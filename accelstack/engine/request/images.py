"""Reference images (``--ref-image``, repeatable) and the inpainting mask (``--mask``): checked like
``--init-image`` before any worker starts, and against the model's family.

stable-diffusion.cpp VAE-encodes each reference image to a latent that only the edit-capable diffusion
models read (data/family_settings.json ``ref_images``: FLUX.1 Kontext, FLUX.2, Qwen-Image-Edit, Z-Image,
Anima); any other family would ignore them, so they are refused there. A mask marks (white) what of the
init image is redrawn (src/stable-diffusion.cpp: rounded to 0/1, applied to the latent); it must be the
init image's size and comes only with one. Each is read by the bounded PNG reader, with the request's
size (nothing is resized: the pixels the worker gets are the user's).

The init and reference images are VAE-encoded (src/stable-diffusion.cpp encode_first_stage; with
``--taesd`` the tiny autoencoder encodes them): a VAE file that holds only its decoder fails the
model's load there ("first_stage_model.encoder.norm_out.bias not in model file", measured), so it is
refused here, naming the flag and the VAE (:func:`check_encoder`).
"""
from __future__ import annotations

import os
from typing import List, Optional, Tuple

from ..errors import InvalidRequestError
from ..models.check import check_model, tensor_index
from ..models.families import knowledge
from ..models.inspection import inspect_model
from ..models.settings import family_settings, settings_for
from ..worker.protocol import GenerateRequest, read_pixels
from .components import CheckedComponents, _read_image

__all__ = ["check_edit_images", "check_encoder", "edit_families"]


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
    return mask_grey(mask), ref_rgb


def mask_grey(rgb: bytes) -> bytes:
    """The mask as grey RGB in sd-cli's luma, (77 R + 150 G + 29 B) >> 8 (it reads a mask as one channel:
    thirdparty/stb_image.h stbi__compute_y). The bindings convert RGB with Pillow's 0.299/0.587/0.114 luma, one
    off on many greys (an anti-aliased edge redrawn otherwise); a grey pixel they keep exactly."""
    out = bytearray(len(rgb))
    for i in range(0, len(rgb) - 2, 3):
        y = (77 * rgb[i] + 150 * rgb[i + 1] + 29 * rgb[i + 2]) >> 8
        out[i] = out[i + 1] = out[i + 2] = y
    return bytes(out)


def _encoder_missing(request: GenerateRequest, model: Optional[str], found: CheckedComponents) -> str:
    """What of the autoencoder that would encode lacks its encoder ("the VAE (--vae ae.safetensors)"), or ""."""
    taesd, vae = found.paths.get("taesd"), found.paths.get("vae")  # the checked, absolute paths
    if taesd:  # the tiny autoencoder does both (diffusers AutoencoderTiny names: encoder.layers.*)
        tensors = tensor_index(check_model(taesd)) or []
        if tensors and not any(t.name.startswith("encoder.") for t in tensors):
            return f"the tiny autoencoder (--taesd {os.path.basename(taesd)})"
        return ""
    path = vae or (found.model.path if request.diffusion_model else model or "")
    if not path:
        return ""
    vaes = [p for p in inspect_model(path).parts if p.component == "vae"]
    # a decode-only load builds the decoder and post_quant_conv (engine.models.inspection ModelPart.decoder_parameters)
    if vaes and all(0 < p.parameters == p.decoder_parameters for p in vaes):
        return f"the VAE ({'--vae ' if vae else ''}{os.path.basename(path)})"
    return ""


def check_encoder(request: GenerateRequest, model: Optional[str], found: CheckedComponents) -> None:
    """InvalidRequestError naming the flag when an image to encode meets an autoencoder that holds no encoder."""
    flag = "--init-image" if (request.init_image or request.init_pixels) else \
        "--ref-image" if (request.ref_images or request.ref_pixels) else ""
    what = _encoder_missing(request, model, found) if flag else ""
    if what:
        raise InvalidRequestError(
            f"{flag}: {what} holds only its decoder: stable-diffusion.cpp encodes the "
            f"{'init' if flag == '--init-image' else 'reference'} image with it (src/stable-diffusion.cpp "
            "encode_first_stage) and fails the load of a file without the encoder",
            hint="use the full VAE (its encoder.* tensors too), as the model's release ships it, or leave out "
                 f"{flag} for text-to-image")
