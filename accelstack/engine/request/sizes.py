"""Honest sizes: a size the model's family cannot make exactly is refused, with the nearest it can.

stable-diffusion.cpp aligns every requested size *up* to its family's multiple (src/stable-diffusion.cpp
``align_image_size``: the VAE's scale factor times the diffusion model's down factor; 64 for the
UNet families) with only a warning in its log, so an SD 1.x model asked for 96x72 made 128x128 while
the result and the PNG's parameters said 96x72. The rule is data (:mod:`accelstack.engine.models.settings`)
and is checked with the model's family, before any worker generates: the image made is the size asked for.
"""
from __future__ import annotations

from typing import List, Tuple

from ..errors import InvalidRequestError
from ..models.families import knowledge
from ..models.settings import settings_for
from ..worker.protocol import MAX_SIDE, MIN_SIDE, GenerateRequest, flag_of

__all__ = ["check_size", "nearest_sizes", "UNKNOWN_MULTIPLE"]

# A model whose family its headers do not tell (a legacy pickle): those are SD 1.x/2.x/XL checkpoints in
# practice, UNets, which stable-diffusion.cpp aligns to 64 (vae 8 x down factor 8).
UNKNOWN_MULTIPLE = 64


def _around(side: int, multiple: int) -> List[int]:
    low = max(multiple * (side // multiple), -(-MIN_SIDE // multiple) * multiple)
    high = min(low + multiple if low < side else low, MAX_SIDE // multiple * multiple)
    return sorted({low, high})


def nearest_sizes(width: int, height: int, multiple: int) -> List[Tuple[int, int]]:
    """The sizes next to ``width`` x ``height`` that are multiples of ``multiple``, nearest first."""
    sizes = [(w, h) for w in _around(width, multiple) for h in _around(height, multiple)]
    return sorted(sizes, key=lambda s: (abs(s[0] - width) + abs(s[1] - height), abs(s[0] * height - s[1] * width), s))


def check_size(request: GenerateRequest, family: str) -> None:
    """InvalidRequestError when ``family`` cannot make ``request``'s size exactly: naming the flag the
    size came from (--width/--height, or the image that set it), the rule and its source, and the nearest sizes."""
    rule = settings_for(family)
    multiple, why = rule.size_multiple, "src/stable-diffusion.cpp align_image_size, src/vae.hpp get_scale_factor"
    if family in ("unknown", "none") or not rule.size_source:
        multiple, why = UNKNOWN_MULTIPLE, ("its family is not told from its file, and stable-diffusion.cpp aligns the UNet "
                                           "models such files hold to 64: src/stable-diffusion.cpp align_image_size")
    bad = [name for name in ("width", "height") if getattr(request, name) % multiple]
    if not bad:
        return
    w, h = request.width, request.height
    image = next((name for name in ("init_image", "control_image") if getattr(request, name)), "")
    flags = f"{flag_of(image)} {getattr(request, image)} (its size is the request's)" if image else \
        " and ".join(flag_of(name) for name in bad)
    rules = knowledge().by_id
    what = f"this {rules[family].name}" if family in rules else "this"
    near = " or ".join(f"{a}x{b}" for a, b in nearest_sizes(w, h, multiple)[:4])
    raise InvalidRequestError(
        f"{flags}: {what} model cannot make {w}x{h} exactly: its sizes are multiples of {multiple} (stable-diffusion.cpp "
        f"would silently make a larger image; {why}); the nearest it can make: {near}",
        hint=(f"resize the image to {near.split(' or ')[0]}" if image else
              f"generate at --width {nearest_sizes(w, h, multiple)[0][0]} --height {nearest_sizes(w, h, multiple)[0][1]}"))
