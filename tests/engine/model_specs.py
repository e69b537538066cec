"""Model files of each family, synthesized with the real tensor names and shapes of that family.

Only headers are real: the data region is a sparse file (truncated to the size the header
declares), so a 23 GB "FLUX.1 [dev]" costs a few kilobytes of disk. Names and shapes follow the
published checkpoints (black-forest-labs FLUX.1, stabilityai SD 1.5 / 2.1 / SDXL base and refiner /
SD3 medium, Tongyi Z-Image, Qwen-Image, Comfy-Org's separate ae / clip_l / t5xxl files) in the
layouts stable-diffusion.cpp reads; the SD 1.x diffusers tensors come whole from
:func:`accelstack.engine.probes.architecture.sd1_tensors` (checked against shared/reference).
"""
from __future__ import annotations

import io
import json
import pickle
import struct
import zipfile
from pathlib import Path
from typing import Dict, Tuple

from accelstack.engine.models.gguf_check import GGML_TYPES
from accelstack.engine.probes.architecture import sd1_tensors

Spec = Dict[str, Tuple[Tuple[int, ...], str]]  # name -> (shape in PyTorch order, dtype)
ITEM = {"F16": 2, "BF16": 2, "F32": 4, "F8_E4M3": 1, "F8_E5M2": 1}
GGML_ID = {"F32": 0, "F16": 1, "Q8_0": 8, "Q4_K": 12, "BF16": 30}


def write_safetensors(path: Path, spec: Spec) -> Path:
    header: Dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (shape, dtype) in spec.items():
        n = ITEM[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        fh.truncate(8 + len(raw) + offset)  # sparse: the data region costs no disk
    return path


def write_gguf(path: Path, spec: Spec) -> Path:
    infos, offset = b"", 0
    for name, (shape, dtype) in spec.items():
        kind = GGML_ID[dtype]
        block, block_bytes = GGML_TYPES[kind]
        dims = list(reversed(shape))  # ggml order: innermost first
        n = 1
        for d in dims:
            n *= d
        raw = name.encode()
        infos += struct.pack("<Q", len(raw)) + raw + struct.pack("<I", len(dims))
        infos += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", kind, offset)
        offset += -(-(n // block * block_bytes) // 32) * 32
    head = b"GGUF" + struct.pack("<IQQ", 3, len(spec), 0) + infos
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(-(-len(head) // 32) * 32 + offset)
    return path


class _Storage:
    """Pickled as torch pickles a storage: a persistent id naming torch.<Kind>Storage."""

    def __init__(self, key: str, numel: int) -> None:
        self.key, self.numel = key, numel


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: object) -> object:
        if isinstance(obj, _Storage):
            return ("storage", HalfStorage, obj.key, "cpu", obj.numel)
        return None


class HalfStorage:
    """Pickled by reference, then renamed torch.HalfStorage in the bytes."""


class _Tensor:
    def __init__(self, storage: _Storage, shape: Tuple[int, ...]) -> None:
        self.storage, self.shape = storage, shape


class TrainerState:
    """Stands for what Lightning checkpoints carry beside the weights (pickled with NEWOBJ and BUILD)."""

    def __init__(self) -> None:
        self.epoch, self.callbacks = 3, {"ModelCheckpoint": {"best": 0.5}}


def write_ckpt(path: Path, spec: Spec, extra: bool = False) -> Path:
    """A torch zip checkpoint ({"state_dict": {name: tensor}}) whose data.pkl has the opcodes
    torch.save writes (GLOBAL torch._utils _rebuild_tensor_v2, BINPERSID storages); no torch."""
    buf = io.BytesIO()
    p = _Pickler(buf, protocol=2)

    def reducer(obj: object) -> object:
        if isinstance(obj, _Tensor):
            stride = tuple(_count(obj.shape[i + 1:]) for i in range(len(obj.shape)))
            return (_rebuild_tensor_v2, (obj.storage, 0, obj.shape, stride, False, {}))
        return NotImplemented

    p.reducer_override = reducer  # type: ignore[method-assign]
    state = {name: _Tensor(_Storage(str(i), _count(shape)), shape) for i, (name, (shape, _)) in enumerate(spec.items())}
    p.dump({"global_step": 470000, "trainer": TrainerState(), "state_dict": state} if extra else {"state_dict": state})
    data = buf.getvalue()
    for module in (__name__.encode(),):
        data = data.replace(module + b"\n_rebuild_tensor_v2", b"torch._utils\n_rebuild_tensor_v2")
        data = data.replace(module + b"\nHalfStorage", b"torch\nHalfStorage")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", data)
        zf.writestr("archive/version", "3\n")
    return path


def _rebuild_tensor_v2(*args: object) -> None:  # a name for the pickle to reference
    return None


def _count(shape: Tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# -- the families ---------------------------------------------------------------------------------------
def _lin(spec: Spec, name: str, out: int, inp: int, dtype: str, bias: bool = True) -> None:
    spec[f"{name}.weight"] = ((out, inp), dtype)
    if bias:
        spec[f"{name}.bias"] = ((out,), dtype)


def flux(variant: str = "dev", prefix: str = "", dtype: str = "BF16") -> Spec:
    """FLUX.1 in the original (BFL / ComfyUI) names: 19 double and 38 single blocks, hidden 3072."""
    s: Spec = {}
    h, mlp = 3072, 12288
    _lin(s, f"{prefix}img_in", h, 384 if variant == "fill" else 64, dtype)
    _lin(s, f"{prefix}txt_in", h, 4096, dtype)
    for emb, inp in (("time_in", 256), ("vector_in", 768)) + ((("guidance_in", 256),) if variant in ("dev", "fill") else ()):
        _lin(s, f"{prefix}{emb}.in_layer", h, inp, dtype)
        _lin(s, f"{prefix}{emb}.out_layer", h, h, dtype)
    for i in range(19):
        for side in ("img", "txt"):
            b = f"{prefix}double_blocks.{i}.{side}"
            _lin(s, f"{b}_mod.lin", 6 * h, h, dtype)
            _lin(s, f"{b}_attn.qkv", 3 * h, h, dtype)
            s[f"{b}_attn.norm.query_norm.scale"] = ((128,), dtype)
            s[f"{b}_attn.norm.key_norm.scale"] = ((128,), dtype)
            _lin(s, f"{b}_attn.proj", h, h, dtype)
            _lin(s, f"{b}_mlp.0", mlp, h, dtype)
            _lin(s, f"{b}_mlp.2", h, mlp, dtype)
    for i in range(38):
        b = f"{prefix}single_blocks.{i}"
        _lin(s, f"{b}.linear1", 3 * h + mlp, h, dtype)
        _lin(s, f"{b}.linear2", h, h + mlp, dtype)
        s[f"{b}.norm.query_norm.scale"] = ((128,), dtype)
        s[f"{b}.norm.key_norm.scale"] = ((128,), dtype)
        _lin(s, f"{b}.modulation.lin", 3 * h, h, dtype)
    _lin(s, f"{prefix}final_layer.linear", 64, h, dtype)
    _lin(s, f"{prefix}final_layer.adaLN_modulation.1", 2 * h, h, dtype)
    return s


def chroma() -> Spec:
    s = {k: v for k, v in flux("schnell").items() if "_mod." not in k and "modulation" not in k
         and not k.startswith("vector_in") and not k.startswith("time_in")}
    _lin(s, "distilled_guidance_layer.in_proj", 5120, 64, "BF16")
    for i in range(5):
        _lin(s, f"distilled_guidance_layer.layers.{i}.in_layer", 5120, 5120, "BF16")
        _lin(s, f"distilled_guidance_layer.layers.{i}.out_layer", 5120, 5120, "BF16")
    _lin(s, "distilled_guidance_layer.out_proj", 3072, 5120, "BF16")
    return s


def flux_diffusers(dev: bool = True) -> Spec:
    """FLUX.1 as diffusers' transformer/diffusion_pytorch_model.safetensors names it (a few blocks)."""
    s: Spec = {}
    _lin(s, "x_embedder", 3072, 64, "BF16")
    _lin(s, "context_embedder", 3072, 4096, "BF16")
    _lin(s, "time_text_embed.timestep_embedder.linear_1", 3072, 256, "BF16")
    if dev:
        _lin(s, "time_text_embed.guidance_embedder.linear_1", 3072, 256, "BF16")
    _lin(s, "transformer_blocks.0.attn.to_q", 3072, 3072, "BF16")
    _lin(s, "transformer_blocks.0.norm1_context.linear", 18432, 3072, "BF16")
    _lin(s, "single_transformer_blocks.0.proj_mlp", 12288, 3072, "BF16")
    _lin(s, "single_transformer_blocks.0.proj_out", 3072, 15360, "BF16")
    return s


def sd1_diffusers() -> Spec:
    """SD 1.x whole, under the prefixes stable-diffusion.cpp gives a diffusers folder's files."""
    prefixes = {"unet": "unet.", "vae": "vae.", "text_encoder": "te."}
    return {prefixes[part] + name: (shape, "F16") for part, tensors in sd1_tensors().items()
            for name, shape in tensors.items()}


def unet_original(ctx: int, first: int = 320, in_ch: int = 4, dm: str = "model.diffusion_model.") -> Spec:
    """The ldm/sgm UNet's identifying tensors (input conv, a cross-attention, the middle block)."""
    s: Spec = {}
    s[f"{dm}input_blocks.0.0.weight"] = ((first, in_ch, 3, 3), "F16")
    s[f"{dm}input_blocks.0.0.bias"] = ((first,), "F16")
    width = first * 2 if ctx in (2048, 1280) else first  # SDXL's first level has no attention
    block = 4 if ctx in (2048, 1280) else 1
    a = f"{dm}input_blocks.{block}.1.transformer_blocks.0"
    s[f"{a}.attn2.to_q.weight"] = ((width, width), "F16")
    s[f"{a}.attn2.to_k.weight"] = ((width, ctx), "F16")
    s[f"{a}.attn2.to_v.weight"] = ((width, ctx), "F16")
    s[f"{dm}middle_block.1.proj_in.weight"] = ((first * 4, first * 4), "F16")
    s[f"{dm}out.2.weight"] = ((4, first, 3, 3), "F16")
    return s


def sd_vae(prefix: str, latent: int = 4) -> Spec:
    return {f"{prefix}decoder.conv_in.weight": ((512, latent, 3, 3), "F16"),
            f"{prefix}decoder.conv_in.bias": ((512,), "F16"),
            f"{prefix}encoder.conv_in.weight": ((128, 3, 3, 3), "F16"),
            f"{prefix}encoder.conv_out.weight": ((2 * latent, 512, 3, 3), "F16"),
            f"{prefix}quant_conv.weight": ((2 * latent, 2 * latent, 1, 1), "F16")} if latent == 4 else {
            f"{prefix}decoder.conv_in.weight": ((512, latent, 3, 3), "F32"),
            f"{prefix}decoder.conv_in.bias": ((512,), "F32"),
            f"{prefix}encoder.conv_in.weight": ((128, 3, 3, 3), "F32"),
            f"{prefix}encoder.conv_out.weight": ((2 * latent, 512, 3, 3), "F32")}


def clip_hf(prefix: str, width: int) -> Spec:
    return {f"{prefix}text_model.embeddings.token_embedding.weight": ((49408, width), "F16"),
            f"{prefix}text_model.embeddings.position_embedding.weight": ((77, width), "F16"),
            f"{prefix}text_model.encoder.layers.0.self_attn.k_proj.weight": ((width, width), "F16"),
            f"{prefix}text_model.final_layer_norm.weight": ((width,), "F16")}


def openclip(prefix: str, width: int) -> Spec:
    return {f"{prefix}model.token_embedding.weight": ((49408, width), "F16"),
            f"{prefix}model.positional_embedding": ((77, width), "F16"),
            f"{prefix}model.transformer.resblocks.0.attn.in_proj_weight": ((3 * width, width), "F16"),
            f"{prefix}model.ln_final.weight": ((width,), "F16")}


def t5xxl(prefix: str = "", dtype: str = "F16") -> Spec:
    return {f"{prefix}shared.weight": ((32128, 4096), dtype),
            f"{prefix}encoder.block.0.layer.0.SelfAttention.k.weight": ((4096, 4096), dtype),
            f"{prefix}encoder.block.0.layer.1.DenseReluDense.wi_0.weight": ((10240, 4096), dtype),
            f"{prefix}encoder.final_layer_norm.weight": ((4096,), dtype)}


def sd1_original() -> Spec:
    return {**unet_original(768), **sd_vae("first_stage_model."),
            **clip_hf("cond_stage_model.transformer.", 768)}


def sd2_original() -> Spec:
    return {**unet_original(1024), **sd_vae("first_stage_model."), **openclip("cond_stage_model.", 1024)}


def sdxl_original() -> Spec:
    return {**unet_original(2048), **sd_vae("first_stage_model."),
            **clip_hf("conditioner.embedders.0.transformer.", 768), **openclip("conditioner.embedders.1.", 1280)}


def sdxl_refiner() -> Spec:
    return {**unet_original(1280, first=384), **sd_vae("first_stage_model."), **openclip("conditioner.embedders.0.", 1280)}


def sd3_original() -> Spec:
    dm = "model.diffusion_model."
    s: Spec = {f"{dm}x_embedder.proj.weight": ((1536, 16, 2, 2), "F16"),
               f"{dm}context_embedder.weight": ((1536, 4096), "F16"),
               f"{dm}joint_blocks.0.x_block.attn.qkv.weight": ((4608, 1536), "F16"),
               f"{dm}joint_blocks.0.context_block.attn.qkv.weight": ((4608, 1536), "F16"),
               f"{dm}final_layer.linear.weight": ((64, 1536), "F16")}
    return {**s, **sd_vae("first_stage_model.", 16), **clip_hf("text_encoders.clip_l.transformer.", 768),
            **clip_hf("text_encoders.clip_g.transformer.", 1280), **t5xxl("text_encoders.t5xxl.transformer.")}


def sd3_large() -> Spec:
    """SD3.5-large's MMDiT alone (38 joint blocks of 64 x 38 = 2432: src/mmdit.hpp reads the depth from the names)."""
    dm, h = "model.diffusion_model.", 2432
    return {f"{dm}x_embedder.proj.weight": ((h, 16, 2, 2), "BF16"), f"{dm}context_embedder.weight": ((h, 4096), "BF16"),
            **{f"{dm}joint_blocks.{i}.x_block.attn.qkv.weight": ((3 * h, h), "BF16") for i in (0, 37)},
            f"{dm}final_layer.linear.weight": ((64, h), "BF16")}


def z_image() -> Spec:
    s: Spec = {"cap_embedder.0.weight": ((2560,), "BF16"), "all_x_embedder.2-1.weight": ((3840, 64), "BF16")}
    _lin(s, "cap_embedder.1", 3840, 2560, "BF16")
    for i in range(30):
        _lin(s, f"layers.{i}.attention.qkv", 11520, 3840, "BF16", bias=False)
        _lin(s, f"layers.{i}.feed_forward.w1", 10240, 3840, "BF16", bias=False)
    _lin(s, "noise_refiner.0.attention.qkv", 11520, 3840, "BF16", bias=False)
    return s


def qwen_image() -> Spec:
    s: Spec = {}
    _lin(s, "img_in", 3072, 64, "BF16")
    _lin(s, "txt_in", 3072, 3584, "BF16")
    for i in range(2):
        _lin(s, f"transformer_blocks.{i}.img_mod.1", 18432, 3072, "BF16")
        _lin(s, f"transformer_blocks.{i}.txt_mod.1", 18432, 3072, "BF16")
        _lin(s, f"transformer_blocks.{i}.attn.to_q", 3072, 3072, "BF16")
    return s


def t5xxl_gguf() -> Spec:
    """T5-XXL's encoder as llama.cpp names it in GGUF (city96's t5-v1_1-xxl-encoder-gguf)."""
    return {"token_embd.weight": ((32128, 4096), "Q8_0"), "enc.blk.0.attn_k.weight": ((4096, 4096), "Q8_0"),
            "enc.blk.0.ffn_gate.weight": ((10240, 4096), "Q8_0"), "enc.output_norm.weight": ((4096,), "F32")}


def qwen3_4b_gguf() -> Spec:
    """Qwen3-4B as llama.cpp names it in GGUF (the Qwen3-4B-Instruct-2507 GGUF files docs/z_image.md names)."""
    return {"token_embd.weight": ((151936, 2560), "Q4_K"), "blk.0.attn_q.weight": ((4096, 2560), "Q4_K"),
            "blk.0.attn_q_norm.weight": ((128,), "F32"), "blk.0.ffn_gate.weight": ((9728, 2560), "Q4_K"),
            "output_norm.weight": ((2560,), "F32")}


def qwen3_4b() -> Spec:
    return {"model.embed_tokens.weight": ((151936, 2560), "BF16"),
            "model.layers.0.self_attn.q_proj.weight": ((4096, 2560), "BF16"),
            "model.layers.0.mlp.gate_proj.weight": ((9728, 2560), "BF16"),
            "model.norm.weight": ((2560,), "BF16")}
