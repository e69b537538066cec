"""Per-family probe models: the smallest model of each family that stable-diffusion.cpp loads as that family.

``verify`` proves a runtime with the SD 1.x probe (:mod:`accelstack.engine.probes.model`). A PASS
there says nothing about the kernels another family runs (Flux's rotary attention and RMS norms,
SD3's joint blocks...), so ``verify --family F`` synthesizes a *reduced* probe of family ``F`` in
the same way (seeded pooled values, F8_E5M2 stored, one safetensors file, temporary folder with an
owner, swept when the owner is gone: :mod:`accelstack.engine.probes.family_files`), and generates
with it.

How small each family can be is decided by stable-diffusion.cpp, which infers most sizes from the
tensors it finds (the source of each fact is cited where the shapes are built):

* **sd2**: the SD 1.x UNet's widths with a 1024-wide context and linear projections (src/unet.hpp;
  a 1024-wide token embedding makes it SD 2.x, src/model.cpp), OpenCLIP-H (24 x 1024, fixed in
  src/clip.hpp): 1.22 G. v- or eps-prediction is decided by running the UNet once
  (``is_using_v_parameterization_for_sd2``): the random probe comes out eps (a scaling, not a kernel).
* **flux** (FLUX.1): the hidden size comes from ``txt_in.weight``, the head size from the q/k norm
  scales and the depths from the block names (``FluxRunner`` in src/flux.hpp); the rotary axes
  (16, 56, 56) fix the head size at 128, so one head of 128, one double and one single block. The
  text context width is T5-XXL's 4096 (``txt_in``'s input) even without T5: with only CLIP-L,
  stable-diffusion.cpp warns and feeds zeros of that width (``FluxCLIPEmbedder`` in
  src/conditioner.hpp), so no T5 (24 layers x 4096, fixed in src/t5.hpp: 4.8 G parameters) is
  needed. CLIP-L's size is fixed (``CLIPTextModel`` in src/clip.hpp: 123 M). The 16-channel VAE's
  decoder width is read from ``decoder.conv_in`` (``detect_decoder_ch`` in src/auto_encoder_kl.hpp),
  and the worker loads it decode-only, so the decoder is a quarter-width one without encoder.
  ``guidance_in`` makes it FLUX.1 [dev] (the guidance embedding, src/flux.hpp).
* **chroma**: the same Flux blocks without their per-block modulations; ``distilled_guidance_layer``
  makes stable-diffusion.cpp build Chroma (src/stable-diffusion.cpp ``new_sd_ctx``, src/flux.hpp
  ``FluxRunner``), whose ``ChromaApproximator`` is fixed at 5 layers of 5120 (262 M parameters,
  fed 344 modulation indices whatever the depth): most of the probe. Its text encoder is T5-XXL
  only; without it stable-diffusion.cpp warns and uses zeros (``T5CLIPEmbedder``). Flash attention
  is off for this probe: stable-diffusion.cpp warns that Chroma's DiT mask does not work with it,
  and the image is NaN (all white) with it on the CPU build.

* **sdxl**: the UNet's widths are fixed (src/unet.hpp ``UnetModelBlock``); the smallest layout it
  detects is Segmind Vega's (``get_sd_version`` in src/model.cpp says ``VERSION_SDXL_VEGA`` when
  ``mid_block.resnets.1`` and ``up_blocks.1.attentions.0.transformer_blocks.1`` are missing: transformer
  depths 1/1/2 and a middle block of one ResBlock), 745 M parameters; SDXL's conditioner always builds
  CLIP-G (694 M, fixed) beside CLIP-L (123 M), so the probe is 1.56 G parameters, 1.57 GB as F8.
* **qwen-image**: one joint block, a one-layer text model and the Wan VAE's decoder, all at their
  fixed widths (the text model's MLP too), 1.23 G parameters (why each is that size: :mod:`accelstack.engine.probes.qwen`).
* **sd3**: SD3-medium's own MMDiT (24 blocks: the least stable-diffusion.cpp builds), CLIP-L and
  CLIP-G (it aborts without either), no T5-XXL: 2.91 G parameters, the largest probe
  (:mod:`accelstack.engine.probes.sd3`). Plain ``verify`` keeps the SD 1.x probe.
* **z-image**: nothing of Z-Image's DiT is read from the tensors (6.15 G parameters, fixed): its
  matrices are stored Q4_0 in a GGUF file (3.5 GB), with a one-layer Qwen3 text model and a decode-only
  VAE (:mod:`accelstack.engine.probes.zimage`, :mod:`accelstack.engine.probes.gguf`).

The file holds all parts under the prefixes stable-diffusion.cpp reads in an all-in-one checkpoint
(src/name_conversion.cpp ``convert_tensor_name``): ``model.diffusion_model.`` (original names, which
``get_sd_version`` in src/model.cpp looks at), ``vae.`` (diffusers names, converted to
``first_stage_model.``) and ``text_encoders.clip_l.transformer.`` (what ``FluxCLIPEmbedder`` loads),
so the worker loads it as any model file (``model_path`` only).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Sequence, Tuple

from ..config import shown
from ..errors import InvalidRequestError
from .architecture import (
    Shape,
    _conv,
    _linear,
    _norm,
    _resnet,
    _transformer,
    clip_text_tensors,
    sd1_tensors,
    unet_tensors,
    vae_decoder,
)
from .flux2 import KLEIN_LLM, flux2_dit_tensors, flux2_llm_tensors, flux2_vae_extra
from .qwen import qwen_dit_tensors, qwen_llm_tensors, wan_decoder_tensors
from .sd3 import mmdit_tensors
from .zimage import ZIMAGE_QUANTIZED, qwen3_llm_tensors, zimage_dit_tensors

__all__ = ["FamilyProbeSpec", "FAMILIES", "DEFAULT_FAMILY", "family_names", "family_spec", "check_families",
           "flux_tensors", "vae_decoder_tensors", "ModelFamily", "PROBE_OF_FAMILY", "probe_families_of"]

Parts = Dict[str, Dict[str, Shape]]  # {tensor-name prefix: {name: shape}}

DEFAULT_FAMILY = "sd1"

# Flux's fixed dimensions (src/flux.hpp FluxParams; src/conditioner.hpp FluxCLIPEmbedder)
FLUX_HEAD = 128  # sum of the rotary axes_dim {16, 56, 56}: the head size is fixed
FLUX_CONTEXT = 4096  # T5-XXL's width: txt_in's input, zeros of it when T5 is missing
FLUX_VEC = 768  # CLIP-L's pooled output: vector_in's input
FLUX_LATENT = 16  # latent channels; patch 2x2 -> img_in's input of 64
FLUX_MLP_RATIO = 4
CHROMA_APPROX = 5120  # ChromaApproximator's inner width and depth, fixed (src/flux.hpp)
CHROMA_APPROX_LAYERS = 5


def _mlp_embedder(out: Dict[str, Shape], name: str, n_in: int, hidden: int) -> None:
    _linear(out, f"{name}.in_layer", hidden, n_in)
    _linear(out, f"{name}.out_layer", hidden, hidden)


def _flux_attention(out: Dict[str, Shape], name: str, hidden: int) -> None:
    _linear(out, f"{name}.qkv", 3 * hidden, hidden)  # qkv_bias true for FLUX.1
    out[f"{name}.norm.query_norm.scale"] = (FLUX_HEAD,)
    out[f"{name}.norm.key_norm.scale"] = (FLUX_HEAD,)
    _linear(out, f"{name}.proj", hidden, hidden)


def flux_tensors(hidden: int = FLUX_HEAD, double: int = 1, single: int = 1, guidance: bool = True,
                 chroma: bool = False) -> Dict[str, Shape]:
    """The FLUX.1 diffusion model's tensors in its original names (src/flux.hpp ``Flux``); ``chroma``:
    Chroma's, whose per-block modulations are pruned and come from one ``distilled_guidance_layer``
    (``ChromaApproximator``: 5 layers of 5120, fixed, fed 344 modulation indices whatever the depth)."""
    out: Dict[str, Shape] = {}
    mlp = hidden * FLUX_MLP_RATIO
    _linear(out, "img_in", hidden, FLUX_LATENT * 4)
    if chroma:
        d = CHROMA_APPROX
        _linear(out, "distilled_guidance_layer.in_proj", d, FLUX_LATENT * 4)  # in_dim 64
        for i in range(CHROMA_APPROX_LAYERS):
            out[f"distilled_guidance_layer.norms.{i}.scale"] = (d,)
            _mlp_embedder(out, f"distilled_guidance_layer.layers.{i}", d, d)
        _linear(out, "distilled_guidance_layer.out_proj", hidden, d)
    else:
        _mlp_embedder(out, "time_in", 256, hidden)
        _mlp_embedder(out, "vector_in", FLUX_VEC, hidden)
        if guidance:
            _mlp_embedder(out, "guidance_in", 256, hidden)
    _linear(out, "txt_in", hidden, FLUX_CONTEXT)
    for i in range(double):
        b = f"double_blocks.{i}"
        for side in ("img", "txt"):
            if not chroma:
                _linear(out, f"{b}.{side}_mod.lin", 6 * hidden, hidden)
            _flux_attention(out, f"{b}.{side}_attn", hidden)
            _linear(out, f"{b}.{side}_mlp.0", mlp, hidden)
            _linear(out, f"{b}.{side}_mlp.2", hidden, mlp)
    for i in range(single):
        b = f"single_blocks.{i}"
        _linear(out, f"{b}.linear1", 3 * hidden + mlp, hidden)
        _linear(out, f"{b}.linear2", hidden, hidden + mlp)
        out[f"{b}.norm.query_norm.scale"] = (FLUX_HEAD,)
        out[f"{b}.norm.key_norm.scale"] = (FLUX_HEAD,)
        if not chroma:
            _linear(out, f"{b}.modulation.lin", 3 * hidden, hidden)
    _linear(out, "final_layer.linear", FLUX_LATENT * 4, hidden)
    if not chroma:
        _linear(out, "final_layer.adaLN_modulation.1", 2 * hidden, hidden)
    return out


def vae_decoder_tensors(latent: int, ch: int = 32) -> Dict[str, Shape]:
    """A decode-only KL VAE in diffusers names, channel multipliers (1, 2, 4, 4) of ``ch``
    (src/auto_encoder_kl.hpp: the decoder's width is read from ``decoder.conv_in``; no
    ``post_quant_conv`` for the 16-channel DiT VAEs)."""
    out: Dict[str, Shape] = {}
    vae_decoder(out, tuple(ch * m for m in (1, 2, 4, 4)), latent)
    return out


# SDXL's fixed dimensions (src/unet.hpp UnetModelBlock; src/clip.hpp CLIPTextModel)
SDXL_CHANNELS = (320, 640, 1280)  # model_channels 320, channel_mult {1, 2, 4}: fixed, not read from the tensors
SDXL_TIME = 1280  # time_embed_dim
SDXL_ADM = 2816  # label_emb's input (adm_in_channels)
SDXL_CONTEXT = 2048  # CLIP-L 768 + CLIP-G 1280 (attn2.to_k's input: our inspect_model's SDXL rule)
SDXL_VEGA_DEPTH = (0, 1, 2)  # transformer depth per level for VERSION_SDXL_VEGA (no attention at level 0)
CLIP_G = (1280, 5120, 32)  # OPEN_CLIP_VIT_BIGG_14: hidden, intermediate, layers (fixed, not inferred)
CLIP_H = (1024, 4096, 24)  # OPEN_CLIP_VIT_H_14, SD 2.x's text encoder (src/clip.hpp, fixed); its width is the context


def sdxl_vega_unet_tensors() -> Dict[str, Shape]:
    """The smallest UNet stable-diffusion.cpp loads as SDXL, Segmind Vega's layout, in diffusers names:
    no ``mid_block.resnets.1`` and no ``up_blocks.1.attentions.0.transformer_blocks.1`` make
    ``get_sd_version`` (src/model.cpp) say VERSION_SDXL_VEGA, whose UnetModelBlock (src/unet.hpp)
    has transformer depths {1, 1, 2} and a middle block of one ResBlock. The widths are fixed."""
    out: Dict[str, Shape] = {}
    chans, temb = SDXL_CHANNELS, SDXL_TIME
    _conv(out, "conv_in", chans[0], 4, 3)
    _linear(out, "time_embedding.linear_1", temb, chans[0])
    _linear(out, "time_embedding.linear_2", temb, temb)
    _linear(out, "add_embedding.linear_1", temb, SDXL_ADM)
    _linear(out, "add_embedding.linear_2", temb, temb)
    skips = [chans[0]]
    prev = chans[0]
    last = len(chans) - 1
    for i, c in enumerate(chans):
        for j in range(2):
            _resnet(out, f"down_blocks.{i}.resnets.{j}", prev if j == 0 else c, c, temb)
            if SDXL_VEGA_DEPTH[i]:
                _transformer(out, f"down_blocks.{i}.attentions.{j}", c, SDXL_CONTEXT, SDXL_VEGA_DEPTH[i], linear=True)
            skips.append(c)
        if i < last:
            _conv(out, f"down_blocks.{i}.downsamplers.0.conv", c, c, 3)
            skips.append(c)
        prev = c
    _resnet(out, "mid_block.resnets.0", chans[-1], chans[-1], temb)
    for i, level in enumerate(reversed(range(len(chans)))):
        c = chans[level]
        for j in range(3):
            skip = skips.pop()
            _resnet(out, f"up_blocks.{i}.resnets.{j}", (prev if j == 0 else c) + skip, c, temb)
            if SDXL_VEGA_DEPTH[level]:
                _transformer(out, f"up_blocks.{i}.attentions.{j}", c, SDXL_CONTEXT, SDXL_VEGA_DEPTH[level], linear=True)
        if level > 0:
            _conv(out, f"up_blocks.{i}.upsamplers.0.conv", c, c, 3)
        prev = c
    _norm(out, "conv_norm_out", chans[0])
    _conv(out, "conv_out", 4, chans[0], 3)
    return out


def clip_g_tensors() -> Dict[str, Shape]:
    """OpenCLIP bigG's text model in Hugging Face names (src/clip.hpp OPEN_CLIP_VIT_BIGG_14: 32 layers
    of 1280, fixed, and a 1280x1280 ``text_projection``)."""
    d, inner, layers = CLIP_G
    return clip_text_tensors(d, layers, inner, projection=True)


def _sd_vae() -> Dict[str, Shape]:
    """The 4-channel SD VAE, quarter-width and decode-only (the worker loads it so)."""
    vae = vae_decoder_tensors(4)
    _conv(vae, "post_quant_conv", 4, 4, 1)  # use_quant for the 4-channel SD VAE (src/auto_encoder_kl.hpp)
    return vae


def _sd2_parts() -> Parts:
    d, inner, layers = CLIP_H
    return {"unet.": unet_tensors(CLIP_H[0], linear=True), "vae.": _sd_vae(), "te.": clip_text_tensors(d, layers, inner)}


def _sdxl_parts() -> Parts:
    return {"unet.": sdxl_vega_unet_tensors(), "vae.": _sd_vae(),
            "conditioner.embedders.0.transformer.": sd1_tensors()["text_encoder"],
            "conditioner.embedders.1.transformer.": clip_g_tensors()}


def _flux_parts() -> Parts:
    return {"model.diffusion_model.": flux_tensors(),
            "vae.": vae_decoder_tensors(FLUX_LATENT),
            "text_encoders.clip_l.transformer.": sd1_tensors()["text_encoder"]}


def _qwen_image_parts() -> Parts:
    return {"model.diffusion_model.": qwen_dit_tensors(), "vae.": wan_decoder_tensors(),
            "text_encoders.llm.": qwen_llm_tensors()}


def _sd3_parts() -> Parts:
    return {"model.diffusion_model.": mmdit_tensors(), "vae.": vae_decoder_tensors(FLUX_LATENT),
            "text_encoders.clip_l.transformer.": sd1_tensors()["text_encoder"],
            "text_encoders.clip_g.transformer.": clip_g_tensors()}


def _zimage_parts() -> Parts:
    return {"model.diffusion_model.": zimage_dit_tensors(), "vae.": vae_decoder_tensors(FLUX_LATENT),
            "text_encoders.llm.": qwen3_llm_tensors()}


def _flux2_parts() -> Parts:  # FLUX.2 [klein] (src/model.cpp get_sd_version): :mod:`.flux2`
    return {"model.diffusion_model.": flux2_dit_tensors(KLEIN_LLM[0]), "text_encoders.llm.": flux2_llm_tensors(),
            "vae.": flux2_vae_extra(vae_decoder_tensors(32))}


def _chroma_parts() -> Parts:
    return {"model.diffusion_model.": flux_tensors(chroma=True),
            "vae.": vae_decoder_tensors(FLUX_LATENT)}


@dataclass(frozen=True)
class FamilyProbeSpec:
    """One family's probe: its parts, what stable-diffusion.cpp calls it, how it is generated."""

    family: str  # our family id (accelstack.engine.models.inspection names it so)
    name: str
    sdcpp_version: str  # the version stable-diffusion.cpp logs ("Version: Flux")
    parts: Callable[[], Parts]
    cfg_scale: float = 7.0
    # engine options the family's probe runs with whatever was asked, with the reason
    options: Tuple[Tuple[str, Any], ...] = ()
    options_reason: str = ""
    note: str = ""  # what is reduced, for people
    sources: List[str] = field(default_factory=list)
    quantized: Tuple[str, ...] = ()  # tensor-name prefixes stored Q4_0 in a GGUF file (none: safetensors, F8)


FAMILIES: Dict[str, FamilyProbeSpec] = {
    "sd1": FamilyProbeSpec("sd1", "Stable Diffusion 1.x (full size)", "SD 1.x",
                           lambda: {"unet.": sd1_tensors()["unet"], "vae.": sd1_tensors()["vae"],
                                    "te.": sd1_tensors()["text_encoder"]},
                           note="the full SD 1.x architecture"),
    "sd2": FamilyProbeSpec("sd2", "Stable Diffusion 2.x (full-size UNet)", "SD 2.x", _sd2_parts,
                           note="the full SD 2.x UNet (1024-wide context, linear projections) and OpenCLIP-H text "
                                "encoder (353 M), quarter-width decode-only SD VAE",
                           sources=["src/model.cpp get_sd_version (token embedding 1024 wide: SD 2.x)",
                                    "src/unet.hpp UnetModelBlock", "src/clip.hpp OPEN_CLIP_VIT_H_14",
                                    "src/stable-diffusion.cpp is_using_v_parameterization_for_sd2"]),
    "flux": FamilyProbeSpec("flux", "FLUX.1 [dev] (reduced)", "Flux", _flux_parts, cfg_scale=1.0,
                            note="1 double + 1 single block of one 128-wide head, full CLIP-L, no T5-XXL "
                                 "(zeros of its width), quarter-width decode-only 16-channel VAE",
                            sources=["src/flux.hpp FluxRunner", "src/conditioner.hpp FluxCLIPEmbedder",
                                     "src/auto_encoder_kl.hpp detect_decoder_ch"]),
    "chroma": FamilyProbeSpec("chroma", "Chroma (reduced)", "Flux", _chroma_parts, cfg_scale=1.0,
                              options=(("flash_attention", False),),
                              options_reason="stable-diffusion.cpp does not support Chroma's DiT mask with flash "
                              "attention (its warning in src/stable-diffusion.cpp new_sd_ctx): with it the probe's "
                              "image is NaN (all white) on the CPU build",
                              note="Flux blocks as above with Chroma's fixed 5x5120 modulation approximator "
                                   "(262 M), flash attention off, no T5-XXL (zeros of its width), quarter-width decode-only VAE",
                              sources=["src/flux.hpp ChromaApproximator", "src/conditioner.hpp T5CLIPEmbedder",
                                       "src/stable-diffusion.cpp new_sd_ctx (distilled_guidance_layer: Chroma)"]),
    "sdxl": FamilyProbeSpec("sdxl", "Stable Diffusion XL (Vega layout)", "SDXL (Vega)", _sdxl_parts, cfg_scale=1.0,
                            note="Segmind Vega's UNet layout (745 M: transformer depths 1/1/2, no middle "
                                 "attention), full CLIP-L and CLIP-G (694 M), quarter-width decode-only SD VAE",
                            sources=["src/model.cpp get_sd_version (VERSION_SDXL_VEGA)", "src/unet.hpp UnetModelBlock",
                                     "src/conditioner.hpp FrozenCLIPEmbedderWithCustomWords", "src/clip.hpp CLIPTextModel",
                                     "src/auto_encoder_kl.hpp detect_decoder_ch"]),
    "qwen-image": FamilyProbeSpec("qwen-image", "Qwen-Image (reduced)", "Qwen Image", _qwen_image_parts, cfg_scale=1.0,
                                  note="1 joint block at the fixed 3072 width, Qwen2.5-VL's text model with 1 layer "
                                       "at its real widths (its 152k x 3584 embedding: 545 M), the Wan VAE's decoder",
                                  sources=["src/qwen_image.hpp QwenImageRunner", "src/llm.hpp LLMRunner",
                                           "src/wan.hpp WanVAE", "src/model.cpp get_sd_version"]),
    "sd3": FamilyProbeSpec("sd3", "Stable Diffusion 3 (SD3-medium's MMDiT)", "SD3.x", _sd3_parts, cfg_scale=1.0,
                           note="SD3-medium's 24-block MMDiT, CLIP-L and CLIP-G, no T5-XXL, decode-only VAE: 2.91 G",
                           sources=["src/mmdit.hpp MMDiT", "src/conditioner.hpp SD3CLIPEmbedder",
                                    "src/model.cpp get_sd_version"]),
    "z-image": FamilyProbeSpec("z-image", "Z-Image (whole DiT, Q4_0)", "Z-Image", _zimage_parts, cfg_scale=1.0,
                               note="Z-Image's whole 30-layer DiT (6.15 G, fixed) stored Q4_0 in GGUF, Qwen3's text model "
                                    "with 1 layer at its real widths (its 152k x 2560 embedding), decode-only VAE: 3.75 GB",
                               sources=["src/z_image.hpp ZImageParams", "src/llm.hpp LLMRunner",
                                        "src/conditioner.hpp LLMEmbedder", "src/model.cpp get_sd_version"],
                               quantized=ZIMAGE_QUANTIZED),
    "flux2": FamilyProbeSpec("flux2", "FLUX.2 [klein] (reduced)", "Flux.2 klein", _flux2_parts, cfg_scale=1.0,
                             note="1 double + 1 single block of one 128-wide head, Qwen3's text model with 1 layer at "
                                  "Qwen3-4B's widths (its 152k x 2560 embedding), decode-only 32-channel VAE",
                             sources=["src/flux.hpp FluxRunner", "src/llm.hpp LLMRunner", "src/conditioner.hpp "
                                      "LLMEmbedder", "src/model.cpp get_sd_version", "src/auto_encoder_kl.hpp"]),
}


def family_names() -> List[str]:
    return list(FAMILIES)


def family_spec(family: str) -> FamilyProbeSpec:
    """The probe of ``family``; an unknown one is an :class:`InvalidRequestError` naming the known ones."""
    spec = FAMILIES.get(family) if isinstance(family, str) else None
    if spec is None:
        raise InvalidRequestError(f"no probe for the model family {shown(family)}",
                                  hint=f"the families verify knows: {', '.join(FAMILIES)}")
    return spec


def check_families(families: Sequence[str]) -> List[str]:
    """``families`` without repeats, each known (else :class:`InvalidRequestError`), before any work."""
    if isinstance(families, str) or not families:
        raise InvalidRequestError("name at least one model family to verify",
                                  hint=f"the families verify knows: {', '.join(FAMILIES)}")
    return [family_spec(f).family for f in dict.fromkeys(families)]


# -- a user's model file -> the probe of its family ---------------------------------------------------
# model_inspect's family ids whose kernels a probe here exercises (variants share their family's probe)
PROBE_OF_FAMILY: Dict[str, str] = {"sd1": "sd1", "sd2": "sd2", "flux": "flux", "chroma": "chroma", "sdxl": "sdxl",
                                   "qwen-image": "qwen-image", "sd3": "sd3", "z-image": "z-image",
                                   "flux2": "flux2"}


@dataclass
class ModelFamily:
    """A model file ``verify --model`` was given: the family it is and the probe that stands for it."""

    path: str
    family: str  # model_inspect's id
    family_name: str
    probe: str  # the FAMILIES key verified
    weight_types: List[str] = field(default_factory=list)  # the file's stored types, most parameters first


def probe_families_of(paths: Sequence[str]) -> List[ModelFamily]:
    """Inspect each model file (headers only) and name the probe of its family; a file whose family
    has no probe is an :class:`InvalidRequestError` before any work (bad files raise as in ``model inspect``)."""
    from ..models.inspection import inspect_model  # the file readers, only when a model is named

    out: List[ModelFamily] = []
    for path in paths:
        found = inspect_model(path)
        probe = PROBE_OF_FAMILY.get(found.family)
        if probe is None:
            known = ", ".join(sorted(PROBE_OF_FAMILY))
            role = "VAE" if found.role == "vae" else found.role.replace("_", " ")
            what = (f"holds no diffusion model (it is a {role} file)" if found.family == "none"
                    else "holds no diffusion model of a family accelstack recognises" if found.family == "unknown"
                    else f"is {found.family_name or found.family}, a family verify has no probe for")
            raise InvalidRequestError(f"{path} {what}: verify --model needs a model of a family it knows",
                                      hint=f"verify --model knows the families {known}; `accelstack model inspect "
                                           f"{path}` shows what the file is")
        out.append(ModelFamily(str(found.path), found.family, found.family_name, probe, [w.dtype for w in found.weight_types]))
    return out
