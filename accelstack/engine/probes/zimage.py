"""The shapes of the Z-Image probe: Z-Image's whole DiT, a one-layer Qwen3 text model, the Flux VAE's decoder.

What stable-diffusion.cpp (0.4.7, the bundled source) reads from the tensors and what it fixes:

* **DiT** (src/z_image.hpp): nothing is read. ``ZImageParams`` fixes 30 layers, 2 noise-refiner and
  2 context-refiner blocks of 3840 (30 heads of 128, an FFN of 10240), a 2560-wide caption input and
  16 latent channels, and the runner builds every block: 6.15 G parameters, 12.3 GB as f16. It cannot
  be reduced, so the probe stores its matrices as Q4_0 in a GGUF file (3.5 GB:
  :mod:`accelstack.engine.probes.gguf`), as the GGUF files users run Z-Image from on small GPUs are.
  ``get_sd_version`` (src/model.cpp) says Z-Image when ``cap_embedder.0.weight`` exists.
* **Text encoder** (src/llm.hpp ``LLMRunner``, arch QWEN3 for Z-Image: src/conditioner.hpp
  ``LLMEmbedder``): the layer count, hidden size and vocabulary (``embed_tokens``) and MLP width are
  read; 32 heads, 8 key/value heads of 128 and q/k norms are fixed. The hidden size must be the DiT's
  2560 caption width, and the vocabulary must hold the tokenizer's ids: Qwen3's 151936 x 2560
  embedding. One layer at Qwen3-4B's real widths (its 9728-wide MLP) runs its kernels; with fewer
  layers than the 36 whose output Z-Image takes, the last norm's output is used (``TextModel::forward``).
  The names are llama.cpp's (``blk.0.attn_q``), as Qwen3 GGUF files have them, which
  stable-diffusion.cpp converts (src/name_conversion.cpp ``llm_name_map``), so the probe runs that
  conversion as users' files do.
* **VAE**: the FLUX.1 16-channel autoencoder, loaded decode-only: the quarter-width decoder every
  16-channel probe here has (:func:`~.probe_families.vae_decoder_tensors`).
"""
from __future__ import annotations

from typing import Dict

from .architecture import Shape, _linear

__all__ = ["ZIMAGE_HIDDEN", "ZIMAGE_CAPTION", "zimage_dit_tensors", "qwen3_llm_tensors", "ZIMAGE_QUANTIZED"]

ZIMAGE_HIDDEN, ZIMAGE_HEAD = 3840, 128  # ZImageParams (src/z_image.hpp), fixed
ZIMAGE_HEADS = ZIMAGE_KV_HEADS = 30
ZIMAGE_LAYERS, ZIMAGE_REFINERS = 30, 2
ZIMAGE_FFN = 10240  # multiple_of 256 of 8/3 x 3840 (FeedForward)
ZIMAGE_CAPTION = 2560  # cap_feat_dim: Qwen3-4B's hidden size
ZIMAGE_ADALN = 256  # ADALN_EMBED_DIM: min(hidden, 256) wide modulation input
ZIMAGE_TIME = 1024  # TimestepEmbedder(min(hidden, 1024), 256, 256)
ZIMAGE_LATENT, ZIMAGE_PATCH = 16, 2
QWEN3_HEADS, QWEN3_KV_HEADS, QWEN3_HEAD = 32, 8, 128  # LLMParams for QWEN3 (src/llm.hpp), fixed
QWEN3_MLP = 9728  # Qwen3-4B's intermediate size (read from the gate projection)
QWEN3_VOCAB = 151936  # Qwen3's embedding rows
# The probe's Q4_0 matrices: the DiT's and the text model's (its final projection keeps F16: it is
# forced to f32 on load, src/z_image.hpp FinalLayer)
ZIMAGE_QUANTIZED = ("model.diffusion_model.layers.", "model.diffusion_model.noise_refiner.",
                    "model.diffusion_model.context_refiner.", "model.diffusion_model.cap_embedder.",
                    "model.diffusion_model.x_embedder.", "text_encoders.llm.")


def _block(out: Dict[str, Shape], name: str, modulation: bool) -> None:
    d = ZIMAGE_HIDDEN
    out[f"{name}.attention.qkv.weight"] = ((ZIMAGE_HEADS + 2 * ZIMAGE_KV_HEADS) * ZIMAGE_HEAD, d)
    out[f"{name}.attention.out.weight"] = (d, ZIMAGE_HEADS * ZIMAGE_HEAD)
    out[f"{name}.attention.q_norm.weight"] = (ZIMAGE_HEAD,)
    out[f"{name}.attention.k_norm.weight"] = (ZIMAGE_HEAD,)
    out[f"{name}.feed_forward.w1.weight"] = (ZIMAGE_FFN, d)
    out[f"{name}.feed_forward.w2.weight"] = (d, ZIMAGE_FFN)
    out[f"{name}.feed_forward.w3.weight"] = (ZIMAGE_FFN, d)
    for norm in ("attention_norm1", "ffn_norm1", "attention_norm2", "ffn_norm2"):
        out[f"{name}.{norm}.weight"] = (d,)
    if modulation:
        _linear(out, f"{name}.adaLN_modulation.0", 4 * d, ZIMAGE_ADALN)


def zimage_dit_tensors() -> Dict[str, Shape]:
    """Z-Image's DiT, every block, in its original names (src/z_image.hpp ``ZImageModel``)."""
    out: Dict[str, Shape] = {}
    d = ZIMAGE_HIDDEN
    _linear(out, "x_embedder", d, ZIMAGE_PATCH * ZIMAGE_PATCH * ZIMAGE_LATENT)
    _linear(out, "t_embedder.mlp.0", ZIMAGE_TIME, 256)
    _linear(out, "t_embedder.mlp.2", ZIMAGE_ADALN, ZIMAGE_TIME)
    out["cap_embedder.0.weight"] = (ZIMAGE_CAPTION,)
    _linear(out, "cap_embedder.1", d, ZIMAGE_CAPTION)
    out["cap_pad_token"] = (d,)
    out["x_pad_token"] = (d,)
    for i in range(ZIMAGE_REFINERS):
        _block(out, f"noise_refiner.{i}", True)
    for i in range(ZIMAGE_REFINERS):
        _block(out, f"context_refiner.{i}", False)
    for i in range(ZIMAGE_LAYERS):
        _block(out, f"layers.{i}", True)
    _linear(out, "final_layer.linear", ZIMAGE_PATCH * ZIMAGE_PATCH * ZIMAGE_LATENT, d)
    _linear(out, "final_layer.adaLN_modulation.1", d, ZIMAGE_ADALN)
    return out


def qwen3_llm_tensors(layers: int = 1, mlp: int = QWEN3_MLP) -> Dict[str, Shape]:
    """Qwen3's text model in llama.cpp's GGUF names, ``layers`` decoder layers (src/llm.hpp)."""
    h, head = ZIMAGE_CAPTION, QWEN3_HEAD
    out: Dict[str, Shape] = {"token_embd.weight": (QWEN3_VOCAB, h)}
    for i in range(layers):
        b = f"blk.{i}"
        out[f"{b}.attn_q.weight"] = (QWEN3_HEADS * head, h)
        out[f"{b}.attn_k.weight"] = (QWEN3_KV_HEADS * head, h)
        out[f"{b}.attn_v.weight"] = (QWEN3_KV_HEADS * head, h)
        out[f"{b}.attn_output.weight"] = (h, QWEN3_HEADS * head)
        out[f"{b}.attn_q_norm.weight"] = (head,)
        out[f"{b}.attn_k_norm.weight"] = (head,)
        out[f"{b}.ffn_gate.weight"] = (mlp, h)
        out[f"{b}.ffn_up.weight"] = (mlp, h)
        out[f"{b}.ffn_down.weight"] = (h, mlp)
        out[f"{b}.attn_norm.weight"] = (h,)
        out[f"{b}.ffn_norm.weight"] = (h,)
    out["output_norm.weight"] = (h,)
    return out
