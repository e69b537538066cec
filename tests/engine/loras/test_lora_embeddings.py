"""LoRAs (``<lora:NAME:WEIGHT>`` from a LoRA folder) and textual-inversion embeddings, for real on
the CPU build of stable-diffusion.cpp with the probe model and tiny files synthesized here."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Tuple

import numpy as np
import pytest
from companion_files import BLOCKS, embedding, kohya_lora, write_safetensors  # noqa: E402

from accelstack.engine import generation
from accelstack.engine.errors import InvalidRequestError
from accelstack.engine.models.check import check_model
from accelstack.engine.png import read_png
from accelstack.engine.request import companions as companions_module
from accelstack.engine.request.companions import canonical_module, prepare_companions
from accelstack.engine.worker.protocol import GenerateRequest

from engine_helpers import cli_env, run_cli  # noqa: E402


def fast(prompt: str, **kw) -> GenerateRequest:
    return GenerateRequest(prompt=prompt, width=64, height=64, steps=1, seed=5, **kw)


@pytest.fixture(scope="module")
def probe_info(probe_model):
    return check_model(probe_model.path)


def _run(cpu_runtime, probe_model, tmp_path, name: str, request: GenerateRequest) -> Tuple[bytes, generation.GenerateReport]:
    out = tmp_path / f"{name}.png"
    report = generation.generate(cpu_runtime, probe_model.path, request, out)
    return read_png(out).rgb(), report


# -- for real on the CPU build ---------------------------------------------------------------------------
def _staging() -> set:
    """The run folders in the temp folder: a LoRA's staging is one (workdirs.make), named like a worker's."""
    return set(Path(tempfile.gettempdir()).glob("accelstack-worker-*"))


def test_a_lora_changes_the_image_is_named_and_weight_zero_changes_nothing(cpu_runtime, probe_model, tmp_path):
    before = _staging()
    loras = tmp_path / "loras"
    loras.mkdir()
    kohya_lora(loras / "style.safetensors")
    plain, _ = _run(cpu_runtime, probe_model, tmp_path, "plain", fast("a lighthouse"))
    styled, report = _run(cpu_runtime, probe_model, tmp_path, "styled",
                          fast("a lighthouse <lora:style:0.9>", lora_dir=str(loras)))
    zero, _ = _run(cpu_runtime, probe_model, tmp_path, "zero", fast("a lighthouse <lora:style:0>", lora_dir=str(loras)))
    assert styled != plain
    assert zero == plain  # stable-diffusion.cpp scales the LoRA's difference by the weight: 0 adds nothing
    assert [(x.name, x.weight) for x in report.loras] == [("style", 0.9)]
    assert report.loras[0].tensors == 3 * len(BLOCKS)
    text = read_png(tmp_path / "styled.png").text["parameters"]
    assert "LoRA: style:0.9" in text
    assert _staging() == before  # the staging is removed (the glob of "accelstack-companions-*" matched no folder ever made)


def test_an_embedding_loads_and_its_name_changes_the_conditioning(cpu_runtime, probe_model, tmp_path):
    """Two folders with an embedding of the same name and other vectors: the images differ, so the
    prompt word brought the embedding's vectors in (loading any embedding also turns CLIP to f32 in
    stable-diffusion.cpp, so comparing with no folder at all would not prove it)."""
    images = []
    for seed in (3, 4):
        embs = tmp_path / f"embeddings-{seed}"
        embs.mkdir()
        embedding(embs / "glowstyle.safetensors", seed=seed)
        (embs / "README.txt").write_text("not an embedding")
        pixels, report = _run(cpu_runtime, probe_model, tmp_path, f"with-{seed}",
                              fast("a glowstyle lighthouse", embeddings_dir=str(embs)))
        assert report.embeddings == ["glowstyle"]
        images.append(pixels)
    assert images[0] != images[1]
    assert "Embeddings: glowstyle" in read_png(tmp_path / "with-3.png").text["parameters"]


# -- refused before the worker starts ---------------------------------------------------------------------
@pytest.fixture
def no_worker(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a worker was started")
    monkeypatch.setattr(generation, "Supervisor", refuse)


def _folder_with(tmp_path: Path) -> Path:
    loras = tmp_path / "loras"
    loras.mkdir(exist_ok=True)
    kohya_lora(loras / "style.safetensors")
    return loras


@pytest.mark.parametrize("tag", ["<lora:../style:1>", "<lora:a/b:1>", "<lora:/etc/passwd:1>", "<lora:.hidden:1>",
                                 "<lora:|high_noise|style:1>", "<lora:style:nan>", "<lora:style:1e40>", "<lora:style:11>",
                                 "<lora:style:inf>", "<LORA:style:1>", "<lora:sty\\le:1>"])
def test_hostile_tags_are_refused(tag, tmp_path, cpu_runtime, probe_model, no_worker):
    loras = _folder_with(tmp_path)
    with pytest.raises(InvalidRequestError):
        generation.generate(cpu_runtime, probe_model.path, fast(f"cat {tag}", lora_dir=str(loras)), tmp_path / "o.png")


def test_a_tag_without_a_lora_folder_is_a_usage_error():
    with pytest.raises(InvalidRequestError, match="no LoRA folder"):
        fast("cat <lora:style:1>").validate()


def test_a_lora_tag_in_the_negative_prompt_is_refused():
    with pytest.raises(InvalidRequestError, match="prompt only"):
        GenerateRequest(prompt="cat", negative_prompt="<lora:x:1>", lora_dir="/tmp").validate()


def _refused(tmp_path: Path, probe_info, name: str, match: str) -> None:
    before = _staging()
    with pytest.raises(InvalidRequestError, match=match):
        prepare_companions(f"cat <lora:{name}:1>", str(tmp_path / "loras"), "", probe_info)
    assert _staging() == before  # removed on the error too


def test_a_symlink_pointing_outside_is_refused(tmp_path, probe_info):
    loras = _folder_with(tmp_path)
    kohya_lora(tmp_path / "outside.safetensors")
    (loras / "evil.safetensors").symlink_to(tmp_path / "outside.safetensors")
    _refused(tmp_path, probe_info, "evil", "symbolic link")


def test_a_fifo_and_a_folder_are_refused(tmp_path, probe_info):
    loras = _folder_with(tmp_path)
    os.mkfifo(loras / "pipe.safetensors")
    (loras / "dir.safetensors").mkdir()
    _refused(tmp_path, probe_info, "pipe", "not a regular file")
    _refused(tmp_path, probe_info, "dir", "not a regular file")


def test_a_truncated_header_is_refused(tmp_path, probe_info):
    loras = _folder_with(tmp_path)
    raw = (loras / "style.safetensors").read_bytes()
    (loras / "cut.safetensors").write_bytes(raw[:40])
    _refused(tmp_path, probe_info, "cut", "cannot be read")


def test_a_lora_for_another_model_is_refused(tmp_path, probe_info):
    loras = _folder_with(tmp_path)
    rng = np.random.default_rng(1)
    write_safetensors(loras / "flux.safetensors", {  # Flux's names: nothing of an SD 1.x UNet
        "lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight": rng.normal(0, 1, (4, 3072)),
        "lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight": rng.normal(0, 1, (9216, 4))})
    _refused(tmp_path, probe_info, "flux", "changes nothing in this model")
    write_safetensors(loras / "xl.safetensors", {  # SDXL's cross-attention: its context is 2048 wide
        "lora_unet_down_blocks_1_attentions_0_transformer_blocks_0_attn2_to_k.lora_down.weight": rng.normal(0, 1, (4, 2048)),
        "lora_unet_down_blocks_1_attentions_0_transformer_blocks_0_attn2_to_k.lora_up.weight": rng.normal(0, 1, (640, 4))})
    _refused(tmp_path, probe_info, "xl", "does not fit this model")
    write_safetensors(loras / "empty.safetensors", {"some.weight": rng.normal(0, 1, (2, 2))})
    _refused(tmp_path, probe_info, "empty", "no LoRA tensors")


def test_a_missing_name_is_refused(tmp_path, probe_info):
    _folder_with(tmp_path)
    _refused(tmp_path, probe_info, "absent", "there is no LoRA 'absent'")


def test_a_lora_folder_that_is_not_a_folder_is_refused(tmp_path, probe_info):
    with pytest.raises(InvalidRequestError, match="cannot be read"):
        prepare_companions("cat <lora:style:1>", str(tmp_path / "nowhere"), "", probe_info)


def test_the_staged_lora_is_the_inode_checked_and_the_staging_is_private(tmp_path, probe_info):
    loras = _folder_with(tmp_path)
    found = prepare_companions("cat <lora:style:1>", str(loras), "", probe_info)
    try:
        staged = Path(found.lora_dir) / "style.safetensors"
        assert staged.read_bytes() == (loras / "style.safetensors").read_bytes()
        assert (os.stat(found.folder).st_mode & 0o077) == 0
        # Replacing the user's file after the check does not change what the worker loads.
        (loras / "style.safetensors").unlink()
        (loras / "style.safetensors").write_bytes(b"garbage")
        assert staged.read_bytes() != b"garbage"
    finally:
        found.cleanup()
    assert not Path(found.lora_dir).exists()


def test_a_staging_left_by_a_killed_run_is_removed_by_the_stale_folder_cleanup(tmp_path, probe_info):
    """A run killed with SIGKILL runs no ``finally``: its staged LoRA copies must not stay in the temp dir
    for ever. The staging is a marked worker folder, so the next start's ``workdirs.clean_stale`` removes
    it once its maker is dead, as it removes a killed supervisor's folders."""
    import time

    from accelstack.engine.supervision import workdirs

    loras = _folder_with(tmp_path)
    found = prepare_companions("cat <lora:style:1>", str(loras), "", probe_info)
    try:
        marker = Path(found.folder) / workdirs.MARKER
        doc = json.loads(marker.read_text(encoding="utf-8"))
        doc["pid"], doc["started"] = 2 ** 22 + 12345, 0.0  # the maker is gone, as after a SIGKILL
        marker.write_text(json.dumps(doc), encoding="utf-8")
        removed = workdirs.clean_stale(Path(found.folder).parent, now=time.time() + 10 * workdirs.WORKER_DIR_STALE_SECONDS)
        assert Path(found.folder) in removed and not Path(found.folder).exists()
        assert (loras / "style.safetensors").is_file()  # the user's file stays
    finally:
        found.cleanup()


def test_embeddings_are_checked_against_the_text_encoder(tmp_path, probe_info):
    embs = tmp_path / "embs"
    embs.mkdir()
    embedding(embs / "wide.safetensors", width=1024)  # an SD 2.x embedding
    with pytest.raises(InvalidRequestError, match="768"):
        prepare_companions("cat", "", str(embs), probe_info)
    (embs / "wide.safetensors").unlink()
    embedding(embs / "two words.safetensors")
    with pytest.raises(InvalidRequestError, match="not one prompt word"):
        prepare_companions("cat", "", str(embs), probe_info)
    (embs / "two words.safetensors").unlink()
    embedding(embs / "Same.safetensors")
    embedding(embs / "same.pt")
    with pytest.raises(InvalidRequestError, match="same name"):
        prepare_companions("cat", "", str(embs), probe_info)
    (embs / "same.pt").unlink()
    (embs / "link.safetensors").symlink_to(embs / "Same.safetensors")
    with pytest.raises(InvalidRequestError, match="symbolic link"):
        prepare_companions("cat", "", str(embs), probe_info)
    (embs / "link.safetensors").unlink()
    found = prepare_companions("cat", "", str(embs), probe_info)
    found.cleanup()
    assert found.embeddings == ["Same"]


def test_canonical_names_meet_across_conventions():
    ldm = canonical_module("model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn1.to_q")
    assert canonical_module("unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q") == ldm
    assert canonical_module("lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q") == ldm
    assert canonical_module("lora.unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q") == ldm
    assert canonical_module("lora_unet_input_blocks_1_1_transformer_blocks_0_attn1_to_q") == ldm
    te = canonical_module("cond_stage_model.transformer.text_model.encoder.layers.0.self_attn.q_proj")
    assert canonical_module("lora_te_text_model_encoder_layers_0_self_attn_q_proj") == te
    assert canonical_module("te.text_model.encoder.layers.0.self_attn.q_proj") == te
    assert canonical_module("model.diffusion_model.middle_block.1.proj_in") == canonical_module(
        "unet.mid_block.attentions.0.proj_in")
    assert canonical_module("first_stage_model.decoder.conv_in") is None
    assert companions_module.LORA_EXTENSIONS[0] == ".pt"  # the bindings' order


def test_z_image_diffusers_names_meet_its_fused_qkv_and_out():
    # src/name_conversion.cpp convert_diffusers_dit_to_original_lumina2: to_q/to_k/to_v are slices of the fused
    # qkv, to_out.0 is out, norm_q/norm_k are q_norm/k_norm; the ComfyUI and diffusers prefixes both.
    qkv = canonical_module("model.diffusion_model.layers.3.attention.qkv")
    for proj in ("to_q", "to_k", "to_v"):
        assert canonical_module(f"diffusion_model.layers.3.attention.{proj}") == qkv
        assert canonical_module(f"transformer.layers.3.attention.{proj}", False) == qkv
    assert canonical_module("diffusion_model.noise_refiner.1.attention.to_out.0") == canonical_module(
        "model.diffusion_model.noise_refiner.1.attention.out")
    assert canonical_module("diffusion_model.context_refiner.0.attention.norm_k") == canonical_module(
        "model.diffusion_model.context_refiner.0.attention.k_norm")
    assert canonical_module("diffusion_model.all_x_embedder.2-1") == canonical_module("model.diffusion_model.x_embedder")
    # another family's names with the same words are left alone
    assert canonical_module("diffusion_model.transformer_blocks.0.attn.to_q", False) == ("unet", "transformer_blocks_0_attn_to_q")


def test_the_cli_applies_a_lora_and_says_so_in_json(cpu_runtime, probe_model, cache_with_probe, tmp_path):
    loras = _folder_with(tmp_path)
    env = cli_env(cache_with_probe, tmp_path)
    common = ["generate", "--runtime", cpu_runtime.path, "-m", probe_model.path, "-W", "64", "-H", "64", "--steps", "1"]
    r = run_cli([*common, "-p", "cat <lora:style:0.7>", "--lora-dir", loras, "-o", tmp_path / "cli.png", "--json"], env)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])["result"]
    assert result["loras"] == [{"name": "style", "weight": 0.7, "tensors": 21, "applied": 63, "total": 63, "warning": ""}] and result["embeddings"] == []
    for prompt, extra in (("cat <lora:style:1>", []), ("cat <lora:../x:1>", ["--lora-dir", str(loras)])):
        r = run_cli([*common, "-p", prompt, "-o", tmp_path / "no.png", *extra], env)
        assert r.returncode == 2 and ("no LoRA folder" in r.stderr or "not a plain file name" in r.stderr), r.stderr
    assert "<lora:NAME:WEIGHT>" in run_cli(["generate", "--help"], env).stdout


def test_kohya_names_are_read_as_stable_diffusion_cpp_reads_them():
    # src/name_conversion.cpp convert_sep_to_dot keeps the underscores of the words it knows; the SD3 row is
    # what its log printed for a kohya SD3 LoRA ("unused lora tensor |...joint.blocks.0.x.block.attn.qkv...|").
    from accelstack.engine.loras.names import is_kohya, kohya_dotted

    assert kohya_dotted("joint_blocks_0_x_block_attn_qkv") == "joint.blocks.0.x.block.attn.qkv"
    assert kohya_dotted("double_blocks_0_img_attn_qkv") == "double_blocks.0.img_attn.qkv"  # FLUX.1's words are known
    assert kohya_dotted("transformer_blocks_0_attn_add_k_proj") == "transformer_blocks.0.attn.add_k_proj"
    assert kohya_dotted("text_model_encoder_layers_0_self_attn_q_proj") == "text_model.encoder.layers.0.self_attn.q_proj"
    assert is_kohya("lora_unet_joint_blocks_0") and is_kohya("lora_te2_text_model") and not is_kohya("diffusion_model.x")
