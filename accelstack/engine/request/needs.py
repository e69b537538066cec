"""Companions the family normally runs with: a warning naming the usual file when one is left out.

:func:`~accelstack.engine.request.components.check_components` refuses what stable-diffusion.cpp cannot
run without (no VAE, no text encoder at all). A family that runs with one encoder missing is not
refused, but its images are poorly conditioned and nothing said why: FLUX.1 without T5-XXL (and
Chroma without its only one, T5) gets zeros in its place (src/conditioner.hpp FluxCLIPEmbedder,
T5CLIPEmbedder: a warning in the runtime's log only), while ``model inspect`` says T5-XXL is needed.
Each encoder kind the family takes (data/model_families.json ``text_encoders``) that neither the model
file nor a flag gives is a warning in the result and on the terminal, naming the flag and the usual file.
"""
from __future__ import annotations

from typing import List, Set

from ..errors import ModelLoadError
from ..models.families import knowledge
from ..models.inspection import inspect_model
from ..worker.protocol import GenerateRequest, flag_of
from .components import TEXT_ENCODER_KINDS, CheckedComponents

__all__ = ["companion_warnings"]


def companion_warnings(request: GenerateRequest, model: str, found: CheckedComponents) -> List[str]:
    """One line per text encoder the family normally runs with and the request lacks."""
    rule = knowledge().by_id.get(found.family)
    if rule is None or not rule.text_encoders:
        return []
    try:
        parts = inspect_model(found.model.path).parts
    except ModelLoadError:  # a legacy pickle: its parts are not told from its headers
        return []
    have: Set[str] = {p.kind for p in parts if p.component == "text_encoder"}
    for name, kinds in TEXT_ENCODER_KINDS.items():
        if getattr(request, name):
            have |= set(kinds)
    out = []
    names = {e.id: e for e in knowledge().encoders}
    for kind in rule.text_encoders:
        if kind in have:
            continue
        flag = next((flag_of(n) for n, kinds in TEXT_ENCODER_KINDS.items() if kind in kinds), "--clip-l")
        enc = names.get(kind)
        usual = f" {enc.files[0]}" if enc is not None and enc.files else ""
        out.append(f"{rule.name} normally runs with its {enc.name if enc else kind} text encoder, which neither "
                   f"the model file nor the request gives: stable-diffusion.cpp puts zeros in its place "
                   f"(src/conditioner.hpp), so the image follows the prompt poorly; add {flag}{usual}")
    return out
