"""Module names of LoRAs and models as stable-diffusion.cpp converts them, so that the two can be compared.

A LoRA names the weights it changes in one of several conventions; a model names its weights in
another. stable-diffusion.cpp brings both to its own names (``convert_tensor_name`` in
``name_conversion.cpp``) before it applies a LoRA. :func:`canonical_module` does the part of that
:mod:`accelstack.engine.request.companions` needs to tell, before anything loads, whether a LoRA touches the
model at all and with sizes that fit: kohya ``lora_unet_``/``lora_te_``/``lora_te1_``/``lora_te2_``
names (LDM or diffusers block names), sd.cpp/LDM dotted names, diffusers/PEFT names, and diffusers'
DiT names: FLUX.1's converted (``convert_diffusers_dit_to_original_flux``), Z-Image's (Lumina 2's) converted
(``convert_diffusers_dit_to_original_lumina2``), Qwen-Image's as they are.
"""
from __future__ import annotations

import re
from typing import Optional, Set, Tuple

__all__ = ["canonical_module", "LORA_PARTS", "ENCODER_PREFIXES", "KOHYA_KEPT_WORDS", "kohya_dotted", "is_kohya",
           "dotted_module",
           "COMPONENT_PREFIXES", "as_loaded",
           "UNET_ENCODER_PREFIXES"]

_PART_PREFIXES = (  # (prefix, part) of a model's or a LoRA's module names, longest first
    ("model.diffusion_model.", "unet"), ("diffusion_model.", "unet"), ("unet.", "unet"),
    ("cond_stage_model.transformer.", "te"), ("cond_stage_model.1.transformer.", "te2"),
    ("conditioner.embedders.0.transformer.", "te"), ("conditioner.embedders.1.model.", "te2"),
    ("text_encoder.2.", "te2"), ("text_encoder_2.", "te2"), ("text_encoder.", "te"), ("te.", "te"),
    ("te1.", "te"), ("te2.", "te2"),
    # a DiT's CLIPs (src/stable-diffusion.cpp new_sd_ctx): parts of their own, since a LoRA's te./te2. names map to
    # cond_stage_model. (src/name_conversion.cpp convert_tensor_name), which a DiT does not have; te1. reaches
    # CLIP-L for a Flux model only (its prefix_map override)
    ("text_encoders.clip_l.transformer.", "clip_l"), ("text_encoders.clip_g.transformer.", "clip_g"),
)
# A text encoder given as a file of its own (--clip-l, --clip-g): the prefix stable-diffusion.cpp loads
# it under for a DiT (new_sd_ctx); its tensors count as the model's for LoRAs and embeddings.
ENCODER_PREFIXES = {"clip_l": "text_encoders.clip_l.transformer.", "clip_g": "text_encoders.clip_g.transformer."}
UNET_ENCODER_PREFIXES = {"clip_l": "cond_stage_model.transformer.", "clip_g": "cond_stage_model.1.transformer."}  # is_unet
# The prefix stable-diffusion.cpp loads a component file's tensors under, kept where a name already begins with it
# (src/stable-diffusion.cpp new_sd_ctx: init_from_file(path, prefix); src/model.cpp init_from_safetensors_file,
# init_from_gguf_file): a --diffusion-model file's bare double_blocks.0... are model.diffusion_model.double_blocks.0...
COMPONENT_PREFIXES = {"diffusion_model": "model.diffusion_model.", "vae": "vae.", "t5xxl": "text_encoders.t5xxl.transformer.",
                      "llm": "text_encoders.llm.", "taesd": "tae."}


def as_loaded(name: str, prefix: str) -> str:
    """A component file's tensor name as stable-diffusion.cpp loads it under ``prefix``."""
    return name if name.startswith(prefix) else prefix + name


_KOHYA = (("lora_unet_", "unet"), ("lora_te1_", "te"), ("lora_te2_", "te2"), ("lora_te_", "te"))
# diffusers UNet block names -> LDM ones (the same formula for SD 1.x, 2.x and XL: 2 layers a block)
_RESNET_INNER = {"norm1": "in_layers_0", "conv1": "in_layers_2", "time_emb_proj": "emb_layers_1",
                 "norm2": "out_layers_0", "conv2": "out_layers_3", "conv_shortcut": "skip_connection"}
_BLOCK = re.compile(r"^(down_blocks|up_blocks)_(\d+)_(attentions|resnets)_(\d+)_(.*)$")
_MID = re.compile(r"^mid_block_(attentions|resnets)_(\d+)_(.*)$")
# the suffixes of a LoRA's tensor names (its module's name is what comes before)
LORA_PARTS = re.compile(r"(?:[._]lora[._](?:down|up|mid)|\.lora_(?:down|up|mid|A|B)(?:\.default)?|\.alpha|\.scale|\.diff(?:_b)?|"
                        r"\.hada_\w+|\.lokr_\w+|\.lora_linear)(?:\.weight)?$")


# diffusers' FLUX.1 DiT module names -> the original ones (src/name_conversion.cpp
# convert_diffusers_dit_to_original_flux): to_q/to_k/to_v (and proj_mlp) are slices of one fused weight.
_FLUX_DIFFUSERS = tuple((re.compile(pattern), target) for pattern, target in (
    (r"transformer_blocks\.(\d+)\.norm1\.linear", r"double_blocks.\1.img_mod.lin"),
    (r"transformer_blocks\.(\d+)\.norm1_context\.linear", r"double_blocks.\1.txt_mod.lin"),
    (r"transformer_blocks\.(\d+)\.attn\.to_[qkv]", r"double_blocks.\1.img_attn.qkv"),
    (r"transformer_blocks\.(\d+)\.attn\.add_[qkv]_proj", r"double_blocks.\1.txt_attn.qkv"),
    (r"transformer_blocks\.(\d+)\.attn\.to_out\.0", r"double_blocks.\1.img_attn.proj"),
    (r"transformer_blocks\.(\d+)\.attn\.to_add_out", r"double_blocks.\1.txt_attn.proj"),
    (r"transformer_blocks\.(\d+)\.ff\.net\.0\.proj", r"double_blocks.\1.img_mlp.0"),
    (r"transformer_blocks\.(\d+)\.ff\.net\.2", r"double_blocks.\1.img_mlp.2"),
    (r"transformer_blocks\.(\d+)\.ff_context\.net\.0\.proj", r"double_blocks.\1.txt_mlp.0"),
    (r"transformer_blocks\.(\d+)\.ff_context\.net\.2", r"double_blocks.\1.txt_mlp.2"),
    (r"single_transformer_blocks\.(\d+)\.norm\.linear", r"single_blocks.\1.modulation.lin"),
    (r"single_transformer_blocks\.(\d+)\.(?:attn\.to_[qkv]|proj_mlp)", r"single_blocks.\1.linear1"),
    (r"single_transformer_blocks\.(\d+)\.proj_out", r"single_blocks.\1.linear2"),
    (r"time_text_embed\.timestep_embedder\.linear_([12])", r"time_in.\1"),
    (r"time_text_embed\.text_embedder\.linear_([12])", r"vector_in.\1"),
    (r"time_text_embed\.guidance_embedder\.linear_([12])", r"guidance_in.\1"),
    (r"x_embedder", "img_in"), (r"context_embedder", "txt_in"), (r"proj_out", "final_layer.linear"),
    (r"norm_out\.linear", "final_layer.adaLN_modulation.1"),
))
_EMBEDDER_LAYER = {"1": "in_layer", "2": "out_layer"}
# diffusers' Z-Image (Lumina 2) DiT module names -> the original ones (src/name_conversion.cpp
# convert_diffusers_dit_to_original_lumina2: a prefix map): to_q/to_k/to_v are slices of the fused qkv. The
# names are Lumina 2's own, so converting them whatever the model is changes no other family's names.
_ZIMAGE_DIFFUSERS = tuple((re.compile(pattern), target) for pattern, target in (
    (r"((?:noise_refiner|context_refiner|layers)\.\d+\.attention)\.to_[qkv](?=$|\.)", r"\1.qkv"),
    (r"((?:noise_refiner|context_refiner|layers)\.\d+\.attention)\.to_out\.0(?=$|\.)", r"\1.out"),
    (r"((?:noise_refiner|context_refiner|layers)\.\d+\.attention)\.norm_([qk])(?=$|\.)", r"\1.\2_norm"),
    (r"all_x_embedder\.2-1(?=$|\.)", "x_embedder"), (r"all_final_layer\.2-1(?=$|\.)", "final_layer"),
))


def _zimage_original(name: str) -> str:
    for pattern, target in _ZIMAGE_DIFFUSERS:
        m = pattern.match(name)
        if m:
            return m.expand(target) + name[m.end():]
    return name


def _flux_from_diffusers(name: str) -> Optional[str]:
    """The original FLUX.1 module name of a diffusers DiT one (None: not a FLUX.1 DiT name)."""
    for pattern, target in _FLUX_DIFFUSERS:
        m = pattern.fullmatch(name)
        if m:
            out = m.expand(target)
            if out.startswith(("time_in.", "vector_in.", "guidance_in.")):
                head, layer = out.split(".")
                out = f"{head}.{_EMBEDDER_LAYER[layer]}"
            return out
    return None


def _ldm_unet(flat: str) -> str:
    m = _BLOCK.match(flat)
    if m:
        kind, i, inner, j, rest = m.group(1), int(m.group(2)), m.group(3), int(m.group(4)), m.group(5)
        index = 3 * i + j + 1 if kind == "down_blocks" else 3 * i + j
        if inner == "resnets":
            rest = _RESNET_INNER.get(rest, rest)
        return f"{'input' if kind == 'down_blocks' else 'output'}_blocks_{index}_{0 if inner == 'resnets' else 1}_{rest}"
    m = _MID.match(flat)
    if m:
        inner, j, rest = m.group(1), int(m.group(2)), m.group(3)
        if inner == "resnets":
            return f"middle_block_{2 * j}_{_RESNET_INNER.get(rest, rest)}"
        return f"middle_block_1_{rest}"
    return flat


def canonical_module(name: str, flux: bool = True, lora: bool = False) -> Optional[Tuple[str, str]]:
    """(part, flattened LDM module name) of a model weight or LoRA module name, or None when the
    name belongs to no part a LoRA can change (the VAE, or an unknown layout).

    ``transformer.`` is diffusers' DiT naming: a FLUX.1 model's (``flux``) is converted to the original
    names as stable-diffusion.cpp does for a Flux model only (``convert_diffusion_model_name``); other
    DiTs (Qwen-Image) keep the names, which are their own. A LoRA's (``lora``) diffusion-model names are
    converted whatever their prefix (``diffusion_model.transformer_blocks.0...`` too), as stable-diffusion.cpp
    converts every name under ``model.diffusion_model.`` for the model's version."""
    name = _without_lora_prefix(name)
    if lora and name.startswith(_BARE_DIT):  # src/name_conversion.cpp convert_tensor_name: dit_prefix_vec
        name = "transformer." + name
    if name.startswith("transformer."):
        if not flux:
            return "unet", _zimage_original(name[len("transformer."):]).replace(".", "_")
        converted = _flux_from_diffusers(name[len("transformer."):])
        return ("unet", converted.replace(".", "_")) if converted else None
    part, rest = "", ""
    for prefix, which in _KOHYA:
        if name.startswith(prefix):
            part, rest = which, name[len(prefix):]
            if lora and flux and prefix == "lora_te1_":
                part = "clip_l"  # convert_tensor_name: te1. -> text_encoders.clip_l.transformer. for Flux
            break
    else:
        for prefix, which in _PART_PREFIXES:
            if name.startswith(prefix):
                rest = name[len(prefix):]
                if lora and flux and prefix == "te1.":
                    which = "clip_l"
                if lora and flux and which == "unet":
                    rest = _flux_from_diffusers(rest) or rest
                part, rest = which, (_zimage_original(rest) if which == "unet" else rest).replace(".", "_")
                break
    if not part:
        return None
    return part, (_ldm_unet(rest) if part == "unet" else rest)


# The words whose underscores stable-diffusion.cpp keeps when it turns a kohya name's underscores into dots
# (src/name_conversion.cpp convert_sep_to_dot, 0.4.7); every other underscore becomes a dot. A DiT module
# named with other words (SD3's joint_blocks, x_block, context_block, adaLN_modulation) comes out as a
# name the model does not have, and the LoRA changes nothing ("Only (0 / N) LoRA tensors have been applied").
KOHYA_KEPT_WORDS = (
    "self_attn", "out_proj", "q_proj", "k_proj", "v_proj", "to_k", "to_q", "to_v", "to_out", "text_model",
    "down_blocks", "mid_block", "up_block", "proj_in", "proj_out", "transformer_blocks", "single_transformer_blocks",
    "single_blocks", "diffusion_model", "cond_stage_model", "first_stage_model", "conv_in", "conv_out", "lora_down",
    "lora_mid", "lora_up", "diff_b", "hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b", "hada_t1", "hada_t2",
    ".lokr_w1", ".lokr_w1_a", ".lokr_w1_b", ".lokr_w2", ".lokr_w2_a", ".lokr_w2_b", "time_emb_proj", "conv_shortcut",
    "time_embedding", "conv_norm_out", "double_blocks", "txt_attn", "img_attn", "input_blocks", "output_blocks",
    "middle_block", "skip_connection", "emb_layers", "in_layers", "out_layers", "add_q_proj", "add_k_proj",
    "add_v_proj", "add_out_proj", "ff_context", "norm_added_q", "norm_added_v", "to_add_out", "txt_mod", "img_mod",
    "txt_mlp", "img_mlp", "proj_mlp", "wi_0", "wi_1", "norm1_context", "x_embedder",
)


def dotted_module(name: str) -> Optional[str]:
    """A model weight's module name after its part's prefix, dots kept (None: no part's prefix)."""
    for prefix, _part in _PART_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):]
    return None


_BARE_DIT = ("transformer_blocks", "single_transformer_blocks")


def _without_lora_prefix(name: str) -> str:
    """The name after the prefixes stable-diffusion.cpp strips (convert_tensor_name's lora_prefix_vec). A
    LyCORIS ``lycoris_`` name is underscored throughout, as a kohya one: ``lycoris_unet_...`` reads as
    ``lora_unet_...``, ``lycoris_transformer_blocks_0_attn_to_q`` as the dotted diffusers name."""
    for prefix in ("lora.lora.", "lora."):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    if name.startswith(("lycoris_", "lycoris.")):
        rest = name[len("lycoris_"):]
        if rest.startswith(_BARE_DIT):
            return "transformer." + kohya_dotted(rest)
        return "lora_" + rest
    return name


def is_kohya(name: str) -> bool:
    """A kohya-style module name (``lora_unet_...``, ``lora_te1_...``; a ``lora.`` prefix allowed):
    underscores for dots."""
    return _without_lora_prefix(name).startswith(tuple(prefix for prefix, _part in _KOHYA))


def kohya_dotted(flat: str) -> str:
    """The dotted module name stable-diffusion.cpp reads a kohya module name ``flat`` as."""
    kept: Set[int] = set()
    for word in KOHYA_KEPT_WORDS:
        start = flat.find(word)
        while start != -1:
            kept.update(start + i for i, ch in enumerate(word) if ch == "_")
            start = flat.find(word, start + len(word))
    return "".join("." if ch == "_" and i not in kept else ch for i, ch in enumerate(flat))
