"""The family's reference settings for what a request leaves out; a value given always wins.

Each family is run as its makers and stable-diffusion.cpp's docs run it (data/family_settings.json,
each entry with its source): FLUX.1 at cfg 1 (no unconditional pass: it is guidance-distilled) with
distilled guidance 3.5, SD 3.x at cfg 4.5, Qwen-Image at cfg 2.5 with flow shift 3. Before this, every
family ran at SD's cfg 7: for Flux an extra unconditional pass a step and over-guided images. Which
fields were left out is told by :func:`~accelstack.engine.worker.values.is_given`; "default" sampler
and scheduler are the family's where it names one, else the runtime's own choice.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict

from ..models.settings import settings_for
from ..worker.protocol import GenerateRequest
from ..worker.values import is_given

__all__ = ["apply_defaults", "ENGINE_CFG_SCALE", "ENGINE_STEPS"]

ENGINE_CFG_SCALE, ENGINE_STEPS = 7.0, 20  # where the family has no reference value (stable-diffusion.cpp's CLI defaults)


def apply_defaults(request: GenerateRequest, family: str, *, family_rules: bool = True) -> GenerateRequest:
    """``request`` with every value left out made concrete: the family's (``family_rules``), else the
    engine's defaults. Values the caller gave are kept as they are."""
    ref: Dict[str, Any] = settings_for(family).defaults if family_rules else {}
    changes: Dict[str, Any] = {
        "cfg_scale": float(request.cfg_scale if is_given(request.cfg_scale) else ref.get("cfg_scale", ENGINE_CFG_SCALE)),
        "steps": int(request.steps if is_given(request.steps) else ref.get("steps", ENGINE_STEPS)),
    }
    for name in ("sampler", "scheduler"):
        if getattr(request, name) == "default" and name in ref:
            changes[name] = ref[name]
    for name in ("guidance", "flow_shift"):
        if getattr(request, name) is None and name in ref:
            changes[name] = float(ref[name])
    return dataclasses.replace(request, **changes)
