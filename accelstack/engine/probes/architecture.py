"""The probe model's architecture: every tensor of Stable Diffusion 1.x, by name and shape.

The shapes come from the architecture's hyper-parameters (channel widths, layer counts, context
size) in the diffusers folder layout that stable-diffusion.cpp loads; tests compare them with
the reference list in ``shared/reference``. :func:`value_rule` says how each tensor is filled
(see :mod:`accelstack.engine.probes.weights`).
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

__all__ = ["Shape", "Architecture", "sd1_tensors", "clip_text_tensors", "value_rule", "vae_encoder", "kl_vae_tensors"]

Shape = Tuple[int, ...]
Architecture = Dict[str, Dict[str, Shape]]  # {part: {tensor name: shape}}


def _linear(out: Dict[str, Shape], name: str, n_out: int, n_in: int, bias: bool = True) -> None:
    out[f"{name}.weight"] = (n_out, n_in)
    if bias:
        out[f"{name}.bias"] = (n_out,)


def llm_layer(out: Dict[str, Shape], b: str, h: int, heads: Tuple[int, int, int], mlp: int, qkv_bias: bool,
              qk_norm: bool) -> None:
    """One decoder layer of a Hugging Face text model as src/llm.hpp reads it (Qwen2.5-VL's has q/k/v biases,
    Qwen3's a q/k RMS norm instead); ``heads`` is (query heads, key/value heads, head size)."""
    n_q, n_kv, head = heads
    _linear(out, f"{b}.self_attn.q_proj", n_q * head, h, bias=qkv_bias)
    _linear(out, f"{b}.self_attn.k_proj", n_kv * head, h, bias=qkv_bias)
    _linear(out, f"{b}.self_attn.v_proj", n_kv * head, h, bias=qkv_bias)
    _linear(out, f"{b}.self_attn.o_proj", h, n_q * head, bias=False)
    if qk_norm:
        out[f"{b}.self_attn.q_norm.weight"] = (head,)
        out[f"{b}.self_attn.k_norm.weight"] = (head,)
    _linear(out, f"{b}.mlp.gate_proj", mlp, h, bias=False)
    _linear(out, f"{b}.mlp.up_proj", mlp, h, bias=False)
    _linear(out, f"{b}.mlp.down_proj", h, mlp, bias=False)
    out[f"{b}.input_layernorm.weight"] = (h,)
    out[f"{b}.post_attention_layernorm.weight"] = (h,)


def _conv(out: Dict[str, Shape], name: str, n_out: int, n_in: int, k: int) -> None:
    out[f"{name}.weight"] = (n_out, n_in, k, k)
    out[f"{name}.bias"] = (n_out,)


def _norm(out: Dict[str, Shape], name: str, n: int) -> None:
    out[f"{name}.weight"] = (n,)
    out[f"{name}.bias"] = (n,)


def _resnet(out: Dict[str, Shape], name: str, n_in: int, n_out: int, temb: Optional[int]) -> None:
    _norm(out, f"{name}.norm1", n_in)
    _conv(out, f"{name}.conv1", n_out, n_in, 3)
    if temb:
        _linear(out, f"{name}.time_emb_proj", n_out, temb)
    _norm(out, f"{name}.norm2", n_out)
    _conv(out, f"{name}.conv2", n_out, n_out, 3)
    if n_in != n_out:
        _conv(out, f"{name}.conv_shortcut", n_out, n_in, 1)


def _transformer(out: Dict[str, Shape], name: str, c: int, context: int, depth: int = 1, linear: bool = False) -> None:
    """A SpatialTransformer of ``depth`` blocks (src/common_block.hpp), with 1x1 convolution
    projections (SD 1.x, any ControlNet) or linear ones (``use_linear_projection``: SD 2.x, SDXL)."""
    project = (lambda n: _linear(out, n, c, c)) if linear else (lambda n: _conv(out, n, c, c, 1))
    _norm(out, f"{name}.norm", c)
    project(f"{name}.proj_in")
    for d in range(depth):
        b = f"{name}.transformer_blocks.{d}"
        for attn, kv in (("attn1", c), ("attn2", context)):
            _linear(out, f"{b}.{attn}.to_q", c, c, bias=False)
            _linear(out, f"{b}.{attn}.to_k", c, kv, bias=False)
            _linear(out, f"{b}.{attn}.to_v", c, kv, bias=False)
            _linear(out, f"{b}.{attn}.to_out.0", c, c)
        _linear(out, f"{b}.ff.net.0.proj", 8 * c, c)  # GEGLU: value and gate
        _linear(out, f"{b}.ff.net.2", c, 4 * c)
        for i in (1, 2, 3):
            _norm(out, f"{b}.norm{i}", c)
    project(f"{name}.proj_out")


def unet_tensors(ctx: int = 768, linear: bool = False) -> Dict[str, Shape]:
    """SD 1.x's UNet in diffusers names (src/unet.hpp ``UnetModelBlock``); SD 2.x's is the same with
    the 1024-wide OpenCLIP-H context and linear transformer projections (``use_linear_projection``)."""
    out: Dict[str, Shape] = {}
    chans, temb, layers = (320, 640, 1280, 1280), 1280, 2
    _conv(out, "conv_in", chans[0], 4, 3)
    _linear(out, "time_embedding.linear_1", temb, chans[0])
    _linear(out, "time_embedding.linear_2", temb, temb)
    skips = [chans[0]]
    prev = chans[0]
    for i, c in enumerate(chans):
        for j in range(layers):
            _resnet(out, f"down_blocks.{i}.resnets.{j}", prev if j == 0 else c, c, temb)
            if i < 3:
                _transformer(out, f"down_blocks.{i}.attentions.{j}", c, ctx, linear=linear)
            skips.append(c)
        if i < 3:
            _conv(out, f"down_blocks.{i}.downsamplers.0.conv", c, c, 3)
            skips.append(c)
        prev = c
    _resnet(out, "mid_block.resnets.0", chans[-1], chans[-1], temb)
    _transformer(out, "mid_block.attentions.0", chans[-1], ctx, linear=linear)
    _resnet(out, "mid_block.resnets.1", chans[-1], chans[-1], temb)
    rev = list(reversed(chans))
    prev = rev[0]
    for i, c in enumerate(rev):
        for j in range(layers + 1):
            skip = skips.pop()
            _resnet(out, f"up_blocks.{i}.resnets.{j}", (prev if j == 0 else c) + skip, c, temb)
            if i > 0:
                _transformer(out, f"up_blocks.{i}.attentions.{j}", c, ctx, linear=linear)
        if i < 3:
            _conv(out, f"up_blocks.{i}.upsamplers.0.conv", c, c, 3)
        prev = c
    _norm(out, "conv_norm_out", chans[0])
    _conv(out, "conv_out", 4, chans[0], 3)
    return out


def _vae_mid(out: Dict[str, Shape], name: str, c: int) -> None:
    _resnet(out, f"{name}.resnets.0", c, c, None)
    a = f"{name}.attentions.0"
    _norm(out, f"{a}.group_norm", c)
    for proj in ("to_q", "to_k", "to_v", "to_out.0"):
        _linear(out, f"{a}.{proj}", c, c)
    _resnet(out, f"{name}.resnets.1", c, c, None)


def _vae() -> Dict[str, Shape]:
    out: Dict[str, Shape] = {}
    chans, layers, latent = (128, 256, 512, 512), 2, 4
    vae_encoder(out, chans, latent, layers)
    _conv(out, "quant_conv", 2 * latent, 2 * latent, 1)
    _conv(out, "post_quant_conv", latent, latent, 1)
    vae_decoder(out, chans, latent, layers + 1)
    return out


def vae_encoder(out: Dict[str, Shape], chans: Tuple[int, ...], latent: int, resnets: int = 2) -> None:
    """A KL VAE's encoder in diffusers names (src/auto_encoder_kl.hpp ``Encoder``, double_z: mean and log-variance):
    what encodes an init or reference image; a decode-only load never builds it."""
    _conv(out, "encoder.conv_in", chans[0], 3, 3)
    prev = chans[0]
    for i, c in enumerate(chans):
        for j in range(resnets):
            _resnet(out, f"encoder.down_blocks.{i}.resnets.{j}", prev if j == 0 else c, c, None)
        if i < len(chans) - 1:
            _conv(out, f"encoder.down_blocks.{i}.downsamplers.0.conv", c, c, 3)
        prev = c
    _vae_mid(out, "encoder.mid_block", chans[-1])
    _norm(out, "encoder.conv_norm_out", chans[-1])
    _conv(out, "encoder.conv_out", 2 * latent, chans[-1], 3)


def kl_vae_tensors(latent: int, decoder_ch: int = 32) -> Dict[str, Shape]:
    """A KL VAE that encodes too (img2img, edits, inpainting), in diffusers names: the encoder at the width
    stable-diffusion.cpp always builds it (src/auto_encoder_kl.hpp: ``Encoder(dd_config.ch = 128, {1, 2, 4, 4})``,
    never read from the file), the decoder at ``decoder_ch`` (read from ``decoder.conv_in``: detect_decoder_ch)."""
    out: Dict[str, Shape] = {}
    vae_encoder(out, (128, 256, 512, 512), latent)
    vae_decoder(out, tuple(decoder_ch * m for m in (1, 2, 4, 4)), latent)
    return out


def vae_decoder(out: Dict[str, Shape], chans: Tuple[int, ...], latent: int, resnets: int = 3) -> None:
    """A KL VAE's decoder in diffusers names (src/auto_encoder_kl.hpp): ``chans`` are the encoder's widths."""
    rev = list(reversed(chans))
    _conv(out, "decoder.conv_in", rev[0], latent, 3)
    _vae_mid(out, "decoder.mid_block", rev[0])
    prev = rev[0]
    for i, c in enumerate(rev):
        for j in range(resnets):
            _resnet(out, f"decoder.up_blocks.{i}.resnets.{j}", prev if j == 0 else c, c, None)
        if i < len(rev) - 1:
            _conv(out, f"decoder.up_blocks.{i}.upsamplers.0.conv", c, c, 3)
        prev = c
    _norm(out, "decoder.conv_norm_out", chans[0])
    _conv(out, "decoder.conv_out", 3, chans[0], 3)


def clip_text_tensors(d: int = 768, layers: int = 12, inner: int = 3072, projection: bool = False) -> Dict[str, Shape]:
    """A CLIP text model in Hugging Face names (src/clip.hpp ``CLIPTextModel``): SD 1.x's CLIP-L by
    default; OpenCLIP bigG (1280 x 32, with a ``text_projection``) for SDXL's second encoder."""
    out: Dict[str, Shape] = {}
    vocab, positions = 49408, 77
    out["text_model.embeddings.token_embedding.weight"] = (vocab, d)
    out["text_model.embeddings.position_embedding.weight"] = (positions, d)
    for i in range(layers):
        p = f"text_model.encoder.layers.{i}"
        _norm(out, f"{p}.layer_norm1", d)
        _norm(out, f"{p}.layer_norm2", d)
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            _linear(out, f"{p}.self_attn.{proj}", d, d)
        _linear(out, f"{p}.mlp.fc1", inner, d)
        _linear(out, f"{p}.mlp.fc2", d, inner)
    _norm(out, "text_model.final_layer_norm", d)
    if projection:
        out["text_projection.weight"] = (d, d)
    return out


def sd1_tensors() -> Dict[str, Dict[str, Shape]]:
    """Every tensor of an SD 1.x model in the diffusers layout: ``{part: {name: shape}}``."""
    return {"text_encoder": clip_text_tensors(), "unet": unet_tensors(), "vae": _vae()}


def value_rule(name: str, shape: Shape) -> Tuple[str, float]:
    """How a tensor is filled: ``("const", v)`` or ``("random", std)``."""
    if len(shape) == 1:
        return ("const", 0.0) if name.endswith(".bias") else ("const", 1.0)
    if "embedding" in name:
        return ("random", 0.02)
    fan_in = math.prod(shape[1:])
    return ("random", 1.0 / math.sqrt(fan_in))

