"""Tiny LoRA and embedding files for the probe model (SD 1.x), synthesized by the tests."""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Dict, Tuple

import numpy as np

# Attention projections of the probe (SD 1.x in diffusers names, under the probe file's "unet." prefix).
BLOCKS = [f"down_blocks.{i}.attentions.{j}" for i in range(3) for j in range(2)] + ["mid_block.attentions.0"]
WIDTH = {"down_blocks.0": 320, "down_blocks.1": 640, "down_blocks.2": 1280, "mid_block": 1280}


def write_safetensors(path: Path, tensors: Dict[str, np.ndarray]) -> Path:
    header, offset, blobs = {}, 0, []
    for name, value in tensors.items():
        raw = np.ascontiguousarray(value, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(value.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))
    return path


def kohya_lora(path: Path, seed: int = 7, rank: int = 4, scale: float = 0.5) -> Path:
    """A tiny random kohya-style LoRA on the probe's attention projections."""
    rng = np.random.default_rng(seed)
    tensors: Dict[str, np.ndarray] = {}
    for block in BLOCKS:
        c = WIDTH[block.rsplit(".", 2)[0] if block.startswith("down") else "mid_block"]
        for proj in ("to_q", "to_v", "to_out.0"):
            key = f"lora_unet_{block}.transformer_blocks.0.attn1.{proj}".replace(".", "_")
            tensors[f"{key}.lora_down.weight"] = rng.normal(0, scale, (rank, c))
            tensors[f"{key}.lora_up.weight"] = rng.normal(0, scale, (c, rank))
            tensors[f"{key}.alpha"] = np.array(float(rank))
    return write_safetensors(path, tensors)


def flux_block_lora(path: Path, seed: int, alpha: bool = True) -> Path:
    """A tiny random kohya LoRA on the reduced Flux/Chroma probe's first double and single blocks
    (hidden 128: fused qkv 384 rows, linear1 896)."""
    rng = np.random.default_rng(seed)
    tensors: Dict[str, np.ndarray] = {}
    for module, (rows, cols) in {"double_blocks_0_img_attn_qkv": (384, 128), "single_blocks_0_linear1": (896, 128)}.items():
        tensors[f"lora_unet_{module}.lora_down.weight"] = rng.normal(0, 0.5, (4, cols))
        tensors[f"lora_unet_{module}.lora_up.weight"] = rng.normal(0, 0.5, (rows, 4))
        if alpha:
            tensors[f"lora_unet_{module}.alpha"] = np.array(4.0)
    return write_safetensors(path, tensors)


def embedding(path: Path, rows: int = 2, width: int = 768, seed: int = 3) -> Path:
    rng = np.random.default_rng(seed)
    return write_safetensors(path, {"emb_params": rng.normal(0, 0.5, (rows, width))})


# A Flux LoRA as ai-toolkit writes one, in diffusers' DiT names on the reduced Flux probe (hidden 128):
# {module: (rows, columns)}. stable-diffusion.cpp 0.4.7 logged "Only (6 / 10) LoRA tensors have been applied" for
# it: add_k_proj without add_q_proj and proj_mlp without to_q are slices of fused weights after a missing one
# (src/lora.hpp get_lora_weight_diff stops at the first missing slice). Seed 12 in the tests that use it.
AITK_FLUX_MODULES = {"transformer_blocks.0.attn.to_q": (128, 128), "transformer_blocks.0.attn.add_k_proj": (128, 128),
                     "transformer_blocks.0.ff.net.0.proj": (512, 128), "single_transformer_blocks.0.proj_mlp": (512, 128),
                     "single_transformer_blocks.0.proj_out": (128, 640)}


def dit_lora_tensors(modules: Dict[str, Tuple[int, int]], naming: str, seed: int) -> Dict[str, np.ndarray]:
    """The tensors of a tiny random LoRA on a DiT's ``modules`` ({dotted name: (rows, columns)}) in one of the
    namings LoRAs ship in: diffusers/PEFT (``transformer.``, lora_A/lora_B), ComfyUI (``diffusion_model.``) or
    kohya/musubi (``lora_unet_``, lora_down/lora_up with alpha)."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for module, (rows, cols) in modules.items():
        down, up = rng.normal(0, 0.5, (4, cols)), rng.normal(0, 0.5, (rows, 4))
        if naming == "kohya":
            key = "lora_unet_" + module.replace(".", "_")
            tensors.update({f"{key}.lora_down.weight": down, f"{key}.lora_up.weight": up, f"{key}.alpha": np.array(4.0)})
        else:
            key = ("transformer." if naming == "diffusers" else "diffusion_model.") + module
            tensors.update({f"{key}.lora_A.weight": down, f"{key}.lora_B.weight": up})
    return tensors


def dit_lora(path: Path, modules: Dict[str, Tuple[int, int]], naming: str, seed: int) -> Path:
    """:func:`dit_lora_tensors` written as a safetensors file at ``path``."""
    return write_safetensors(path, dit_lora_tensors(modules, naming, seed))


def check_refuses_embedding_and_controlnet(runtime, model: str, request: dict, folder: Path, monkeypatch) -> None:
    """A DiT family without a CLIP encoder or a ControlNet in stable-diffusion.cpp (Qwen-Image, Z-Image): an SD
    1.x embedding and ControlNet are each refused before any worker starts, and no image is written."""
    import pytest
    from component_files import write_controlnet, write_png_image

    from accelstack.engine import generation
    from accelstack.engine.errors import InvalidRequestError
    from accelstack.engine.worker.protocol import GenerateRequest

    embeds = folder / "embeddings"
    embeds.mkdir()
    embedding(embeds / "word.safetensors", width=768)
    net = write_controlnet(folder / "canny-sd15.safetensors")
    control = write_png_image(folder / "edges.png", 64, 64, seed=4)
    monkeypatch.setattr(generation, "Supervisor", lambda *a, **k: pytest.fail("a worker was started"))
    with pytest.raises(InvalidRequestError, match="no CLIP text encoder"):
        generation.generate(runtime, model, GenerateRequest(**dict(request, prompt="a word"), embeddings_dir=str(embeds)),
                            folder / "no.png")
    with pytest.raises(InvalidRequestError, match="takes no ControlNet"):
        generation.generate(runtime, model, GenerateRequest(**request, control_net=str(net), control_image=str(control)),
                            folder / "no.png")
    assert not (folder / "no.png").exists()
