"""Files that are no model but that ``generate`` takes beside one: a LoRA or LyCORIS (``--lora-dir``), a ControlNet
(``--control-net``), a textual-inversion embedding (``--embeddings-dir``), a tiny autoencoder (``--taesd``) and an
ESRGAN upscaler, told from their tensor names and shapes as ``generate``'s checks and stable-diffusion.cpp tell
them, so that ``model inspect`` never calls one an unknown family, or a ControlNet "an SD 1.x diffusion model".
"""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import List, Optional, Set, Tuple

from ..loras.names import LORA_PARTS, canonical_module
from .reader import TensorInfo

__all__ = ["RoleDetails", "file_role", "CONTEXT_FAMILIES", "HINT_BLOCK"]

# The width of the text vectors a UNet's cross-attention takes, by family (src/model.cpp get_sd_version; the
# ControlNet check of engine/request/components.py uses the same table).
CONTEXT_FAMILIES = {768: "sd1", 1024: "sd2", 2048: "sdxl"}
HINT_BLOCK = "input_hint_block."  # the control image's encoder (src/control.hpp): what makes a file a ControlNet
_EMBEDDING_WIDTHS = {768: "sd1", 1024: "sd2", 1280: "sdxl"}  # CLIP-L, OpenCLIP-H, OpenCLIP-G token widths
MAX_EMBEDDING_TENSORS = 8  # an A1111 .pt: string_to_param, string_to_token...; an SDXL one: clip_l, clip_g
MAX_EMBEDDING_VECTORS = 75  # one prompt chunk (engine/request/companions.py refuses more)


@dataclass
class RoleDetails:
    """What a file of such a role holds: ``kind`` (LoRA, LoHa, LoKr, ControlNet, embedding, TAESD, ESRGAN) and
    the figures that matter for it (None where they do not apply)."""

    kind: str
    rank: Optional[int] = None  # a LoRA's: the rank most of its modules have
    modules: Optional[int] = None  # a LoRA's: the model weights it names
    width: Optional[int] = None  # an embedding's vectors; a TAESD's latent channels
    vectors: Optional[int] = None  # an embedding's: the prompt tokens it stands for
    scale: Optional[int] = None  # an upscaler's factor


def file_role(tensors: List[TensorInfo]) -> Optional[Tuple[str, str, RoleDetails, str]]:
    """(role, family id or "none", details, evidence) of a file of one of these roles; None for any other file."""
    names = [t.name for t in tensors]
    if names and 2 * sum(1 for n in names if LORA_PARTS.search(n)) >= len(names):
        return _lora(tensors)
    if any(HINT_BLOCK in n for n in names):
        widths = sorted({int(t.shape[1]) for t in tensors if t.name.endswith("attn2.to_k.weight") and len(t.shape) == 2})
        family = CONTEXT_FAMILIES.get(widths[0], "unknown") if widths else "unknown"
        why = f"its cross-attention takes {widths[0]}-wide text vectors" if widths else "no cross-attention width found"
        return "controlnet", family, RoleDetails("ControlNet"), f"{HINT_BLOCK} (the control image's encoder); {why}"
    if any(n.startswith("decoder.layers.") for n in names):
        first = next((t for t in tensors if t.name == "decoder.layers.0.weight" and len(t.shape) == 4), None)
        latent = int(first.shape[1]) if first else None
        return "taesd", "none", RoleDetails("TAESD", width=latent), "decoder.layers.N (a tiny autoencoder, src/tae.hpp)"
    if ("conv_first.weight" in names and any(n.startswith("body.") for n in names)) or (
            "model.0.weight" in names and any(n.startswith("model.1.sub.") for n in names)):
        scale = 4 if "conv_up2.weight" in names or any(n.startswith("model.8.") for n in names) else 2
        return "upscaler", "none", RoleDetails("ESRGAN", scale=scale), "conv_first/body.N.rdbN (src/esrgan.hpp)"
    return _embedding(tensors)


def _lora(tensors: List[TensorInfo]) -> Tuple[str, str, RoleDetails, str]:
    suffixes = {m.group(0).lstrip("._").split(".")[0] for m in map(LORA_PARTS.search, (t.name for t in tensors)) if m}
    kind = "LoHa" if any(s.startswith("hada_") for s in suffixes) else \
        "LoKr" if any(s.startswith("lokr_") for s in suffixes) else "LoRA"
    flux = any("double_blocks" in t.name or "single_blocks" in t.name or "single_transformer_blocks" in t.name
               for t in tensors)
    keys: Set[Tuple[str, str]] = set()
    ranks: collections.Counter[int] = collections.Counter()
    context, te_width = 0, 0
    for t in tensors:
        m = LORA_PARTS.search(t.name)
        if not m:
            continue
        key = canonical_module(t.name[:m.start()], flux, lora=True)
        if key is None:
            continue
        keys.add(key)
        down = m.group(0).lstrip("._").split(".")[0] in ("lora_down", "lora_A", "hada_w1_b", "lokr_w1_b", "lokr_w2_b") \
            or m.group(0) in ("_lora.down.weight", ".lora.down.weight")
        if down and len(t.shape) >= 2:
            ranks[int(t.shape[0])] += 1
            if key[1].endswith("attn2_to_k"):
                context = int(t.shape[1])
            if key[0] == "te" and key[1].endswith("q_proj"):
                te_width = int(t.shape[1])
    family, why = _lora_family(keys, context, te_width, flux)
    rank = ranks.most_common(1)[0][0] if ranks else None
    return "lora", family, RoleDetails(kind, rank=rank, modules=len(keys)), why


def _lora_family(keys: Set[Tuple[str, str]], context: int, te_width: int, flux: bool) -> Tuple[str, str]:
    unet = [flat for part, flat in keys if part == "unet"]
    parts = {part for part, _flat in keys}
    if flux:
        return "flux", "module names of the FLUX.1 transformer (double_blocks, single_blocks)"
    if any(f.startswith("joint_blocks_") for f in unet):
        return "sd3", "module names of the SD3 MMDiT (joint_blocks)"
    if any(f.startswith(("layers_", "noise_refiner_", "context_refiner_")) for f in unet):
        return "z-image", "module names of the Z-Image (Lumina 2) transformer (layers, noise_refiner)"
    if any(f.startswith("transformer_blocks_") and ("img_mod" in f or "txt_mod" in f or "img_mlp" in f) for f in unet):
        return "qwen-image", "module names of the Qwen-Image transformer (transformer_blocks.N.img_mod ...)"
    if context in CONTEXT_FAMILIES:
        return CONTEXT_FAMILIES[context], f"its attn2.to_k takes {context}-wide text vectors"
    if "te2" in parts:
        return "sdxl", "modules of two text encoders (lora_te1_, lora_te2_)"
    if te_width in (768, 1024):
        return ("sd1" if te_width == 768 else "sd2"), f"its text encoder is {te_width} wide"
    if any(f.startswith(("input_blocks_", "output_blocks_", "middle_block_")) for f in unet):
        return "sd1", "UNet module names (input_blocks ...), of SD 1.x's widths or SD 2.x's: no cross-attention told them apart"
    return "unknown", "its module names are of no family's model told here"


def _embedding(tensors: List[TensorInfo]) -> Optional[Tuple[str, str, RoleDetails, str]]:
    vectors = [t for t in tensors if t.shape and not t.dtype.upper().startswith(("I", "U", "BOOL"))]
    if not vectors or len(tensors) > MAX_EMBEDDING_TENSORS or any(len(t.shape) > 2 for t in vectors):
        return None
    widths = {int(t.shape[-1]) for t in vectors}
    if not widths <= set(_EMBEDDING_WIDTHS):
        return None
    rows = max(int(t.shape[0]) if len(t.shape) == 2 else 1 for t in vectors)
    if rows > MAX_EMBEDDING_VECTORS or any(".weight" in t.name for t in vectors):  # a text encoder's layers are no vectors
        return None
    family = "sdxl" if widths == {768, 1280} else _EMBEDDING_WIDTHS[max(widths)]
    width = max(widths)
    return ("embedding", family, RoleDetails("embedding", width=width, vectors=rows),
            f"{len(vectors)} tensor{'s' * (len(vectors) != 1)} of {'/'.join(map(str, sorted(widths)))}-wide vectors "
            "(a CLIP text encoder's token width)")
