"""Request values that are the model's unless given, and the image pixel files: for the protocol.

Imported by the worker too, so the standard library only. A request's ``cfg_scale`` and ``steps``
left out are the family's reference settings (:mod:`accelstack.engine.models.settings`: Flux runs
at cfg 1, SD 3.x at 4.5), yet a value given always wins, even one equal to the engine's default: so
"not given" is a marked value (:data:`DEFAULT_CFG_SCALE` is a ``float`` 7.0 that :func:`is_given`
tells from a 7.0 the caller wrote). Distilled guidance and flow shift are ``None`` until resolved.
"""
from __future__ import annotations

import math
import os
import stat
from typing import TYPE_CHECKING, Any

from ...limits import MAX_CFG_SCALE
from ..errors import InvalidRequestError

if TYPE_CHECKING:
    from .protocol import GenerateRequest

__all__ = ["DEFAULT_CFG_SCALE", "DEFAULT_STEPS", "is_given", "check_guidance", "read_pixels", "MAX_GUIDANCE",
           "MAX_FLOW_SHIFT", "RUNTIME_GUIDANCE", "IMAGE_FLAGS", "MAX_REF_IMAGES", "check_edit_images"]

MAX_GUIDANCE = MAX_CFG_SCALE  # distilled guidance is trained for about 1 to 10 (Flux dev 3.5)
MAX_FLOW_SHIFT = 100.0  # the shift of flow models' timesteps (Qwen-Image 3, SD 3.x 3, Wan 3 to 12)
IMAGE_FLAGS = {"mask_image": "--mask", "ref_images": "--ref-image"}  # the command-line flag of these fields
MAX_REF_IMAGES = 8  # FLUX.2 takes several; each is encoded and attended to at every step: 8 is far past usual
RUNTIME_GUIDANCE = 3.5  # the bindings' own default (stable_diffusion.py generate_image guidance=3.5)


class _NotGivenFloat(float):
    """A float the caller did not give: the family's value takes its place."""


class _NotGivenInt(int):
    """An int the caller did not give: the family's value takes its place."""


DEFAULT_CFG_SCALE: float = _NotGivenFloat(7.0)  # the engine's default, where the family has none
DEFAULT_STEPS: int = _NotGivenInt(20)


def is_given(value: Any) -> bool:
    """False for a request's default that the family's settings replace."""
    return not isinstance(value, (_NotGivenFloat, _NotGivenInt))


def check_guidance(request: GenerateRequest) -> None:
    """Distilled guidance and flow shift: None or a finite number in range, else InvalidRequestError."""
    for name, low, top in (("guidance", 0.0, MAX_GUIDANCE), ("flow_shift", 0.0, MAX_FLOW_SHIFT)):
        v = getattr(request, name)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not low <= v <= top \
                or (name == "flow_shift" and v == 0):
            shown = repr(v)[:40] if isinstance(v, (int, float, str)) else f"a {type(v).__name__}"
            raise InvalidRequestError(f"--{name.replace('_', '-')} must be a number from {low:g} to {top:g}"
                                      f"{' (not 0)' if name == 'flow_shift' else ''}, got {shown}",
                                      hint="leave it out for the model family's own value")


def check_edit_images(request: GenerateRequest) -> None:
    """Reference images a list of at most :data:`MAX_REF_IMAGES` paths (and their pixel files), a mask only
    with the init image it masks; else InvalidRequestError naming the flag."""
    for name in ("ref_images", "ref_pixels"):
        v = getattr(request, name)
        if not isinstance(v, list) or len(v) > MAX_REF_IMAGES or \
                not all(isinstance(p, str) and p and "\x00" not in p and len(p) <= 4096 for p in v):
            raise InvalidRequestError(f"--ref-image must be given as at most {MAX_REF_IMAGES} PNG file paths",
                                      hint="repeat --ref-image PNG for each reference image")
    if (request.mask_image or request.mask_pixels) and not (request.init_image or request.init_pixels):
        raise InvalidRequestError("a mask is given (--mask) without the init image it marks for redrawing",
                                  hint="add --init-image PNG (the picture to inpaint), of the mask's size")
    if not isinstance(request.mask_pixels, str) or "\x00" in request.mask_pixels or len(request.mask_pixels) > 4096:
        raise InvalidRequestError("mask pixels must be the path of a file of RGB pixels")


def read_pixels(path: str, request: GenerateRequest) -> bytes:
    """The RGB bytes of an image file the parent wrote (``init_pixels``/``control_pixels``): a regular
    file of exactly width x height x 3 bytes, else :class:`InvalidRequestError`."""
    want = request.width * request.height * 3
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise InvalidRequestError(f"cannot read the image pixels {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size != want:
            raise InvalidRequestError(f"the image pixels {path} are not a file of {request.width}x{request.height} "
                                      f"RGB pixels ({want} bytes)")
        data = fh.read(want + 1)
    if len(data) != want:
        raise InvalidRequestError(f"the image pixels {path} changed while read")
    return data
