"""Hostile LoRA and embedding files and tags that passed the pre-check (review of issue 26).

Files stable-diffusion.cpp 0.4.7 aborted or segfaulted on (ranks that differ, 3-D or integer tensors,
an up kernel wider than 1x1, an empty alpha, a diff of another size, a 1x1 kernel on a linear weight
applied at run time) or silently ignored (a lora_down without its lora_up), a tag it leaves in the
prompt as text (``<lora:NAME>``), one file named two ways, and a broken file copied whole before its
header was read: each is refused, typed, before any worker starts. The LoRAs it applies (conv
kernels, Tucker, rank 1, 2-D on a 1x1 conv) still pass.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import struct
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import pytest
from companion_files import embedding, kohya_lora, write_safetensors  # noqa: E402

from accelstack.engine.errors import GenerationError, InvalidRequestError
from accelstack.engine.models.check import check_model
from accelstack.engine.request import companions as companions_module
from accelstack.engine.request.companions import prepare_companions
from accelstack.errors import Action

from engine_helpers import cli_env, run_cli  # noqa: E402

Q = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q"  # a linear weight, 320x320
PROJ_IN = "lora_unet_down_blocks_0_attentions_0_proj_in"  # a 1x1 conv, 320x320x1x1
CONV1 = "lora_unet_down_blocks_0_resnets_0_conv1"  # a 3x3 conv, 320x320x3x3
_BYTES = {"F32": ("<f4", 4), "F64": ("<f8", 8), "I32": ("<i4", 4), "F16": ("<f2", 2)}


STAGINGS: List[Path] = []  # the staging folders prepare_companions made in the current test


@pytest.fixture(autouse=True)
def _stagings(monkeypatch):
    made = companions_module.workdirs.make

    def recorded(*a, **k):
        STAGINGS.append(made(*a, **k))
        return STAGINGS[-1]
    STAGINGS.clear()
    monkeypatch.setattr(companions_module.workdirs, "make", recorded)


@pytest.fixture(scope="module")
def probe_info(probe_model):
    return check_model(probe_model.path)


def _n(*shape: int) -> np.ndarray:
    return np.random.default_rng(sum(shape)).normal(0, 0.5, shape)


def _write(path: Path, tensors: Dict[str, Tuple[np.ndarray, str]]) -> Path:
    """A safetensors file whose tensors each have their own dtype."""
    header, offset, blobs = {}, 0, []
    for name, (value, dtype) in tensors.items():
        raw = np.ascontiguousarray(value, dtype=_BYTES[dtype][0]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(value.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))
    return path


def _lora(folder: Path, name: str, module: str, down: np.ndarray, up: np.ndarray, **extra: np.ndarray) -> None:
    tensors = {f"{module}.lora_down.weight": down, f"{module}.lora_up.weight": up}
    tensors.update({f"{module}.{role}": value for role, value in extra.items()})
    write_safetensors(folder / f"{name}.safetensors", tensors)


def _prepare(folder: Path, probe_info, prompt: str, embeddings: str = ""):
    return prepare_companions(prompt, str(folder), embeddings, probe_info)


def _refused(folder: Path, probe_info, name: str, *words: str) -> str:
    with pytest.raises(InvalidRequestError) as caught:
        _prepare(folder, probe_info, f"cat <lora:{name}:1>")
    message = caught.value.message
    for word in words:
        assert word in message, message
    assert STAGINGS and not any(folder.exists() for folder in STAGINGS)  # the staging went with it
    return message


@pytest.fixture
def loras(tmp_path) -> Path:
    folder = tmp_path / "loras"
    folder.mkdir()
    return folder


# -- bug 1: files stable-diffusion.cpp aborts on --------------------------------------------------------------
def test_ranks_that_differ_are_refused(loras, probe_info):
    _lora(loras, "rank", Q, _n(4, 320), _n(320, 8))
    _refused(loras, probe_info, "rank", "rank 4", "rank 8")


def test_three_dimensional_tensors_are_refused(loras, probe_info):
    _lora(loras, "d3", Q, _n(4, 320, 1), _n(320, 4, 1))
    _refused(loras, probe_info, "d3", "4x320x1", "2 dimensions")
    _lora(loras, "d1", Q, _n(1280), _n(1280))
    _refused(loras, probe_info, "d1", "1280")


def test_integer_tensors_are_refused(loras, probe_info):
    _write(loras / "i32.safetensors", {f"{Q}.lora_down.weight": (np.ones((4, 320)), "I32"),
                                        f"{Q}.lora_up.weight": (np.ones((320, 4)), "I32")})
    _refused(loras, probe_info, "i32", "I32")


def _gguf(path: Path, tensors: Dict[str, Tuple[np.ndarray, str]]) -> Path:
    """A GGUF v3 file of ``tensors`` (no metadata, data aligned to 32 bytes, as ggml/src/gguf.cpp reads it)."""
    types = {"F32": 0, "F64": 28, "I32": 26, "Q8_0": 8}

    def text(b: bytes) -> bytes:
        return struct.pack("<Q", len(b)) + b
    infos, blobs = b"", b""
    for name, (value, dtype) in tensors.items():
        raw = bytes(value.size // 32 * 34) if dtype == "Q8_0" else np.ascontiguousarray(value, _BYTES[dtype][0]).tobytes()
        dims = list(reversed(value.shape))
        infos += text(name.encode()) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", types[dtype], len(blobs))
        blobs += raw + b"\0" * (-len(raw) % 32)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 0) + infos
    path.write_bytes(head + b"\0" * (-len(head) % 32) + blobs)
    return path


def test_a_gguf_lora_of_doubles_is_refused(loras, probe_info):
    # the safetensors and torch loaders read F64 as F32; the GGUF loader keeps it, and the cast segfaults
    for dtype in ("F64", "I32"):
        _gguf(loras / f"g{dtype}.gguf", {f"{Q}.lora_down.weight": (_n(4, 320), dtype),
                                         f"{Q}.lora_up.weight": (_n(320, 4), dtype)})
        _refused(loras, probe_info, f"g{dtype}", dtype, "GGUF")
    _gguf(loras / "g32.gguf", {f"{Q}.lora_down.weight": (_n(4, 320), "F32"), f"{Q}.lora_up.weight": (_n(320, 4), "F32")})
    _prepare(loras, probe_info, "cat <lora:g32:1>").cleanup()


def test_a_partial_lora_applied_at_run_time_must_divide_the_weight(loras, tmp_path, probe_info):
    """Fewer rows than the weight: padded where applied to the weights as loaded, repeated down the rows where
    applied at run time (a quantized model, or weight_type q8_0): ggml_can_repeat aborts unless they divide."""
    _lora(loras, "pad100", Q, _n(4, 320), _n(100, 4))
    _lora(loras, "pad160", Q, _n(4, 320), _n(160, 4))
    _prepare(loras, probe_info, "cat <lora:pad100:1>").cleanup()
    for model, weight_type in ((probe_info, "q8_0"), (check_model(_gguf(tmp_path / "q8.gguf", {
            "model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn1.to_q.weight": (np.zeros((320, 320)), "Q8_0"),
            "cond_stage_model.transformer.text_model.embeddings.token_embedding.weight": (np.zeros((4, 768)), "F32")})),
            "")):
        with pytest.raises(InvalidRequestError, match="100 does not divide 320"):
            prepare_companions("cat <lora:pad100:1>", str(loras), "", model, weight_type=weight_type)
        prepare_companions("cat <lora:pad160:1>", str(loras), "", model, weight_type=weight_type).cleanup()


def test_slices_of_a_fused_weight_count_as_stable_diffusion_cpp_concatenates_them(loras, tmp_path):
    """A diffusers DiT LoRA's to_q/to_k/to_v (and FLUX.1's proj_mlp) are slices .weight, .weight.1 ... of one fused
    weight, applied up to the first missing one (src/lora.hpp): on a quantized FLUX.1 single block, q, k and v
    without proj_mlp are 192 of 448 rows, which the run-time add cannot repeat; Z-Image's q and v (no k) are q
    alone, 64 of 192 rows, which it can; k alone changes nothing."""
    h = 64
    model = check_model(_gguf(tmp_path / "flux-q8.gguf", {
        "model.diffusion_model.double_blocks.0.img_attn.qkv.weight": (np.zeros((3 * h, h)), "Q8_0"),
        "model.diffusion_model.single_blocks.0.linear1.weight": (np.zeros((7 * h, h)), "Q8_0"),
        "model.diffusion_model.layers.0.attention.qkv.weight": (np.zeros((3 * h, h)), "Q8_0")}))

    def lora(name: str, modules: Dict[str, int]) -> None:
        write_safetensors(loras / f"{name}.safetensors", {
            f"transformer.{module}.{role}": _n(*shape) for module, rows in modules.items()
            for role, shape in (("lora_A.weight", (4, h)), ("lora_B.weight", (rows, 4)))})
    single = "single_transformer_blocks.0"
    lora("qkv", {f"{single}.attn.to_q": h, f"{single}.attn.to_k": h, f"{single}.attn.to_v": h})
    lora("all", {f"{single}.attn.to_q": h, f"{single}.attn.to_k": h, f"{single}.attn.to_v": h,
                 f"{single}.proj_mlp": 4 * h})
    lora("konly", {"transformer_blocks.0.attn.to_k": h})
    write_safetensors(loras / "zqv.safetensors", {
        f"diffusion_model.layers.0.attention.{proj}.{role}": _n(*shape) for proj in ("to_q", "to_v")
        for role, shape in (("lora_A.weight", (4, h)), ("lora_B.weight", (h, 4)))})
    with pytest.raises(InvalidRequestError, match="192 does not divide 448"):
        prepare_companions("cat <lora:qkv:1>", str(loras), "", model)
    for name in ("all", "zqv"):
        found = prepare_companions(f"cat <lora:{name}:1>", str(loras), "", model)
        assert [x.tensors for x in found.loras] == [1]
        found.cleanup()
    with pytest.raises(InvalidRequestError, match="changes nothing"):
        prepare_companions("cat <lora:konly:1>", str(loras), "", model)


def test_an_up_kernel_wider_than_1x1_is_refused(loras, probe_info):
    _lora(loras, "upk", CONV1, _n(4, 320, 3, 3), _n(320, 4, 3, 3))
    _refused(loras, probe_info, "upk", "lora_up")


def test_a_1x1_kernel_on_a_linear_weight_is_refused(loras, probe_info):
    # applied at run time (a quantized model, or weight_type q8_0): ggml_can_mul_mat aborts on it
    _lora(loras, "q4", Q, _n(4, 320, 1, 1), _n(320, 4, 1, 1))
    _refused(loras, probe_info, "q4", "linear")


def test_a_diff_of_another_size_is_refused(loras, probe_info):
    write_safetensors(loras / "diff.safetensors", {f"{Q}.diff": _n(320, 100)})  # GGML_ASSERT(ggml_nelements(diff) == ...)
    _refused(loras, probe_info, "diff", "diff of 320x100")
    write_safetensors(loras / "full.safetensors", {f"{Q}.diff": _n(320, 320)})
    _prepare(loras, probe_info, "cat <lora:full:1>").cleanup()


def test_an_empty_alpha_is_refused(loras, probe_info):
    _lora(loras, "alpha", Q, _n(4, 320), _n(320, 4), alpha=np.zeros((0,)))
    _refused(loras, probe_info, "alpha", "alpha", "no value")


@pytest.mark.parametrize("name, module, tensors", [
    ("conv3", CONV1, {"lora_down.weight": (4, 320, 3, 3), "lora_up.weight": (320, 4, 1, 1)}),
    ("pi4", PROJ_IN, {"lora_down.weight": (4, 320, 1, 1), "lora_up.weight": (320, 4, 1, 1)}),
    ("pi2", PROJ_IN, {"lora_down.weight": (4, 320), "lora_up.weight": (320, 4)}),
    ("mixed", PROJ_IN, {"lora_down.weight": (4, 320), "lora_up.weight": (320, 4, 1, 1)}),
    ("tucker", CONV1, {"lora_down.weight": (4, 320, 1, 1), "lora_mid.weight": (4, 4, 3, 3), "lora_up.weight": (320, 4, 1, 1)}),
    ("rank1", Q, {"lora_down.weight": (1, 320), "lora_up.weight": (320, 1), "alpha": ()}),
    ("pad", Q, {"lora_down.weight": (4, 320), "lora_up.weight": (160, 4)}),
    ("peft", "unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q",
     {"lora_A.weight": (4, 320), "lora_B.weight": (320, 4)}),
])
def test_what_stable_diffusion_cpp_applies_still_passes(loras, probe_info, name, module, tensors):
    """Each of these (the PEFT one in kohya naming) ran through the CPU build, applied ("(N / N) LoRA tensors
    have been applied") with the model's weights as stored and converted to Q8_0 (applied at run time)."""
    write_safetensors(loras / f"{name}.safetensors", {f"{module}.{role}": _n(*shape) for role, shape in tensors.items()})
    found = _prepare(loras, probe_info, f"cat <lora:{name}:1>")
    try:
        assert [(x.name, x.tensors) for x in found.loras] == [(name, 1)]
    finally:
        found.cleanup()


def test_a_float64_lora_passes(loras, probe_info):
    _write(loras / "f64.safetensors", {f"{Q}.lora_down.weight": (_n(4, 320), "F64"),
                                        f"{Q}.lora_up.weight": (_n(320, 4), "F64"), f"{Q}.alpha": (np.ones(()), "F16")})
    _prepare(loras, probe_info, "cat <lora:f64:1>").cleanup()


# -- bug 2: a half module changes nothing ---------------------------------------------------------------------
def test_a_module_with_only_one_half_is_refused(loras, probe_info):
    write_safetensors(loras / "downonly.safetensors", {f"{Q}.lora_down.weight": _n(4, 320)})
    write_safetensors(loras / "uponly.safetensors", {f"{Q}.lora_up.weight": _n(320, 4), f"{Q}.alpha": np.ones(())})
    _refused(loras, probe_info, "downonly", "lora_down", "no lora_up")
    _refused(loras, probe_info, "uponly", "lora_up", "no lora_down")
    kohya_lora(loras / "style.safetensors")  # a good LoRA with one half module more: the file is damaged
    tensors = _read_all(loras / "style.safetensors")
    tensors[f"{PROJ_IN}.lora_down.weight"] = _n(4, 320)
    write_safetensors(loras / "halfmore.safetensors", tensors)
    _refused(loras, probe_info, "halfmore", "no lora_up")


def test_an_alpha_alone_changes_nothing(loras, probe_info):
    write_safetensors(loras / "alphaonly.safetensors", {f"{Q}.alpha": np.ones(())})
    _refused(loras, probe_info, "alphaonly", "changes nothing")


def _read_all(path: Path) -> Dict[str, np.ndarray]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    return {name: np.frombuffer(data[info["data_offsets"][0]:info["data_offsets"][1]], "<f4").reshape(info["shape"])
            for name, info in header.items() if name != "__metadata__"}


# -- bug 3: one file named two ways ---------------------------------------------------------------------------
def test_one_lora_named_two_ways_is_staged_once_and_its_weights_add_up(loras, probe_info):
    kohya_lora(loras / "style.safetensors")
    found = _prepare(loras, probe_info, "a cat <lora:style:1> <lora:style.safetensors:0.5>")
    try:
        assert os.listdir(found.lora_dir) == ["style.safetensors"]
        assert [(x.name, x.weight) for x in found.loras] == [("style", 1.5)]
    finally:
        found.cleanup()
    with pytest.raises(InvalidRequestError, match="add up to 16"):
        _prepare(loras, probe_info, "a cat <lora:style:8> <lora:style.safetensors:8>")
    os.link(loras / "style.safetensors", loras / "same.safetensors")  # one file, two names: the bindings apply both
    with pytest.raises(InvalidRequestError, match="add up to 12"):
        _prepare(loras, probe_info, "a cat <lora:style:6> <lora:same:6>")


def test_the_cli_sums_one_file_named_two_ways_as_the_bindings_do(cpu_runtime, probe_model, cache_with_probe, loras,
                                                                 tmp_path):
    kohya_lora(loras / "style.safetensors")
    env = cli_env(cache_with_probe, tmp_path)
    common = ["generate", "--runtime", cpu_runtime.path, "-m", probe_model.path, "-W", "64", "-H", "64", "--steps", "1",
              "--seed", "5", "--lora-dir", loras, "--json"]
    r = run_cli([*common, "-p", "cat <lora:style:0.5> <lora:style.safetensors:0.5>", "-o", tmp_path / "two.png"], env)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["result"]["loras"] == [{"name": "style", "weight": 1.0, "tensors": 21, "applied": 63, "total": 63, "warning": ""}]
    r = run_cli([*common, "-p", "cat <lora:style:1>", "-o", tmp_path / "one.png"], env)
    assert r.returncode == 0, r.stderr
    from accelstack.engine.png import read_png
    assert read_png(tmp_path / "two.png").rgb() == read_png(tmp_path / "one.png").rgb()
    r = run_cli([*common, "-p", "cat <lora:style:8> <lora:style.safetensors:8>", "-o", tmp_path / "no.png"], env)
    last = json.loads(r.stdout.splitlines()[-1])
    assert r.returncode == 2 and last["event"] == "error" and "add up to 16" in last["message"], r.stdout
    assert "Traceback" not in r.stderr and not (tmp_path / "no.png").exists()


# -- bug 4: tags stable-diffusion.cpp leaves in the prompt as text -----------------------------------------------
@pytest.mark.parametrize("tag", ["<lora:style>", "<lora:style:>", "<lora::1>", "<lora:style:1", "<LORA:style>"])
@pytest.mark.parametrize("with_folder", [True, False])
def test_a_tag_without_its_weight_is_refused(loras, probe_info, tag, with_folder):
    kohya_lora(loras / "style.safetensors")
    with pytest.raises(InvalidRequestError) as caught:
        prepare_companions(f"a cat {tag} at night", str(loras) if with_folder else "", "", probe_info)
    assert "<lora:NAME:WEIGHT>" in caught.value.message
    assert ("<lora:style:1>" if "style" in tag else "<lora:NAME:1>") in (caught.value.hint or "")


def test_a_well_formed_tag_and_plain_angle_brackets_pass(loras, probe_info):
    kohya_lora(loras / "style.safetensors")
    found = prepare_companions("a <cat> <lora:style:1> <lorax> <lora", str(loras), "", probe_info)
    found.cleanup()
    assert prepare_companions("a <cat> <loraless:1>", "", "", probe_info).loras == []


def test_the_cli_refuses_a_tag_without_a_weight_with_no_lora_folder(cpu_runtime, probe_model, cache_with_probe, tmp_path):
    env = cli_env(cache_with_probe, tmp_path)
    r = run_cli(["generate", "--runtime", cpu_runtime.path, "-m", probe_model.path, "-W", "64", "-H", "64", "--steps", "1",
                 "-p", "a cat <lora:good>", "-o", tmp_path / "no.png", "--json"], env)
    last = json.loads(r.stdout.splitlines()[-1])
    assert r.returncode == 2 and last["event"] == "error" and "<lora:good:1>" in last["hint"], r.stdout
    assert "Traceback" not in r.stderr and not (tmp_path / "no.png").exists()


# -- bug 5: the header first, then the copy -------------------------------------------------------------------
@pytest.fixture
def no_links(monkeypatch):
    """As when the folder is on another file system than the staging: every hard link fails (EXDEV)."""
    def cross_device(*a, **k):
        raise OSError(errno.EXDEV, "Invalid cross-device link")
    monkeypatch.setattr(companions_module.os, "link", cross_device)


@pytest.fixture
def no_copies(monkeypatch):
    def copied(*a, **k):
        raise AssertionError("a file was copied before its header was checked")
    monkeypatch.setattr(companions_module.shutil, "copyfileobj", copied)


def _sparse(path: Path, head: bytes, size: int) -> Path:
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(size)
    return path


def test_a_broken_file_on_another_file_system_is_refused_before_it_is_copied(loras, tmp_path, probe_info, no_links,
                                                                             no_copies):
    big = 2 << 30
    _sparse(loras / "broken.safetensors", struct.pack("<Q", 40) + b"{not json at all, but 2 GB long}xxxxxxx", big)
    _refused(loras, probe_info, "broken", "cannot be read")
    embs = tmp_path / "embs"
    embs.mkdir()
    _sparse(embs / "glow.safetensors", b"\x00" * 64, big)
    with pytest.raises(InvalidRequestError, match="embedding glow"):
        prepare_companions("a glow cat", "", str(embs), probe_info)


def test_a_good_lora_on_another_file_system_is_copied_and_checked(loras, probe_info, no_links):
    kohya_lora(loras / "style.safetensors")
    found = _prepare(loras, probe_info, "cat <lora:style:1>")
    try:
        staged = Path(found.lora_dir) / "style.safetensors"
        assert staged.read_bytes() == (loras / "style.safetensors").read_bytes()
        assert staged.stat().st_ino != (loras / "style.safetensors").stat().st_ino  # a copy, not a link
        assert found.loras[0].tensors == 21
    finally:
        found.cleanup()


def test_a_full_disk_while_copying_is_a_typed_error(loras, probe_info, no_links, monkeypatch):
    kohya_lora(loras / "style.safetensors")

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(companions_module.shutil, "copyfileobj", full)
    with pytest.raises(GenerationError, match="No space left") as caught:
        _prepare(loras, probe_info, "cat <lora:style:1>")
    assert caught.value.action == Action.FREE_DISK
    assert STAGINGS and not any(folder.exists() for folder in STAGINGS)


def test_an_embedding_larger_than_stable_diffusion_cpp_loads_is_refused_unstaged(tmp_path, probe_info, no_copies,
                                                                                 monkeypatch):
    embs = tmp_path / "embs"
    embs.mkdir()
    embedding(embs / "huge.safetensors")
    with open(embs / "huge.safetensors", "r+b") as fh:  # a good header, then 101 MB the header never names
        fh.truncate(101 << 20)
    linked = []
    monkeypatch.setattr(companions_module.os, "link", lambda *a, **k: linked.append(a))
    with pytest.raises(InvalidRequestError, match="100 MB"):
        prepare_companions("a huge cat", "", str(embs), probe_info)
    assert not linked
    shutil.rmtree(embs)


def test_a_model_weight_of_no_dimensions_is_a_typed_refusal(loras, tmp_path):
    """A model whose weight a LoRA targets is a scalar (0 dimensions): the LoRA check raised IndexError
    (issue 47); it is a typed refusal naming the weight."""
    from model_specs import sd1_original
    from model_specs import write_safetensors as write_model

    spec = sd1_original()
    target = "model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn2.to_q.weight"
    module = Q.replace("attn1", "attn2")
    assert target in spec
    spec[target] = ((), spec[target][1])
    model = check_model(str(write_model(tmp_path / "scalar.safetensors", spec)))
    _lora(loras, "q", module, _n(4, 320), _n(320, 4))
    with pytest.raises(InvalidRequestError) as caught:
        _prepare(loras, model, "cat <lora:q:1>")
    assert "does not fit this model" in caught.value.message and "a scalar" in caught.value.message
    write_safetensors(loras / "d.safetensors", {f"{module}.diff": _n(1, 1)})
    _prepare(loras, model, "cat <lora:d:1>")  # a diff of one value is what sd.cpp adds to a scalar
