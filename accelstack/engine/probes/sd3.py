"""The shapes of the reduced SD 3.x probe: the smallest MMDiT stable-diffusion.cpp builds, with CLIP-L and CLIP-G.

What stable-diffusion.cpp (0.4.7, the bundled source) reads from the tensors and what it fixes:

* **MMDiT** (src/mmdit.hpp ``MMDiT``): only the depth (``joint_blocks.N``, and it *starts* at 24: names
  only raise it), the q/k norm kind (``attn.ln_q``) and SD3.5's MMDiT-X blocks (``attn2``) are read.
  The width is 64 x depth with one 64-wide head per block; the context width 4096 (T5-XXL's), the
  pooled width 2048 (``y_embedder``), the 192 x 192 ``pos_embed`` and patch 2 are fixed, and every
  tensor must be there with its exact shape (src/model.cpp ``load_tensors``). So the smallest MMDiT
  is SD3-medium's own: 24 blocks of 1536, 2.08 G parameters. ``get_sd_version`` (src/model.cpp) says
  SD3.x for any ``joint_blocks.`` name; SD3.5's layouts only add parameters (MMDiT-X 2.27 G and up).
* **Text encoders** (src/conditioner.hpp ``SD3CLIPEmbedder``): T5-XXL may be left out (zeros of its
  4096 x 77 take its place); CLIP-L and CLIP-G may not: without CLIP-G the pooled vectors' concat
  aborts ("Tensor concat requires same rank"), and without CLIP-L it writes its zeros to the wrong
  vector and aborts the same way. Both are fixed (src/clip.hpp: 123 M and 694 M).
* **VAE** (src/auto_encoder_kl.hpp): 16 latent channels, no ``post_quant_conv`` for the DiTs, the
  decoder's width read from ``decoder.conv_in``: the probes' quarter-width decode-only VAE.

Measured with sd-cli on the 2-core CPU build (64x64, one step, CFG 1): 2.91 G parameters (2.9 GB as
F8), 9.4 s with the load, 6.0 GB of RAM: the largest probe, so ``verify`` runs it only when asked.
"""
from __future__ import annotations

from typing import Dict

from .architecture import Shape, _linear

__all__ = ["MMDIT_MIN_DEPTH", "mmdit_tensors"]

MMDIT_MIN_DEPTH = 24  # MMDiT's depth before the block names are read; they only raise it
MMDIT_HEAD = 64  # hidden = 64 x depth, heads = depth
MMDIT_CONTEXT = 4096  # context_embedder's input: T5-XXL's width
MMDIT_POOLED = 2048  # y_embedder's input: CLIP-L's 768 + CLIP-G's 1280 pooled
MMDIT_POS = 192  # pos_embed_max_size
MMDIT_LATENT, MMDIT_PATCH, MMDIT_MLP = 16, 2, 4


def mmdit_tensors(depth: int = MMDIT_MIN_DEPTH) -> Dict[str, Shape]:
    """SD3's MMDiT in its original names (no q/k norm, no MMDiT-X blocks): ``depth`` joint blocks of
    64 x ``depth``; the last block's context half is pre-only (its qkv and modulation alone)."""
    h = MMDIT_HEAD * depth
    out: Dict[str, Shape] = {"pos_embed": (1, MMDIT_POS * MMDIT_POS, h),
                             "x_embedder.proj.weight": (h, MMDIT_LATENT, MMDIT_PATCH, MMDIT_PATCH),
                             "x_embedder.proj.bias": (h,)}
    _linear(out, "t_embedder.mlp.0", h, 256)
    _linear(out, "t_embedder.mlp.2", h, h)
    _linear(out, "y_embedder.mlp.0", h, MMDIT_POOLED)
    _linear(out, "y_embedder.mlp.2", h, h)
    _linear(out, "context_embedder", h, MMDIT_CONTEXT)
    for i in range(depth):
        for side in ("context_block", "x_block"):
            b = f"joint_blocks.{i}.{side}"
            pre_only = side == "context_block" and i == depth - 1
            _linear(out, f"{b}.attn.qkv", 3 * h, h)
            if not pre_only:  # norm1/norm2 are LayerNorms without weights
                _linear(out, f"{b}.attn.proj", h, h)
                _linear(out, f"{b}.mlp.fc1", MMDIT_MLP * h, h)
                _linear(out, f"{b}.mlp.fc2", h, MMDIT_MLP * h)
            _linear(out, f"{b}.adaLN_modulation.1", (2 if pre_only else 6) * h, h)
    _linear(out, "final_layer.linear", MMDIT_PATCH * MMDIT_PATCH * MMDIT_LATENT, h)
    _linear(out, "final_layer.adaLN_modulation.1", 2 * h, h)
    return out
