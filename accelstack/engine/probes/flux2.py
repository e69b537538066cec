"""The shapes of the reduced FLUX.2 probes: the DiT, its LLM text encoder and the 32-channel FLUX.2 VAE's decoder.

What stable-diffusion.cpp (0.4.7, the bundled source) reads from the tensors and what it fixes:

* **Version** (src/model.cpp ``get_sd_version``): ``double_stream_modulation_img.lin.weight`` makes a
  model FLUX.2; with ``single_blocks.47`` it is FLUX.2 [dev], without it FLUX.2 [klein]. Klein 4B and
  9B are one version there (told apart only by their text encoder's width).
* **DiT** (src/flux.hpp ``FluxRunner``, FLUX.2 branch): patch 1, 128 input/output channels, MLP ratio 3
  with a SiLU-gated MLP (twice as wide a first projection), no biases anywhere, rotary axes
  {32, 32, 32, 32} (head size 128, read from the q/k norm scales), shared modulations
  (``double_stream_modulation_img/txt``, ``single_stream_modulation``) instead of per-block ones and no
  ``vector_in``. The hidden size and text width are read from ``txt_in``, the depths from the block
  names, ``guidance_in`` makes the guidance embedding (FLUX.2 [dev] has it, [klein] does not). So the
  probe is one head of 128, one double block and one single block for [klein]; [dev] needs the 48th
  single block to be itself, so its probe has 48 single blocks of that width.
* **Text encoder** (src/conditioner.hpp ``LLMEmbedder``, src/llm.hpp ``LLMRunner``): Qwen3 for [klein]
  (32 heads, 8 key/value heads of 128, q/k norms, fixed), Mistral Small 3.2 for [dev] (32/8 heads of
  128, no q/k norms); the layer count, hidden size, vocabulary and MLP width are read. The embedding
  must hold the tokenizer's ids (Qwen3: 151936 rows; Mistral's tekken: 131072), at the real hidden size
  (Qwen3-4B's 2560, Mistral Small's 5120) and one layer at the real widths runs the attention and MLP
  kernels. FLUX.2 concatenates the outputs of layers {9, 18, 27} ([klein]) or {10, 20, 30} ([dev]);
  with one layer none is reached and the last norm's output is used (``TextModel::forward``), so the
  probe's ``txt_in`` takes the LLM's hidden size, not three times it: the only width that differs from
  the real model's.
* **VAE** (src/auto_encoder_kl.hpp, ``sd_version_uses_flux2_vae``): 32 latent channels with
  ``post_quant_conv`` (kept for FLUX.2), scale factor 16 (the DiT's 128 channels are 2x2 patches of
  32), decoder width read from ``decoder.conv_in``: the quarter-width decode-only decoder of the other
  probes, for 32 channels.
"""
from __future__ import annotations

from typing import Dict, Tuple

from .architecture import Shape, _conv, _linear, llm_layer

__all__ = ["FLUX2_HEAD", "FLUX2_IN", "FLUX2_LATENT", "flux2_dit_tensors", "flux2_llm_tensors", "flux2_vae_extra",
           "KLEIN_LLM", "DEV_LLM"]

FLUX2_HEAD = 128  # the sum of the rotary axes {32, 32, 32, 32}: the head size
FLUX2_IN = 128  # in_channels = out_channels, patch 1 (FluxRunner's FLUX.2 branch)
FLUX2_MLP_RATIO = 3
FLUX2_LATENT = 32  # the VAE's z_channels (auto_encoder_kl.hpp)
FLUX2_DEV_SINGLE = 48  # single_blocks.47 makes it [dev] (get_sd_version)
# (hidden size, vocabulary, MLP width, q/k norms): Qwen3-4B (klein 4B), Mistral Small 3.2 24B (dev)
LLMShape = Tuple[int, int, int, bool]
KLEIN_LLM: LLMShape = (2560, 151936, 9728, True)
DEV_LLM: LLMShape = (5120, 131072, 32768, False)
LLM_HEADS, LLM_KV_HEADS, LLM_HEAD = 32, 8, 128  # LLMRunner, both archs (src/llm.hpp), fixed


def flux2_dit_tensors(context: int, dev: bool = False, hidden: int = FLUX2_HEAD) -> Dict[str, Shape]:
    """The FLUX.2 DiT in its original names (src/flux.hpp ``Flux``): one double block, one single block
    ([klein]) or 48 ([dev]), ``guidance_in`` for [dev]; no biases (``disable_bias``)."""
    out: Dict[str, Shape] = {}
    mlp = hidden * FLUX2_MLP_RATIO
    _linear(out, "img_in", hidden, FLUX2_IN, bias=False)
    _linear(out, "time_in.in_layer", hidden, 256, bias=False)
    _linear(out, "time_in.out_layer", hidden, hidden, bias=False)
    if dev:
        _linear(out, "guidance_in.in_layer", hidden, 256, bias=False)
        _linear(out, "guidance_in.out_layer", hidden, hidden, bias=False)
    _linear(out, "txt_in", hidden, context, bias=False)
    for side in ("img", "txt"):
        b = f"double_blocks.0.{side}"
        _linear(out, f"{b}_attn.qkv", 3 * hidden, hidden, bias=False)
        out[f"{b}_attn.norm.query_norm.scale"] = (FLUX2_HEAD,)
        out[f"{b}_attn.norm.key_norm.scale"] = (FLUX2_HEAD,)
        _linear(out, f"{b}_attn.proj", hidden, hidden, bias=False)
        _linear(out, f"{b}_mlp.0", 2 * mlp, hidden, bias=False)  # SiLU-gated: value and gate
        _linear(out, f"{b}_mlp.2", hidden, mlp, bias=False)
    for i in range(FLUX2_DEV_SINGLE if dev else 1):
        b = f"single_blocks.{i}"
        _linear(out, f"{b}.linear1", 3 * hidden + 2 * mlp, hidden, bias=False)
        _linear(out, f"{b}.linear2", hidden, hidden + mlp, bias=False)
        out[f"{b}.norm.query_norm.scale"] = (FLUX2_HEAD,)
        out[f"{b}.norm.key_norm.scale"] = (FLUX2_HEAD,)
    _linear(out, "final_layer.linear", FLUX2_IN, hidden, bias=False)
    _linear(out, "final_layer.adaLN_modulation.1", 2 * hidden, hidden, bias=False)
    _linear(out, "double_stream_modulation_img.lin", 6 * hidden, hidden, bias=False)
    _linear(out, "double_stream_modulation_txt.lin", 6 * hidden, hidden, bias=False)
    _linear(out, "single_stream_modulation.lin", 3 * hidden, hidden, bias=False)
    return out


def flux2_llm_tensors(llm: LLMShape = KLEIN_LLM, layers: int = 1) -> Dict[str, Shape]:
    """The LLM text model in Hugging Face names (src/llm.hpp ``TextModel``), ``layers`` decoder layers."""
    h, vocab, mlp, qk_norm = llm
    out: Dict[str, Shape] = {"model.embed_tokens.weight": (vocab, h)}
    for i in range(layers):
        b = f"model.layers.{i}"
        llm_layer(out, b, h, (LLM_HEADS, LLM_KV_HEADS, LLM_HEAD), mlp, qkv_bias=False, qk_norm=qk_norm)
    out["model.norm.weight"] = (h,)
    return out


def flux2_vae_extra(out: Dict[str, Shape]) -> Dict[str, Shape]:
    """``post_quant_conv`` (32 -> 32, 1x1), which the FLUX.2 VAE keeps (``use_quant``), added to a decoder."""
    _conv(out, "post_quant_conv", FLUX2_LATENT, FLUX2_LATENT, 1)
    return out
