"""The GGUF writer of the quantized family probes (engine.probes.gguf): the file ggml reads, Q4_0 blocks whose
values follow the probe's value rule, the same bytes for the same seed; and a probe folder holding it."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from accelstack.engine import generation
from accelstack.engine.models.gguf_check import gguf_index
from accelstack.engine.models.inspection import inspect_model
from accelstack.engine.png import read_png
from accelstack.engine.probes.architecture import sd1_tensors
from accelstack.engine.probes.gguf import Q4_BLOCK, Q4_BLOCK_BYTES, gguf_size, quantized_prefixes, write_gguf
from accelstack.engine.probes.layout import GGUF_WEIGHTS, MARKER, PREFIXES, WEIGHTS, probe_weights
from accelstack.engine.probes.weights import Pools
from accelstack.engine.worker.protocol import GenerateRequest

PARTS = {"model.diffusion_model.": {"layers.0.attention.qkv.weight": (96, 256), "layers.0.attention_norm1.weight": (256,),
                                    "odd.weight": (8, 40)},
         "vae.": {"decoder.conv_in.weight": (32, 16, 3, 3)}}
RULE = quantized_prefixes(["model.diffusion_model."])


def _write(path, seed=7):
    write_gguf(path, PARTS, Pools(seed, "F16"), {"family": "test"}, lambda n: None, RULE)
    return path


def test_the_file_is_what_ggml_reads_with_q4_0_where_asked(tmp_path):
    path = _write(tmp_path / "p.gguf")
    assert path.stat().st_size == gguf_size(PARTS, {"family": "test"}, RULE)
    with open(path, "rb") as fh:  # accelstack's own GGUF check, as ggml reads the header
        infos = {t.name: t for t in gguf_index(path, fh, path.stat().st_size)}
    assert {n: (t.dtype, tuple(t.shape)) for n, t in infos.items()} == {
        "model.diffusion_model.layers.0.attention.qkv.weight": ("Q4_0", (96, 256)),  # 2-D, random, rows of 32s
        "model.diffusion_model.layers.0.attention_norm1.weight": ("F16", (256,)),  # a norm scale: 1s
        "model.diffusion_model.odd.weight": ("F16", (8, 40)),  # rows of 40: no whole blocks
        "vae.decoder.conv_in.weight": ("F16", (32, 16, 3, 3)),  # not under a quantized prefix
    }
    start, offsets = _offsets(path.read_bytes())
    assert start % 32 == 0 and all(o % 32 == 0 for o in offsets.values())


def test_q4_0_values_follow_the_value_rule(tmp_path):
    raw = _write(tmp_path / "p.gguf").read_bytes()
    start, offsets = _offsets(raw)
    blocks = np.frombuffer(raw, np.uint8, count=96 * 256 // Q4_BLOCK * Q4_BLOCK_BYTES,
                           offset=start + offsets["model.diffusion_model.layers.0.attention.qkv.weight"])
    blocks = blocks.reshape(-1, Q4_BLOCK_BYTES)
    d = blocks[:, :2].copy().view("<f2").astype(np.float64).ravel()
    q = np.concatenate([blocks[:, 2:] & 15, blocks[:, 2:] >> 4], axis=1).astype(np.int64)
    assert q.min() >= 1 and q.max() <= 15  # never nibble 0 (-8): symmetric around zero
    values = (q - 8) * d[:, None]
    assert abs(values.mean()) < 0.01 * values.std()
    assert values.std() == pytest.approx(1 / 16, rel=0.03)  # the LeCun rule: 1 / sqrt(fan_in 256)


def _offsets(raw: bytes):
    """(where the data section starts, {name: offset in it}) of a GGUF file, parsed here again."""
    pos = 4 + 4
    n_tensors, n_kv = struct.unpack_from("<QQ", raw, pos)
    pos += 16
    for _ in range(n_kv):
        (n,) = struct.unpack_from("<Q", raw, pos)
        pos += 8 + n + 4
        (m,) = struct.unpack_from("<Q", raw, pos)
        pos += 8 + m
    offsets = {}
    for _ in range(n_tensors):
        (n,) = struct.unpack_from("<Q", raw, pos)
        name = raw[pos + 8:pos + 8 + n].decode()
        pos += 8 + n
        (dims,) = struct.unpack_from("<I", raw, pos)
        pos += 4 + 8 * dims + 4
        (offsets[name],) = struct.unpack_from("<Q", raw, pos)
        pos += 8
    return pos + (-pos % 32), offsets


def test_the_same_seed_writes_the_same_bytes_and_another_seed_others(tmp_path):
    a, b, c = _write(tmp_path / "a.gguf"), _write(tmp_path / "b.gguf"), _write(tmp_path / "c.gguf", seed=8)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()


def test_a_name_too_long_for_the_runtime_is_refused_before_writing(tmp_path):
    long = {"text_encoders.llm.": {"model.layers.0.post_attention_layernorm." + "x" * 70: (64,)}}  # 128 bytes
    with pytest.raises(ValueError, match="128-byte"):
        write_gguf(tmp_path / "x.gguf", long, Pools(7, "F16"), {}, lambda n: None, RULE)
    assert not (tmp_path / "x.gguf").exists()


def test_an_sd1_gguf_with_names_longer_than_63_bytes_generates_on_the_cpu_build(cpu_runtime, tmp_path):
    """The SD 1.x probe's tensors in one GGUF file, its UNet Q4_0 (as users quantize SD 1.x/XL checkpoints):
    241 of its names are 64 to 74 bytes long, which the runtime holds (GGML_MAX_NAME=128, from
    stable-diffusion.cpp's CMakeLists.txt), so accelstack's check must pass them and the worker load them."""
    parts = {PREFIXES[part]: tensors for part, tensors in sd1_tensors().items()}
    longest = max(len(prefix + name) for prefix, tensors in parts.items() for name in tensors)
    assert 64 <= longest < 128
    model = tmp_path / "sd1-q4_0.gguf"
    write_gguf(model, parts, Pools(7, "F16"), {}, lambda n: None, quantized_prefixes([PREFIXES["unet"]]))
    assert inspect_model(model).family == "sd1"
    request = GenerateRequest(prompt="a lighthouse", width=64, height=64, steps=1, seed=5)
    report = generation.generate(cpu_runtime, model, request, tmp_path / "out.png")
    pixels = read_png(tmp_path / "out.png").rgb()
    assert report.images and len(pixels) == 64 * 64 * 3 and len(set(pixels)) > 1, "no image, or a constant one"


def test_a_probe_folder_holding_a_gguf_file_is_a_probe(tmp_path):
    (tmp_path / GGUF_WEIGHTS).write_bytes(b"GGUF")
    assert probe_weights(str(tmp_path)) is None  # no marker yet: not complete
    (tmp_path / MARKER).write_text(json.dumps({}))
    assert probe_weights(str(tmp_path)) == str(tmp_path / GGUF_WEIGHTS)
    assert probe_weights(str(tmp_path / GGUF_WEIGHTS)) == str(tmp_path / GGUF_WEIGHTS)
    assert probe_weights(str(tmp_path / WEIGHTS)) is None  # that file is not there
    assert probe_weights(str(tmp_path / "other.gguf")) is None
