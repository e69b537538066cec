"""Which tensors stable-diffusion.cpp converts when a model is loaded with a ``weight_type`` (issue 45).

``ModelLoader::tensor_should_be_converted`` (src/model.cpp, 0.4.7) converts a tensor only when its rows
(ggml's ne[0], the last dimension in PyTorch order) fill the type's blocks and its name is not a bias, a
scale or an embedding (FLUX's img_in/txt_in/time_in/vector_in/guidance_in/final_layer, MMDiT's
x/t/y_embedder, pos_embed, context_embedder, the UNet's time_embed/label_emb); every other tensor keeps its
loaded type. A Conv2d weight is made F16 whatever the type (src/ggml_extend.hpp ``Conv2d::init_params``):
its rows are the kernel's width (3 or 1), never a block's multiple, so the row rule already keeps it; a
norm's vector is made F32 by its block, so only matrices and larger are counted. On the SD 1.x UNet most
parameters are 3x3 convolutions: q8_0 keeps 1.7 of its 2.0 GiB, not the 1.1 GiB every-parameter count said.
"""
from __future__ import annotations

from typing import Dict, Iterable, Tuple

__all__ = ["BLOCKS", "KEPT_NAMES", "converted", "convertible"]

BLOCKS = (32, 256)  # the block sizes of the types accelstack converts to: q8_0 (and q4_0/q5_0...), q4_k
KEPT_NAMES = ("img_in.", "txt_in.", "time_in.", "vector_in.", "guidance_in.", "final_layer.", "x_embedder.",
              "t_embedder.", "y_embedder.", "pos_embed", "context_embedder.", "time_embed.", "label_emb.",
              "embedding")


def converted(name: str, shape: Tuple[int, ...], block: int) -> bool:
    """Whether the tensor ``name`` of ``shape`` (PyTorch order) is converted to a type of ``block``."""
    if len(shape) < 2 or shape[-1] % block or name.endswith((".bias", ".scale")):
        return False
    return not any(k in name for k in KEPT_NAMES)


def convertible(tensors: Iterable[Tuple[str, Tuple[int, ...]]]) -> Dict[int, int]:
    """``{block: parameters converted to a type of that block}`` of ``(name, shape)`` pairs."""
    out = {b: 0 for b in BLOCKS}
    for name, shape in tensors:
        count = 1
        for d in shape:
            count *= d
        for b in BLOCKS:
            if converted(name, shape, b):
                out[b] += count
    return out
