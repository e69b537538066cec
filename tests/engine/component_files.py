"""Component files for the SD 1.x probe, synthesized by the tests: a standalone VAE (the probe's own
VAE tensors), an SD 1.x ControlNet (full size: stable-diffusion.cpp fixes its widths), PNG images."""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

from accelstack.engine.png import encode_png
from accelstack.engine.probes.architecture import Shape, _conv, _linear, _norm, _transformer  # the probe's own builders
from accelstack.engine.probes.layout import probe_weights
from accelstack.engine.probes.weights import Pools, write_part


def standalone_vae(probe_path: str, out: Path, prefix: str = "vae.") -> Path:
    """The probe's VAE as a file of its own: its ``vae.`` tensors, bytes as stored, names without the
    prefix (the diffusers VAE names stable-diffusion.cpp reads from ``vae_path`` under ``vae.``,
    src/stable-diffusion.cpp new_sd_ctx)."""
    return extract_part(probe_path, out, prefix)


def extract_part(probe_path: str, out: Path, prefix: str) -> Path:
    """The tensors of a probe file under ``prefix`` as a file of their own, names without it (the
    component files users have: stable-diffusion.cpp gives each its prefix back as it loads it)."""
    return _rewrite(probe_path, out, lambda name: name[len(prefix):] if name.startswith(prefix) else None)


def split_probe(family: str, folder: Path, files: Dict[str, str]) -> Tuple[str, Path]:
    """Family ``family``'s probe (kept in ``folder``/cache) and its parts as files of their own in ``folder``,
    ``files`` naming each ({file name: the probe's prefix}): a model in separate files, as users have it."""
    from accelstack.engine.probes.family_files import ensure_family_probe

    probe = ensure_family_probe(family, 1234, folder / "cache", keep=True)
    for name, prefix in files.items():
        extract_part(probe.path, folder / name, prefix)
    return probe.path, folder


def drop_part(probe_path: str, out: Path, prefix: str) -> Path:
    """The probe file without its tensors under ``prefix`` (a checkpoint that lacks a text encoder)."""
    return _rewrite(probe_path, out, lambda name: None if name.startswith(prefix) else name)


def _rewrite(probe_path: str, out: Path, rename: Callable[[str], Optional[str]]) -> Path:
    """A safetensors copy of the tensors ``rename`` keeps (its new name; None: left out), bytes as stored."""
    src = probe_weights(probe_path) or probe_path
    with open(src, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
        base = 8 + n
        items = [(k, v, rename(k)) for k, v in header.items() if k != "__metadata__" and rename(k) is not None]
        new: Dict[str, object] = {}
        offset = 0
        for _name, meta, new_name in items:
            a, b = meta["data_offsets"]
            new[str(new_name)] = {"dtype": meta["dtype"], "shape": meta["shape"], "data_offsets": [offset, offset + b - a]}
            offset += b - a
        raw = json.dumps(new).encode()
        raw += b" " * (-(8 + len(raw)) % 8)
        with open(out, "wb") as dst:
            dst.write(struct.pack("<Q", len(raw)) + raw)
            for _name, meta, _new in items:
                a, b = meta["data_offsets"]
                fh.seek(base + a)
                dst.write(fh.read(b - a))
    return out


# -- an SD ControlNet in the original (LDM) names src/control.hpp ControlNetBlock declares ----------
# (control.hpp never sets use_linear_projection: its SpatialTransformers take the projections the file has)
def _resblock(out: Dict[str, Shape], name: str, n_in: int, n_out: int, emb: int) -> None:
    """src/common_block.hpp ResBlock."""
    _norm(out, f"{name}.in_layers.0", n_in)
    _conv(out, f"{name}.in_layers.2", n_out, n_in, 3)
    _linear(out, f"{name}.emb_layers.1", n_out, emb)
    _norm(out, f"{name}.out_layers.0", n_out)
    _conv(out, f"{name}.out_layers.3", n_out, n_out, 3)
    if n_in != n_out:
        _conv(out, f"{name}.skip_connection", n_out, n_in, 1)


# src/control.hpp ControlNetBlock's layouts: channel_mult, transformer depth per level (0: no attention)
# and the middle block's depth (SD 1.x: attention_resolutions {4, 2, 1}, SDXL: {4, 2}, depths {1, 2, 10})
SD1_CONTROL = ((1, 2, 4, 4), (1, 1, 1, 0), 1)
SDXL_CONTROL = ((1, 2, 4), (0, 2, 10), 10)


def controlnet_shapes(context: int = 768, layout=SD1_CONTROL, linear: bool = False) -> Dict[str, Shape]:
    """Every tensor of an SD ControlNet (src/control.hpp: model_channels 320, ``layout``'s channel_mult
    and attention depths, zero convolutions, the hint encoder; SDXL's also has label_emb, 2816 wide).
    ``linear``: linear transformer projections, as SD 2.x's ControlNets ship them (copied from its UNet;
    src/common_block.hpp SpatialTransformer picks conv or linear from the file's ``proj_out``)."""
    out: Dict[str, Shape] = {}
    ch0, temb = 320, 1280
    mults, depths, middle = layout
    _linear(out, "time_embed.0", temb, ch0)
    _linear(out, "time_embed.2", temb, temb)
    if context == 2048:
        _linear(out, "label_emb.0.0", temb, 2816)
        _linear(out, "label_emb.0.2", temb, temb)
    _conv(out, "input_blocks.0.0", ch0, 4, 3)
    _conv(out, "zero_convs.0.0", ch0, ch0, 1)
    hint = [(16, 3), (16, 16), (32, 16), (32, 32), (96, 32), (96, 96), (256, 96), (ch0, 256)]
    for i, (n_out, n_in) in enumerate(hint):
        _conv(out, f"input_hint_block.{2 * i}", n_out, n_in, 3)
    ch, idx = ch0, 0
    last = len(mults) - 1
    for level, mult in enumerate(mults):
        for _ in range(2):
            idx += 1
            _resblock(out, f"input_blocks.{idx}.0", ch, mult * ch0, temb)
            ch = mult * ch0
            if depths[level]:
                _transformer(out, f"input_blocks.{idx}.1", ch, context, depths[level], linear)
            _conv(out, f"zero_convs.{idx}.0", ch, ch, 1)
        if level < last:
            idx += 1
            _conv(out, f"input_blocks.{idx}.0.op", ch, ch, 3)
            _conv(out, f"zero_convs.{idx}.0", ch, ch, 1)
    _resblock(out, "middle_block.0", ch, ch, temb)
    _transformer(out, "middle_block.1", ch, context, middle, linear)
    _resblock(out, "middle_block.2", ch, ch, temb)
    _conv(out, "middle_block_out.0", ch, ch, 1)
    return out


def write_controlnet(path: Path, context: int = 768, seed: int = 11, prefix: str = "control_model.",
                     layout=SD1_CONTROL, linear: bool = False) -> Path:
    """A random SD ControlNet (F8_E5M2; SD 1.x: ~361 M parameters, ~361 MB) made like the probe's weights."""
    pools = Pools(seed, "F8_E5M2")
    try:
        write_part(path, controlnet_shapes(context, layout, linear), pools, {"accelstack": "test controlnet"}, lambda n: None, prefix)
    finally:
        pools.close()
    return path


def write_vae(path: Path, latent: int = 16, seed: int = 13) -> Path:
    """A random KL VAE with its encoder (engine.probes.architecture.kl_vae_tensors; 16 latent channels: FLUX.1's
    ae.safetensors shape, with the reduced probe's quarter-width decoder), F8_E5M2 like the probe's weights."""
    from accelstack.engine.probes.architecture import kl_vae_tensors

    pools = Pools(seed, "F8_E5M2")
    try:
        write_part(path, kl_vae_tensors(latent), pools, {"accelstack": "test vae"}, lambda n: None, "")
    finally:
        pools.close()
    return path


def write_png_image(path: Path, width: int, height: int, seed: int = 0) -> Path:
    """A deterministic RGB test pattern (gradients and stripes) as a PNG."""
    rgb = bytearray(width * height * 3)
    for y in range(height):
        for x in range(width):
            i = 3 * (y * width + x)
            rgb[i] = (x * 255 // max(1, width - 1) + seed) & 0xFF
            rgb[i + 1] = (y * 255 // max(1, height - 1)) & 0xFF
            rgb[i + 2] = 255 if ((x // 8) + (y // 8) + seed) % 2 else 0
    path.write_bytes(encode_png(width, height, bytes(rgb)))
    return path


def taesd_shapes(latent: int = 4, channels: int = 64) -> Dict[str, Shape]:
    """A tiny autoencoder's decoder (TAESD; taef1 with 16 latent channels) in diffusers' AutoencoderTiny names,
    as src/tae.hpp TinyDecoder builds it: a 3x3 conv in, 3 groups of 3 TAEBlocks each followed by an upsample
    and a bias-free conv, one last TAEBlock and a 3x3 conv out (the ReLU and Upsample layers take indices)."""
    shapes: Dict[str, Shape] = {}

    def block(i: int) -> None:
        for conv in ("conv.0", "conv.2", "conv.4"):
            _conv(shapes, f"decoder.layers.{i}.{conv}", channels, channels, 3)

    _conv(shapes, "decoder.layers.0", channels, latent, 3)
    index = 2
    for _group in range(3):
        for _ in range(3):
            block(index)
            index += 1
        index += 1  # nn.Upsample
        shapes[f"decoder.layers.{index}.weight"] = (channels, channels, 3, 3)  # bias-free
        index += 1
    block(index)
    _conv(shapes, f"decoder.layers.{index + 1}", 3, channels, 3)
    return shapes


def write_taesd(path: Path, latent: int = 4, seed: int = 12) -> Path:
    """A random TAESD decoder file (about 1.2 M parameters) made like the probe's weights."""
    pools = Pools(seed, "F8_E5M2")
    try:
        write_part(path, taesd_shapes(latent), pools, {"accelstack": "test taesd"}, lambda n: None, "")
    finally:
        pools.close()
    return path


def t5xxl_gguf(path: Path, seed: int = 7) -> Path:
    """T5-XXL's encoder as a GGUF file in llama.cpp's names (city96's t5-v1_1-xxl-encoder-gguf layout), its
    matrices Q4_0: 4.76 G parameters, 2.7 GB. stable-diffusion.cpp fixes its size (src/t5.hpp T5Params: 24
    blocks of 4096, 64 heads, a 10240-wide gated FFN, 32128 tokens; the relative attention bias in block 0
    only) and converts the names (src/name_conversion.cpp t5_name_map)."""
    from accelstack.engine.probes.gguf import write_gguf

    d, ff = 4096, 10240
    tensors: Dict[str, Shape] = {"token_embd.weight": (32128, d)}
    for i in range(24):
        b = f"enc.blk.{i}"
        for proj in ("q", "k", "v", "o"):
            tensors[f"{b}.attn_{proj}.weight"] = (d, d)
        if i == 0:
            tensors[f"{b}.attn_rel_b.weight"] = (32, 64)  # an embedding of 32 buckets x 64 heads: kept F16
        tensors[f"{b}.attn_norm.weight"] = (d,)
        tensors[f"{b}.ffn_norm.weight"] = (d,)
        tensors[f"{b}.ffn_gate.weight"] = (ff, d)
        tensors[f"{b}.ffn_up.weight"] = (ff, d)
        tensors[f"{b}.ffn_down.weight"] = (d, ff)
    tensors["enc.output_norm.weight"] = (d,)
    write_gguf(path, {"": tensors}, Pools(seed, "F16"), {}, lambda n: None, lambda name, shape: "attn_rel_b" not in name)
    return path
