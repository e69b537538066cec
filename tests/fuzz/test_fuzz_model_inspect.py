"""Fuzzing ``inspect_model`` (issue 26): hostile headers and pickles give an answer or a
``ModelLoadError``, within a time and memory bound, and nothing is ever unpickled.

The checks of :func:`check_model` run first (tests/fuzz/test_fuzz_engine.py fuzzes them); here the
inputs pass those checks and aim at what inspection adds: tensor names that look like every family
at once, shapes that make widths and channel counts odd, and data.pkl streams that the small stack
machine of ``ckpt_index`` must follow or give up on (never execute).
"""
from __future__ import annotations

import pickle
import struct
import zipfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelstack.engine.errors import ModelLoadError
from accelstack.engine.models.ckpt_index import checkpoint_index
from accelstack.engine.models.inspection import inspect_model

from .fuzzing import Counter, bounded, fuzz
from .test_fuzz_engine import safetensors_bytes

COUNT = Counter()
MARKERS = ["double_blocks.0.img_attn.qkv.weight", "joint_blocks.0.x_block.attn.qkv.weight", "cap_embedder.0.weight",
           "transformer_blocks.0.img_mod.1.weight", "input_blocks.0.0.weight", "attn2.to_k.weight", "guidance_in.in_layer.weight",
           "distilled_guidance_layer.in_proj.weight", "decoder.conv_in.weight", "shared.weight", "model.embed_tokens.weight",
           "text_model.embeddings.token_embedding.weight", "nerf_final_layer_conv.weight", "img_in.weight"]
PREFIXES = ["", "model.diffusion_model.", "unet.", "transformer.", "first_stage_model.", "vae.", "te.", "te.1.",
            "cond_stage_model.", "conditioner.embedders.1.", "text_encoders.t5xxl.transformer.", "encoder.", "x."]


def _inspect(path: Path) -> None:
    with bounded("inspect_model"):
        try:
            r = inspect_model(path)
        except ModelLoadError:
            return
    assert r.family and r.role and isinstance(r.evidence, list)
    COUNT()


@fuzz(150)
@given(st.lists(st.tuples(st.sampled_from(PREFIXES), st.sampled_from(MARKERS),
                          st.lists(st.integers(0, 70000), min_size=0, max_size=5)), min_size=1, max_size=12))
def test_names_of_every_family_at_once_and_odd_shapes(tmp_path_factory, tensors):
    header, offset = {}, 0
    for i, (prefix, marker, shape) in enumerate(tensors):
        n = 1
        for d in shape:
            n *= d
        if n > 1 << 24:
            shape = [1]
            n = 1
        header[f"{prefix}{marker}{'' if i == 0 else i}"] = {"dtype": "F8_E4M3", "shape": shape,
                                                             "data_offsets": [offset, offset + n]}
        offset += n
    path = tmp_path_factory.mktemp("st") / "m.safetensors"
    raw = safetensors_bytes(header)
    with open(path, "wb") as fh:
        fh.write(raw)
        fh.truncate(len(raw) + offset)
    _inspect(path)


def _zip_with_pickle(path: Path, pkl: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pkl)
        archive.writestr("archive/data/0", b"\0" * 16)
    return path


@fuzz(200)
@given(st.binary(min_size=1, max_size=400))
def test_random_pickle_streams_are_followed_or_given_up(tmp_path_factory, pkl):
    _inspect(_zip_with_pickle(tmp_path_factory.mktemp("ck") / "m.ckpt", b"\x80\x02" + pkl + b"."))


@pytest.mark.parametrize("pkl", [
    b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00echo\x85R.",  # a call the loader would make: stays a record
    b"\x80\x02}q\x00(X\x01\x00\x00\x00ah\x00u.",  # a dict holding itself
    b"\x80\x02" + b"(" * 100000 + b"t.",  # deep marks: a flat stack, no recursion
    b"\x80\x02]" + b"(" + b"K\x01" * 1000 + b"e" + b"h\x00" * 10 + b".",  # GET of a missing memo
    b"\x80\x02K\x01K\x02s.",  # SETITEM on an int
    b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\nK\x01K\x02\x86R.",  # too few args
    b"\x80\x02}X\x01\x00\x00\x00wctorch._utils\n_rebuild_tensor_v2\n(K\x00K\x00J\xff\xff\xff\xff\x85tRs.",  # negative dim
])
def test_hostile_pickles_give_an_answer_without_executing_anything(tmp_path, pkl):
    path = _zip_with_pickle(tmp_path / "m.ckpt", pkl)
    with bounded("checkpoint_index"):
        try:
            found = checkpoint_index(path)
        except ModelLoadError:
            found = None
    assert found is None or all(all(d >= 0 for d in t.shape) for t in found)
    _inspect(path)


def test_a_checkpoint_whose_tensors_claim_huge_shapes_is_counted_not_allocated(tmp_path):
    pkl = (b"\x80\x02}X\x05\x00\x00\x00w.bigctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storage"
           b"ctorch\nHalfStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x01tQK\x00" + b"\x8a\x08" + struct.pack("<q", 2 ** 62)
           + b"\x85K\x01\x85\x89tRs.")
    path = _zip_with_pickle(tmp_path / "m.ckpt", pkl)
    with bounded("inspect huge"):
        r = inspect_model(path)
    assert r.parameters == 2 ** 62 and r.weight_types[0].dtype == "F16"


def test_pickled_objects_are_never_built(tmp_path):
    """A REDUCE of anything but torch's tensor rebuild stays an inert record: nothing runs."""
    marker = tmp_path / "ran"
    pkl = pickle.dumps({"w": _Boom(str(marker))}, protocol=2)
    _inspect(_zip_with_pickle(tmp_path / "m.ckpt", pkl))
    assert not marker.exists()
    assert COUNT.count > 0


class _Boom:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))
