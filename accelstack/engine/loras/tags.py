"""``<lora:`` tags stable-diffusion.cpp would not read: refused, since each is a typo the user wants to hear of.

The bindings take a LoRA tag only as ``<lora:([^:>]+):([^>]+)>`` (stable_diffusion.py
``_extract_and_build_loras``; the same regex as examples/common/common.cpp ``extract_and_remove_lora``),
so ``<lora:NAME>`` (A1111's tag without a weight), ``<lora:NAME:>``, ``<lora::1>`` or an unclosed tag load
no LoRA and stay in the prompt, encoded as text. Standard library only: the request's validation, which
the worker imports too, may use it.
"""
from __future__ import annotations

import re

from ..errors import InvalidRequestError

__all__ = ["check_lora_tag_syntax"]

_READ = re.compile(r"<lora:([^:>]+):([^>]+)>", re.IGNORECASE)  # what the bindings read (any case: refused later)
_START = re.compile(r"<lora:", re.IGNORECASE)
_NAME = re.compile(r"[^:>]*")


def check_lora_tag_syntax(text: str) -> None:
    """InvalidRequestError for the first ``<lora:`` of ``text`` that does not begin a tag the bindings read
    (a ``<lora:`` inside a tag they read is part of it, as their search consumes it)."""
    pos = 0
    while True:
        start = _START.search(text, pos)
        if start is None:
            return
        tag = _READ.match(text, start.start())
        if tag is not None:
            pos = tag.end()
            continue
        found = _NAME.match(text, start.end())
        name = found.group(0).strip()[:60] if found else ""
        shown = text[start.start():text.find(">", start.start()) + 1 or start.start() + 40][:60]
        raise InvalidRequestError(
            f"the tag {shown!r} is not a complete <lora:NAME:WEIGHT> tag: stable-diffusion.cpp would load no LoRA "
            "for it and leave it in the prompt as text",
            hint=f"write it as <lora:{name or 'NAME'}:1>, with the weight it needs (such as 1 or 0.8), or remove it")
