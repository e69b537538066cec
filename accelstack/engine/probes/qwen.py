"""The shapes of the reduced Qwen-Image probe: its DiT, its Qwen2.5-VL text model and the Wan VAE's decoder.

What stable-diffusion.cpp (0.4.7, the bundled source) reads from the tensors and what it fixes decides
how small each part can be:

* **DiT** (src/qwen_image.hpp): only the block count is read (``QwenImageRunner`` counts
  ``transformer_blocks.N``); ``QwenImageParams`` fixes 24 heads of 128 (3072 wide), the text context
  width 3584 (``joint_attention_dim``), 64 input and 16 output channels, patch 2. ``get_sd_version``
  (src/model.cpp) says Qwen Image when ``transformer_blocks.0.img_mod.1.weight`` exists: one block
  (340 M) is the smallest, 380 M in all.
* **Text encoder** (src/llm.hpp ``LLMRunner``): the layer count, the hidden size and vocabulary (from
  ``embed_tokens``) and the MLP width (``layers.0.mlp.gate_proj``) are read; 28 heads, 4 key/value heads
  and the head size 128 are fixed. The hidden size must be the DiT's 3584 (its ``txt_norm`` aborts
  otherwise) and the vocabulary must hold the tokenizer's special tokens (151645 aborts the embedding
  lookup): the 152064 x 3584 embedding, 545 M, is most of the probe. Qwen-Image has no fallback without
  it (``LLMEmbedder`` in src/conditioner.hpp: the load fails), unlike Flux without T5. One layer at the
  real widths (its 18944-wide MLP too: 233 M) runs its attention (rotary, grouped-query) and MLP kernels,
  and its working memory is the real model's (the layers run one after the other). The vision tower is built only when
  the VAE encoder is (src/stable-diffusion.cpp): not for a text-to-image probe.
* **VAE** (src/wan.hpp ``WanVAE``): every width is fixed (96, multipliers 1, 2, 4, 4, 16 latent
  channels); loaded decode-only, it is the decoder and ``conv2``: 73 M. Its RMS norms' ``gamma`` are
  stored 1-D (any shape of n values is read), so the probe's value rule makes them 1.

Measured on the 2-core CPU build (sd-cli, 64x64, one step, with a 32-wide MLP: 1.03 G parameters):
2.3 s with the load, 2.1 GB of RAM; the real MLP width makes it 1.23 G. 8x8 aborts in the VAE decode
(a ggml assertion); 16x16 is the smallest that runs.
"""
from __future__ import annotations

from typing import Dict, Tuple

from .architecture import Shape, _linear, llm_layer

__all__ = ["QWEN_CONTEXT", "qwen_dit_tensors", "qwen_llm_tensors", "wan_decoder_tensors"]

QWEN_HEADS, QWEN_HEAD = 24, 128  # QwenImageParams (src/qwen_image.hpp), fixed
QWEN_INNER = QWEN_HEADS * QWEN_HEAD
QWEN_CONTEXT = 3584  # joint_attention_dim: Qwen2.5-VL 7B's hidden size
QWEN_IN, QWEN_OUT, QWEN_PATCH = 64, 16, 2
QWEN_TIME = 256  # the sinusoidal timestep embedding's width
LLM_HEADS, LLM_KV_HEADS = 28, 4  # LLMParams (src/llm.hpp), fixed; the head size is QWEN_HEAD
LLM_MLP = 18944  # Qwen2.5-VL 7B's MLP width (read from gate_proj: the real one, so its kernels and memory are)
LLM_VOCAB = 152064  # Qwen2.5-VL's embedding rows (the tokenizer's ids reach 151664)
WAN_DIM, WAN_LATENT, WAN_MULT = 96, 16, (1, 2, 4, 4)  # WanVAE (src/wan.hpp), fixed


def qwen_dit_tensors(blocks: int = 1) -> Dict[str, Shape]:
    """Qwen-Image's MMDiT with ``blocks`` joint blocks at its fixed width (src/qwen_image.hpp)."""
    out: Dict[str, Shape] = {}
    d = QWEN_INNER
    _linear(out, "time_text_embed.timestep_embedder.linear_1", d, QWEN_TIME)
    _linear(out, "time_text_embed.timestep_embedder.linear_2", d, d)
    out["txt_norm.weight"] = (QWEN_CONTEXT,)
    _linear(out, "img_in", d, QWEN_IN)
    _linear(out, "txt_in", d, QWEN_CONTEXT)
    for i in range(blocks):
        b = f"transformer_blocks.{i}"
        for side in ("img", "txt"):
            _linear(out, f"{b}.{side}_mod.1", 6 * d, d)
            _linear(out, f"{b}.{side}_mlp.net.0.proj", 4 * d, d)
            _linear(out, f"{b}.{side}_mlp.net.2", d, 4 * d)
        for proj in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0", "to_add_out"):
            _linear(out, f"{b}.attn.{proj}", d, d)
        for norm in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
            out[f"{b}.attn.{norm}.weight"] = (QWEN_HEAD,)
    _linear(out, "norm_out.linear", 2 * d, d)  # norm_out.norm is a LayerNorm without weights
    _linear(out, "proj_out", QWEN_PATCH * QWEN_PATCH * QWEN_OUT, d)
    return out


def qwen_llm_tensors(layers: int = 1, mlp: int = LLM_MLP) -> Dict[str, Shape]:
    """Qwen2.5-VL's text model in Hugging Face names (src/llm.hpp), ``layers`` decoder layers."""
    h = QWEN_CONTEXT
    out: Dict[str, Shape] = {"model.embed_tokens.weight": (LLM_VOCAB, h)}
    for i in range(layers):
        b = f"model.layers.{i}"
        llm_layer(out, b, h, (LLM_HEADS, LLM_KV_HEADS, QWEN_HEAD), mlp, qkv_bias=True, qk_norm=False)
    out["model.norm.weight"] = (h,)
    return out


def _causal_conv(out: Dict[str, Shape], name: str, n_out: int, n_in: int, k: Tuple[int, int, int]) -> None:
    out[f"{name}.weight"] = (n_out, n_in) + k  # CausalConv3d: [out, in, t, h, w]
    out[f"{name}.bias"] = (n_out,)


def _wan_resblock(out: Dict[str, Shape], name: str, n_in: int, n_out: int) -> None:
    out[f"{name}.residual.0.gamma"] = (n_in,)
    _causal_conv(out, f"{name}.residual.2", n_out, n_in, (3, 3, 3))
    out[f"{name}.residual.3.gamma"] = (n_out,)
    _causal_conv(out, f"{name}.residual.6", n_out, n_out, (3, 3, 3))
    if n_in != n_out:
        _causal_conv(out, f"{name}.shortcut", n_out, n_in, (1, 1, 1))


def wan_decoder_tensors() -> Dict[str, Shape]:
    """The Wan 2.1 VAE as a decode-only load builds it: ``decoder.*`` and ``conv2`` (src/wan.hpp
    ``WanVAE``, ``Decoder3d``: three ResBlocks per level, the first two levels also upsample in time)."""
    out: Dict[str, Shape] = {}
    dims = [WAN_MULT[-1] * WAN_DIM] + [WAN_DIM * m for m in reversed(WAN_MULT)]  # 384 384 384 192 96
    _causal_conv(out, "decoder.conv1", dims[0], WAN_LATENT, (3, 3, 3))
    _wan_resblock(out, "decoder.middle.0", dims[0], dims[0])
    out["decoder.middle.1.norm.gamma"] = (dims[0],)
    out["decoder.middle.1.to_qkv.weight"] = (3 * dims[0], dims[0], 1, 1)
    out["decoder.middle.1.to_qkv.bias"] = (3 * dims[0],)
    out["decoder.middle.1.proj.weight"] = (dims[0], dims[0], 1, 1)
    out["decoder.middle.1.proj.bias"] = (dims[0],)
    _wan_resblock(out, "decoder.middle.2", dims[0], dims[0])
    index, n_out = 0, dims[0]
    for level in range(len(dims) - 1):
        n_in, n_out = dims[level], dims[level + 1]
        if level > 0:
            n_in //= 2  # the previous level's upsampler halves the channels
        for _ in range(3):
            _wan_resblock(out, f"decoder.upsamples.{index}", n_in, n_out)
            index, n_in = index + 1, n_out
        if level < len(WAN_MULT) - 1:
            up = f"decoder.upsamples.{index}"
            out[f"{up}.resample.1.weight"] = (n_out // 2, n_out, 3, 3)
            out[f"{up}.resample.1.bias"] = (n_out // 2,)
            if level < 2:
                _causal_conv(out, f"{up}.time_conv", 2 * n_out, n_out, (3, 1, 1))
            index += 1
    out["decoder.head.0.gamma"] = (n_out,)
    _causal_conv(out, "decoder.head.2", 3, n_out, (3, 3, 3))
    _causal_conv(out, "conv2", WAN_LATENT, WAN_LATENT, (1, 1, 1))
    return out
