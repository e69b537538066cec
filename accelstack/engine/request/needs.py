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

from ..errors import InvalidRequestError, ModelLoadError
from ..models.families import knowledge
from ..models.inspection import inspect_model
from ..worker.protocol import GenerateRequest, flag_of
from .components import TEXT_ENCODER_KINDS, CheckedComponents

__all__ = ["companion_warnings"]


def _usual(kind: str) -> str:
    """``--flag usual-file`` for a text-encoder kind."""
    flag = next((flag_of(n) for n, kinds in TEXT_ENCODER_KINDS.items() if kind in kinds), "--clip-l")
    enc = next((e for e in knowledge().encoders if e.id == kind), None)
    return f"{flag} {enc.files[0]}" if enc is not None and enc.files else flag


def companion_warnings(request: GenerateRequest, model: str, found: CheckedComponents) -> List[str]:
    """One line per text encoder the family normally runs with and the request lacks; InvalidRequestError
    for an LLM family's variant without its LLM, or with another variant's (FLUX.2 dev: Mistral Small 3.2,
    klein: Qwen3; src/conditioner.hpp LLMEmbedder always builds the variant's LLM: the load fails)."""
    rule = knowledge().by_id.get(found.family)
    if rule is None or not rule.text_encoders:
        return []
    try:
        insp = inspect_model(found.model.path)
    except ModelLoadError:  # a legacy pickle: its parts are not told from its headers
        return []
    variant = next((v for v in rule.variants if v.id == insp.variant and v.text_encoders), None)
    wanted = variant.text_encoders if variant is not None else rule.text_encoders
    have: Set[str] = {p.kind for p in insp.parts if p.component == "text_encoder"}
    if request.llm:
        given = {p.kind for p in inspect_model(request.llm).parts if p.component == "text_encoder"}
        if variant is not None and not given & set(wanted):
            raise InvalidRequestError(f"--llm {request.llm}: it is a {', '.join(sorted(given))} text encoder; "
                                      f"{variant.name} runs {', '.join(wanted)} (src/conditioner.hpp LLMEmbedder)",
                                      hint=f"give {_usual(wanted[0])}")
    for name, kinds in TEXT_ENCODER_KINDS.items():
        if getattr(request, name):
            have |= set(kinds)
    if variant is not None and not have & set(wanted):  # its LLM: always built, the load fails without it
        raise InvalidRequestError(f"{flag_of('diffusion_model') if request.diffusion_model else '--model'} "
                                  f"{found.model.path}: {variant.name} needs its LLM text encoder, "
                                  f"{', '.join(wanted)}, which src/conditioner.hpp LLMEmbedder always builds: "
                                  "without it the load fails", hint=f"add {_usual(wanted[0])}")
    names = {e.id: e for e in knowledge().encoders}
    return [f"{rule.name} normally runs with its {names[kind].name if kind in names else kind} text encoder, which "
            f"neither the model file nor the request gives: stable-diffusion.cpp puts zeros in its place "
            f"(src/conditioner.hpp), so the image follows the prompt poorly; add {_usual(kind)}"
            for kind in wanted if kind not in have]
