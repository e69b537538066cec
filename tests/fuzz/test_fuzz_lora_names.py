"""Fuzzing LoRA tags and embedding file names (issue 26).

A real folder holds one good LoRA, a link to a good LoRA outside it, a FIFO and a sub-folder; a
sibling folder outside holds another good LoRA. Hostile ``<lora:NAME:WEIGHT>`` tags (separators,
``..``, absolute paths, NULs, odd Unicode, huge or non-finite weights) either raise
``InvalidRequestError`` or stage exactly the good LoRA of the folder, within a time and memory
bound. Embedding folders with hostile file names either refuse with ``InvalidRequestError`` or load
only names that are one prompt word. The model is a tiny safetensors file with SD 1.x tensor names.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelstack.engine.errors import InvalidRequestError
from accelstack.engine.models.check import check_model
from accelstack.engine.request.companions import prepare_companions
from accelstack.engine.worker.protocol import GenerateRequest, lora_tags

from .fuzzing import Counter, bounded, fuzz

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from companion_files import embedding, write_safetensors  # noqa: E402  (the engine tests' tiny files)

STATS = {"lora tags": Counter(), "lora accepted": Counter(), "embedding folders": Counter(), "tag texts": Counter(),
         "lora files": Counter(), "lora files accepted": Counter()}
QKV = "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q"


def _lora(path: Path) -> Path:
    rng = np.random.default_rng(0)
    key = "lora_unet_" + QKV.replace(".", "_")
    return write_safetensors(path, {f"{key}.lora_down.weight": rng.normal(0, 1, (2, 320)),
                                    f"{key}.lora_up.weight": rng.normal(0, 1, (320, 2))})


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-fuzz")
    model = write_safetensors(root / "model.safetensors", {
        f"unet.{QKV}.weight": np.zeros((320, 320)), "te.text_model.embeddings.token_embedding.weight": np.zeros((4, 768))})
    loras, outside = root / "loras", root / "outside"
    loras.mkdir()
    outside.mkdir()
    _lora(loras / "style.safetensors")
    _lora(outside / "secret.safetensors")
    (loras / "evil.safetensors").symlink_to(outside / "secret.safetensors")
    os.mkfifo(loras / "pipe.safetensors")
    (loras / "dir.safetensors").mkdir()
    return root, check_model(model)


NAMES = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["style", "style.safetensors", "../outside/secret", "/etc/passwd", "..", ".", ".style", "evil",
                     "pipe", "dir", "style/", "loras/style", "|high_noise|style", "style\x00", "STYLE", "style ",
                     "..\\outside\\secret", "~/style", "%2e%2e/secret", "sty\u202ele", "style" * 60]),
    st.builds(lambda a, b: a + b, st.sampled_from(["../", "/", "./", "\\", ""]), st.text(max_size=10)))
WEIGHTS = st.one_of(st.sampled_from(["1", "0", "-1", "nan", "inf", "-inf", "1e40", "1e-50", "10", "10.0001", "0x1", "1_0",
                                     " 1", "", "1:2", "1" * 400]),
                    st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=8))


@fuzz(int(os.environ.get("FUZZ_LORA_EXAMPLES", "300")))
@given(name=NAMES, weight=WEIGHTS, upper=st.booleans())
def test_hostile_lora_tags_are_refused_or_resolve_inside_the_folder(scene, name, weight, upper):
    root, model = scene
    STATS["lora tags"]()
    prompt = f"a cat {'<LORA' if upper else '<lora'}:{name}:{weight}>"
    with bounded("a LoRA tag"):
        try:
            GenerateRequest(prompt=prompt, lora_dir=str(root / "loras")).validate()
            found = prepare_companions(prompt, str(root / "loras"), "", model)
        except InvalidRequestError:
            return
    try:
        if not found.loras:  # no tag the bindings would read (the text does not hold one)
            assert not re.search(r"<lora:[^:>]+:[^>]+>", prompt)
            return
        STATS["lora accepted"]()
        staged = os.listdir(found.lora_dir)
        assert staged == ["style.safetensors"], (name, staged)
        assert (Path(found.lora_dir) / staged[0]).read_bytes() == (root / "loras" / "style.safetensors").read_bytes()
        assert all(abs(x.weight) <= 10 for x in found.loras)
    finally:
        found.cleanup()


@fuzz(40)
@given(names=st.lists(st.one_of(st.text(min_size=1, max_size=20), st.sampled_from(["ok", "a b", "émoji😀", "x-y", "_"])),
                      min_size=1, max_size=4, unique=True),
       ext=st.sampled_from([".safetensors", ".pt", ".gguf", ".bin", ".txt"]))
def test_hostile_embedding_names_are_refused_or_are_one_prompt_word(tmp_path_factory, scene, names, ext):
    _root, model = scene
    folder = tmp_path_factory.mktemp("embs")
    STATS["embedding folders"]()
    made = []
    for name in names:
        try:
            embedding(folder / (name + ext))
            made.append(name)
        except (OSError, ValueError):  # a name the file system refuses (a separator, NUL, too long)
            pass
    with bounded("an embeddings folder"):
        try:
            found = prepare_companions("cat", "", str(folder), model)
        except InvalidRequestError:
            shutil.rmtree(folder)
            return
    found.cleanup()
    for name in found.embeddings:
        assert re.fullmatch(r"[\w\-]+", name) and name in made
    shutil.rmtree(folder)


@pytest.mark.parametrize("text", ["<lora:a:1><lora:b:2>" * 9, "<lora:" + "x" * 5000 + ":1>", "<lora:a:" + "9" * 5000 + ">",
                                  "<lora:<lora:a:1>:1>", "<lora::1>", "<lora:a:>"])
def test_lora_tag_edge_cases_are_typed(text):
    try:
        tags = lora_tags(text)
    except InvalidRequestError:
        return
    assert all(abs(w) <= 10 for _n, w in tags)


# -- tags the bindings would not read; tensors stable-diffusion.cpp aborts on (review of issue 26) --------------
READ_TAG = re.compile(r"<lora:([^:>]+):([^>]+)>", re.IGNORECASE)  # stable_diffusion.py _extract_and_build_loras
PIECES = st.sampled_from(["<lora:", "<LoRa:", "style", "style.safetensors", ":", "1", "0.5", "", ">", " ", "<", "x",
                          "<lora", ":>", "<lora:style:1>"])


def _unread_tag(text: str) -> bool:
    """Whether some ``<lora:`` of ``text`` begins no tag the bindings read (outside the tags they read)."""
    pos = 0
    for start in re.finditer(r"<lora:", text, re.IGNORECASE):
        if start.start() < pos:
            continue
        tag = READ_TAG.match(text, start.start())
        if tag is None:
            return True
        pos = tag.end()
    return False


@fuzz(int(os.environ.get("FUZZ_LORA_EXAMPLES", "300")))
@given(pieces=st.lists(PIECES, max_size=12), folder=st.booleans())
def test_a_lora_tag_the_bindings_would_not_read_is_refused(scene, pieces, folder):
    """``<lora:style>``, ``<lora:style:>``, ``<lora::1>``, an unclosed tag: stable-diffusion.cpp would keep it
    in the prompt as text, so it is refused, with or without a LoRA folder."""
    root, model = scene
    STATS["tag texts"]()
    prompt = "a cat " + "".join(pieces)
    with bounded("a prompt's tags"):
        try:
            found = prepare_companions(prompt, str(root / "loras") if folder else "", "", model)
        except InvalidRequestError:
            return
    found.cleanup()
    assert not _unread_tag(prompt), prompt


DTYPES = {"F32": ("<f4", 4), "F16": ("<f2", 2), "F64": ("<f8", 8), "I32": ("<i4", 4)}
SIZES = st.sampled_from([0, 1, 2, 4, 8, 160, 320])
SHAPES = st.lists(SIZES, min_size=1, max_size=4).map(tuple)


def _typed_lora(path: Path, tensors) -> Path:
    header, blobs, offset = {}, [], 0
    for name, (shape, dtype) in tensors.items():
        raw = np.ones(shape, dtype=DTYPES[dtype][0]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))
    return path


@fuzz(int(os.environ.get("FUZZ_LORA_EXAMPLES", "300")))
@given(down=st.one_of(st.none(), st.tuples(SHAPES, st.sampled_from(sorted(DTYPES)))),
       up=st.one_of(st.none(), st.tuples(SHAPES, st.sampled_from(sorted(DTYPES)))),
       rank=st.sampled_from([1, 4]), natural=st.booleans())
def test_a_lora_stable_diffusion_cpp_would_abort_on_or_ignore_is_refused(tmp_path_factory, scene, down, up, rank,
                                                                          natural):
    """Random lora_down/lora_up shapes and types on the model's linear 320x320 weight: refused, or what the CPU
    build applies to a linear layer without aborting (as stored and at run time): both halves, float types,
    matrices whose ranks meet, the model's 320 inputs and at most its 320 outputs."""
    _root, model = scene
    if natural:  # one in two examples near a good LoRA, so that acceptance is reached
        down, up = ((rank, 320), (down or ((), "F32"))[1]), ((320, rank), (up or ((), "F32"))[1])
    STATS["lora files"]()
    folder = tmp_path_factory.mktemp("typed")
    key = "lora_unet_" + QKV.replace(".", "_")
    tensors = {f"{key}.lora_{role}.weight": half for role, half in (("down", down), ("up", up)) if half is not None}
    _typed_lora(folder / "x.safetensors", tensors)
    with bounded("a LoRA's tensors"):
        try:
            found = prepare_companions("a cat <lora:x:1>", str(folder), "", model)
        except InvalidRequestError:
            shutil.rmtree(folder)
            return
    found.cleanup()
    shutil.rmtree(folder)
    STATS["lora files accepted"]()
    assert down is not None and up is not None
    (d, d_type), (u, u_type) = down, up
    assert {d_type, u_type} <= {"F32", "F16", "F64"}, (down, up)
    assert len(d) == len(u) == 2 and d[0] == u[1] >= 1 and d[1] == 320 and 1 <= u[0] <= 320, (down, up)


MODEL_SHAPES = st.lists(st.integers(0, 6), min_size=0, max_size=4).map(tuple)  # a scalar, empty, 1-4 dimensions


@fuzz(int(os.environ.get("FUZZ_LORA_EXAMPLES", "300")))
@given(weight=MODEL_SHAPES, down=MODEL_SHAPES, up=MODEL_SHAPES, mid=st.one_of(st.none(), MODEL_SHAPES),
       diff=st.one_of(st.none(), MODEL_SHAPES), runtime=st.booleans(), natural=st.booleans(), rank=st.integers(1, 4))
def test_any_model_weight_shape_is_checked_or_refused_typed(weight, down, up, mid, diff, runtime, natural, rank):
    """The model's shapes are fuzzed too (issue 47: a LoRA-targeted weight of zero dimensions raised
    IndexError): whatever the model weight's and the LoRA's shapes, the check counts the weights it
    changes or refuses with InvalidRequestError, within the bounds."""
    from accelstack.engine.loras.check import check_lora
    from accelstack.engine.models.reader import TensorInfo

    STATS["lora files"]()
    if natural:  # one in two examples a well-formed pair, so that the model's shape is what decides
        down, up, mid, diff = (rank, 5), (3, rank), None, None
    key = "lora_unet_" + QKV.replace(".", "_")
    tensors = [TensorInfo(f"{key}.lora_down.weight", down, "F16"), TensorInfo(f"{key}.lora_up.weight", up, "F16")]
    if mid is not None:
        tensors.append(TensorInfo(f"{key}.lora_mid.weight", mid, "F16"))
    if diff is not None:
        tensors = [TensorInfo(f"{key}.diff", diff, "F16")]
    model = {("unet", "input_blocks_1_1_transformer_blocks_0_attn1_to_q"): weight}  # the module's name as sd.cpp maps it
    with bounded("a model weight's shape"):
        try:
            changed = check_lora("x", tensors, model, at_runtime="quantized weights" if runtime else "")
        except InvalidRequestError:
            return
    assert changed.weights >= 1 and 0 < changed.applied <= changed.total == len(tensors)


LYCORIS_SHAPES = st.lists(st.integers(1, 6), min_size=1, max_size=4).map(tuple)


@fuzz(int(os.environ.get("FUZZ_LORA_EXAMPLES", "300")))
@given(weight=MODEL_SHAPES, loha=st.booleans(), shapes=st.lists(LYCORIS_SHAPES, min_size=4, max_size=4),
       whole=st.booleans(), prefix=st.sampled_from(["lora_unet_", "lycoris_unet_", "lora.lora_unet_"]))
def test_any_loha_or_lokr_shape_is_counted_or_refused_typed(weight, loha, shapes, whole, prefix):
    """Issue 44: LyCORIS LoHa and LoKr modules have their sizes checked as stable-diffusion.cpp computes them
    (the LoHa halves multiplied value by value, the LoKr factors' Kronecker product, get_weight_diff's count
    assert): whatever the model weight's and the factors' shapes, a LoraMatch or InvalidRequestError, in bounds."""
    from accelstack.engine.loras.check import check_lora
    from accelstack.engine.models.reader import TensorInfo

    STATS["lora files"]()
    key = prefix + "input_blocks_1_1_transformer_blocks_0_attn1_to_q"
    roles = ("hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b") if loha else \
        (("lokr_w1", "lokr_w2") if whole else ("lokr_w1_a", "lokr_w1_b", "lokr_w2_a", "lokr_w2_b"))
    tensors = [TensorInfo(f"{key}.{role}", shape, "F16") for role, shape in zip(roles, shapes)]
    model = {("unet", "input_blocks_1_1_transformer_blocks_0_attn1_to_q"): weight}
    with bounded("a LyCORIS module's shapes"):
        try:
            found = check_lora("x", tensors, model, model_label="--model m.safetensors")
        except InvalidRequestError:
            return
    STATS["lora files accepted"]()
    assert found.weights == 1 and found.applied == found.total == len(tensors)
