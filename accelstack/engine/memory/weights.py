"""What a model's files weigh once stable-diffusion.cpp has loaded them, part by part, from their headers.

The memory planner (:mod:`accelstack.engine.memory.plan`) counts each phase's weights: the parts
:func:`~accelstack.engine.models.inspection.inspect_model` finds (diffusion model, VAE, text encoders),
each at its bytes per parameter as loaded (F8 is widened to F16 on load, a GGUF block type keeps its
block size), the file's size shared out when the types cannot be read.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple, Union

from ..models.gguf_check import GGML_TYPE_NAMES, GGML_TYPES
from ..models.inspection import ModelInspection, inspect_model
from . import estimate as memory
from .families import LOADED_BYTES

__all__ = ["ComponentWeights", "bytes_per_parameter", "conversion_bytes", "converted_bytes", "weights_of", "components_of", "shares",
           "decode_only"]


@dataclass
class ComponentWeights:
    """The weights of one part of the model, as found in the files' headers."""

    component: str  # diffusion_model | vae | text_encoder | other
    kind: str  # family, VAE or encoder id
    parameters: int
    loaded_bytes: int  # as stable-diffusion.cpp holds them without conversion
    decoder_parameters: int = 0  # a VAE's: what a decode-only load builds (ModelPart.decoder_parameters)
    convertible: Dict[int, int] = field(default_factory=dict)  # ModelPart.convertible: {} when not read



def bytes_per_parameter(dtype: str) -> Optional[float]:
    key = dtype.upper()
    if key in LOADED_BYTES:
        return LOADED_BYTES[key]
    for type_id, name in GGML_TYPE_NAMES.items():
        if name == key and type_id in GGML_TYPES:
            block, nbytes = GGML_TYPES[type_id]
            return nbytes / block
    return None


def conversion_bytes(weight_type: str) -> float:
    found = bytes_per_parameter(weight_type)
    return found if found is not None else 2.0


def _block(weight_type: str) -> int:
    for type_id, name in GGML_TYPE_NAMES.items():
        if name == weight_type.upper() and type_id in GGML_TYPES:
            return GGML_TYPES[type_id][0]
    return 1


def converted_bytes(part: ComponentWeights, weight_type: str) -> int:
    """``part`` loaded as ``weight_type``: the tensors stable-diffusion.cpp converts at that type's size, the rest
    as loaded (:mod:`accelstack.engine.models.conversion`); every parameter converted when the tensors are unknown."""
    converted = part.convertible.get(_block(weight_type)) if part.convertible else None
    if converted is None or not part.parameters:
        return int(part.parameters * conversion_bytes(weight_type))
    kept = part.parameters - converted
    return int(converted * conversion_bytes(weight_type) + part.loaded_bytes * kept / part.parameters)


def weights_of(inspection: ModelInspection) -> List[ComponentWeights]:
    """The parts of one inspected file with their loaded sizes (the file's size shared out by
    parameters when its types are not all known)."""
    total_params = inspection.parameters or 0
    loaded = 0.0
    known = True
    for w in inspection.weight_types:
        per = bytes_per_parameter(w.dtype)
        if per is None:
            known = False
            break
        loaded += per * w.parameters
    if not known or not total_params:
        loaded = float(inspection.size_bytes)
    per_param = loaded / total_params if total_params else 0.0
    parts = [p for p in inspection.parts if p.parameters]
    if not parts or not total_params:  # no shapes (a legacy pickle) or no parts told: the file, as a diffusion model
        return [ComponentWeights("diffusion_model", inspection.family, total_params, int(loaded))]
    return [ComponentWeights(p.component, p.kind, p.parameters, int(p.parameters * per_param), p.decoder_parameters,
                             dict(p.convertible)) for p in parts]


def components_of(paths: Iterable[Union[str, Path]]) -> Tuple[str, str, List[ComponentWeights]]:
    """(family, variant, parts) of the model files: the family of the first file that names one."""
    family, variant = "unknown", ""
    parts: List[ComponentWeights] = []
    for path in paths:
        found = inspect_model(path)  # a file it cannot read is a ModelLoadError, as anywhere
        if family == "unknown" and found.family not in ("none", "unknown"):
            family, variant = found.family, found.variant
        parts += weights_of(found)
    return family, variant, parts


def shares(parts: List[ComponentWeights]) -> List[ComponentWeights]:
    """A file whose parts are unknown: shared out as an SD checkpoint is (UNet 85%)."""
    if len(parts) != 1 or parts[0].component != "diffusion_model" or parts[0].kind not in ("unknown", ""):
        return parts
    whole = parts[0]
    dm = int(whole.loaded_bytes * memory.UNET_SHARE)
    rest = whole.loaded_bytes - dm
    return [ComponentWeights("diffusion_model", whole.kind, int(whole.parameters * memory.UNET_SHARE), dm),
            ComponentWeights("text_encoder", "unknown", 0, rest * 2 // 3),
            ComponentWeights("vae", "unknown", 0, rest - rest * 2 // 3)]




def decode_only(parts: List[ComponentWeights]) -> List[ComponentWeights]:
    """The parts as a text-to-image load holds them: a VAE without its encoder (measured on lavapipe:
    the Vulkan backend's VAE buffer was the decoder's size, 1.69 times less than the whole SD VAE)."""
    out = []
    for p in parts:
        if p.component == "vae" and 0 < p.decoder_parameters < p.parameters:
            share = p.decoder_parameters / p.parameters  # the conversion's share taken as the whole VAE's
            p = ComponentWeights("vae", p.kind, p.decoder_parameters, int(p.loaded_bytes * share), p.decoder_parameters,
                                 {b: int(n * share) for b, n in p.convertible.items()})
        out.append(p)
    return out
