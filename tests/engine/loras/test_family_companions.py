"""Companions on the family probes added after the first four, on the real CPU build with files the tests
synthesize: SD 2.x's LoRA, embedding and ControlNet; Qwen-Image from separate files (``--llm`` run for
real) and its LoRAs in the namings users have, each checked, applied and named."""
from __future__ import annotations

import numpy as np
import pytest
from companion_files import check_refuses_embedding_and_controlnet, dit_lora, embedding, write_safetensors
from component_files import split_probe, write_controlnet, write_png_image

from accelstack.engine import generation
from accelstack.engine.errors import InvalidRequestError
from accelstack.engine.png import read_png
from accelstack.engine.worker.protocol import GenerateRequest


def _generate(runtime, model, folder, request: GenerateRequest, name: str):
    out = folder / f"{name}.png"
    report = generation.generate(runtime, model, request, out)
    png = read_png(out)
    return png.rgb(), png.text["parameters"], report


def sd2_lora(path, seed: int = 17):
    """A kohya SD 2.x LoRA in LDM names on the first level's and the middle block's attention (320 and
    1280 wide) and the OpenCLIP-H encoder's first layer (1024): what kohya's sd-scripts writes for SD 2.x."""
    rng = np.random.default_rng(seed)
    tensors = {}
    modules = {"lora_unet_input_blocks_1_1_transformer_blocks_0_attn1_to_q": 320,
               "lora_unet_input_blocks_1_1_transformer_blocks_0_attn2_to_out_0": 320,
               "lora_unet_middle_block_1_transformer_blocks_0_attn1_to_v": 1280,
               "lora_te_text_model_encoder_layers_0_self_attn_q_proj": 1024}
    for key, c in modules.items():
        tensors[f"{key}.lora_down.weight"] = rng.normal(0, 0.5, (4, c))
        tensors[f"{key}.lora_up.weight"] = rng.normal(0, 0.5, (c, 4))
        tensors[f"{key}.alpha"] = np.array(4.0)
    return write_safetensors(path, tensors)


@pytest.fixture(scope="module")
def sd2_probe(family_probe) -> str:
    """The SD 2.x probe (1.2 GB), made once for the session (tests/conftest.py)."""
    return family_probe("sd2").path


def test_an_sd2_lora_embedding_and_controlnet_apply_to_the_sd2_probe(cpu_runtime, sd2_probe, tmp_path):
    # issue 26 "Done when" for SD 2.x: a LoRA, an embedding (1024 wide: OpenCLIP-H's) and a ControlNet
    # (SD 2.x's 1024-wide context, src/control.hpp) on the full-size SD 2.x probe.
    loras, embeds = tmp_path / "loras", tmp_path / "embeddings"
    loras.mkdir()
    embeds.mkdir()
    sd2_lora(loras / "sd2style.safetensors")
    embedding(embeds / "sd2word.safetensors", width=1024)
    request = dict(width=64, height=64, steps=1, seed=5, cfg_scale=1.0, embeddings_dir=str(embeds))
    plain, _t, first = _generate(cpu_runtime, sd2_probe, tmp_path, GenerateRequest(prompt="a sd2word lighthouse", **request),
                                 "plain")
    assert first.embeddings == ["sd2word"]
    bare, _t, _r = _generate(cpu_runtime, sd2_probe, tmp_path, GenerateRequest(prompt="a lighthouse", **request), "bare")
    assert bare != plain  # the embedding's vectors changed the conditioning
    styled, text, report = _generate(cpu_runtime, sd2_probe, tmp_path, GenerateRequest(
        prompt="a sd2word lighthouse <lora:sd2style:0.8>", lora_dir=str(loras), **request), "styled")
    assert styled != plain
    assert [(lora.name, lora.weight, lora.tensors) for lora in report.loras] == [("sd2style", 0.8, 4)]  # every module matched, the text encoder's too
    assert "LoRA: sd2style:0.8" in text and "Embeddings: sd2word" in text
    net = write_controlnet(tmp_path / "depth-sd21.safetensors", context=1024)  # projections as control.hpp builds them
    control = write_png_image(tmp_path / "depth.png", 64, 64, seed=4)
    guided, text, report = _generate(cpu_runtime, sd2_probe, tmp_path, GenerateRequest(
        prompt="a sd2word lighthouse", control_net=str(net), control_image=str(control), control_strength=0.9,
        **request), "guided")
    assert guided != plain
    assert report.components == {"control_net": "depth-sd21.safetensors"}
    assert "ControlNet: depth-sd21.safetensors 0.9" in text


def test_an_sd1_controlnet_on_the_sd2_probe_is_refused_before_any_worker(cpu_runtime, sd2_probe, tmp_path, monkeypatch):
    net = write_controlnet(tmp_path / "canny-sd15.safetensors")
    control = write_png_image(tmp_path / "edges.png", 64, 64, seed=4)
    monkeypatch.setattr(generation, "Supervisor", lambda *a, **k: pytest.fail("a worker was started"))
    with pytest.raises(InvalidRequestError, match="for sd1, not for this sd2 model"):
        generation.generate(cpu_runtime, sd2_probe, GenerateRequest(
            prompt="a lighthouse", width=64, height=64, control_net=str(net), control_image=str(control)),
            tmp_path / "no.png")
    assert not (tmp_path / "no.png").exists()


def test_a_controlnet_with_linear_projections_is_refused_before_it_crashes_the_worker(cpu_runtime, sd2_probe, tmp_path,
                                                                                       monkeypatch):
    # SD 2.x ControlNets are trained with linear transformer projections (copied from SD 2.x's UNet). The
    # runtime's ControlNet looks for the file's proj_out among the *model's* tensor names (src/control.hpp
    # ControlNet passes the model's tensor map to SpatialTransformer::init_params), never finds it and builds
    # 1x1 convolutions: measured here, "tensor 'input_blocks.1.1.proj_in.weight' has wrong shape in model
    # file: got [320, 320, 1, 1], expected [1, 1, 320, 320]", then the worker died of SIGSEGV, reported as
    # the model failing to load. Refused before any worker starts, naming the ControlNet and the reason.
    net = write_controlnet(tmp_path / "depth-sd21.safetensors", context=1024, linear=True)
    control = write_png_image(tmp_path / "depth.png", 64, 64, seed=4)
    monkeypatch.setattr(generation, "Supervisor", lambda *a, **k: pytest.fail("a worker was started"))
    with pytest.raises(InvalidRequestError, match="--control-net") as info:
        generation.generate(cpu_runtime, sd2_probe, GenerateRequest(
            prompt="a lighthouse", width=64, height=64, control_net=str(net), control_image=str(control)),
            tmp_path / "no.png")
    assert "linear" in info.value.message and "src/control.hpp" in info.value.message
    assert not (tmp_path / "no.png").exists()


# -- Qwen-Image ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def qwen_parts(module_tmp):
    """The reduced Qwen-Image probe and its three parts as the files users have (qwen_image.safetensors,
    qwen_image_vae.safetensors, qwen_2.5_vl_7b.safetensors: ComfyUI's split)."""
    return split_probe("qwen-image", module_tmp / "qwen", {
        "qwen_image.safetensors": "model.diffusion_model.", "qwen_image_vae.safetensors": "vae.",
        "qwen_2.5_vl_7b.safetensors": "text_encoders.llm."})


QWEN_REQUEST = dict(prompt="a lighthouse", width=64, height=64, steps=1, seed=5, cfg_scale=1.0)


@pytest.fixture(scope="module")
def qwen_plain(cpu_runtime, qwen_parts, module_tmp):
    """The whole Qwen-Image probe's image for QWEN_REQUEST, made once: the image each test below compares
    its own generation with (the split files' must equal it, each LoRA's must differ from it). Every
    generation is seeded and deterministic on the CPU build, so one run is the same image as one per test
    (it was four, ~10 s each on two cores)."""
    probe, _folder = qwen_parts
    folder = module_tmp / "qwen-plain"
    folder.mkdir()
    pixels, _text, _report = _generate(cpu_runtime, probe, folder, GenerateRequest(**QWEN_REQUEST), "plain")
    return pixels


def test_qwen_image_from_a_diffusion_model_vae_and_llm_files_is_the_checkpoints_image(cpu_runtime, qwen_parts, qwen_plain,
                                                                                       tmp_path):
    # --llm run for real: Qwen2.5-VL's text model as a file of its own (loaded under text_encoders.llm.).
    probe, folder = qwen_parts
    whole = qwen_plain
    split, text, report = _generate(cpu_runtime, None, tmp_path, GenerateRequest(
        **QWEN_REQUEST, diffusion_model=str(folder / "qwen_image.safetensors"),
        vae=str(folder / "qwen_image_vae.safetensors"), llm=str(folder / "qwen_2.5_vl_7b.safetensors")), "split")
    assert split == whole  # the same tensors, given as three files
    assert report.components == {"diffusion_model": "qwen_image.safetensors", "vae": "qwen_image_vae.safetensors",
                                 "llm": "qwen_2.5_vl_7b.safetensors"}
    assert "VAE: qwen_image_vae.safetensors" in text


# the first joint block's attention and image MLP (3072 wide, the MLP 12288)
QWEN_MODULES = {"transformer_blocks.0.attn.to_q": (3072, 3072), "transformer_blocks.0.attn.add_k_proj": (3072, 3072),
                "transformer_blocks.0.img_mlp.net.2": (3072, 12288)}


@pytest.mark.parametrize("naming", ["diffusers", "comfy", "kohya"])
def test_a_qwen_image_lora_applies_in_each_naming(naming, cpu_runtime, qwen_parts, qwen_plain, tmp_path):
    probe, _folder = qwen_parts
    loras = tmp_path / "loras"
    loras.mkdir()
    dit_lora(loras / "qstyle.safetensors", QWEN_MODULES, naming, 21)
    plain = qwen_plain
    request = dict(QWEN_REQUEST, prompt="a lighthouse <lora:qstyle:1.0>")
    styled, text, report = _generate(cpu_runtime, probe, tmp_path, GenerateRequest(**request, lora_dir=str(loras)),
                                     "styled")
    assert [(lora.name, lora.tensors) for lora in report.loras] == [("qstyle", 3)]
    assert styled != plain  # stable-diffusion.cpp applied it, not only our check
    assert "LoRA: qstyle:1" in text


def test_qwen_image_refuses_an_embedding_and_a_controlnet_before_any_worker(cpu_runtime, qwen_parts, tmp_path,
                                                                            monkeypatch):
    probe, _folder = qwen_parts
    check_refuses_embedding_and_controlnet(cpu_runtime, probe, QWEN_REQUEST, tmp_path, monkeypatch)


# -- SD 3.x -------------------------------------------------------------------------------------------
# the first joint block (1536 wide: the fused qkv 4608 rows, the MLP 6144)
SD3_MODULES = {"joint_blocks.0.x_block.attn.qkv": (4608, 1536), "joint_blocks.0.context_block.mlp.fc2": (1536, 6144)}


def test_an_sd3_lora_and_a_two_encoder_embedding_apply_to_the_sd3_probe(cpu_runtime, family_probe, tmp_path, monkeypatch):
    # A ComfyUI-named SD3 LoRA and an SDXL-style embedding (clip_l 768 + clip_g 1280 vectors: SD3's two CLIPs)
    # on the SD3 probe: checked, applied (the image changes) and named. The same LoRA in kohya names was
    # taken as matching and reported applied while stable-diffusion.cpp applied none of it ("Only (0 / 6)
    # LoRA tensors have been applied": it read lora_unet_joint_blocks_0_x_block_attn_qkv as
    # joint.blocks.0.x.block.attn.qkv); it is now refused before any worker starts, with that reason.
    probe = family_probe("sd3")
    loras, embeds = tmp_path / "loras", tmp_path / "embeddings"
    loras.mkdir()
    embeds.mkdir()
    dit_lora(loras / "sd3style.safetensors", SD3_MODULES, "comfy", 23)
    dit_lora(loras / "sd3kohya.safetensors", SD3_MODULES, "kohya", 23)
    rng = np.random.default_rng(29)
    write_safetensors(embeds / "sd3word.safetensors", {"clip_l": rng.normal(0, 0.5, (2, 768)),
                                                        "clip_g": rng.normal(0, 0.5, (2, 1280))})
    request = dict(width=64, height=64, steps=1, seed=5, cfg_scale=1.0, embeddings_dir=str(embeds))
    plain, _t, first = _generate(cpu_runtime, probe.path, tmp_path, GenerateRequest(prompt="a sd3word lighthouse",
                                                                                    **request), "plain")
    assert first.embeddings == ["sd3word"]
    styled, text, report = _generate(cpu_runtime, probe.path, tmp_path, GenerateRequest(
        prompt="a sd3word lighthouse <lora:sd3style:0.8>", lora_dir=str(loras), **request), "styled")
    assert styled != plain
    assert [(lora.name, lora.weight, lora.tensors) for lora in report.loras] == [("sd3style", 0.8, 2)]
    assert "LoRA: sd3style:0.8" in text and "Embeddings: sd3word" in text
    monkeypatch.setattr(generation, "Supervisor", lambda *a, **k: pytest.fail("a worker was started"))
    with pytest.raises(InvalidRequestError, match="joint.blocks.0") as info:
        generation.generate(cpu_runtime, probe.path, GenerateRequest(
            prompt="a lighthouse <lora:sd3kohya:1>", lora_dir=str(loras), **request), tmp_path / "no.png")
    assert "convert_sep_to_dot" in info.value.message and "joint_blocks.0" in info.value.message


# -- TAESD -------------------------------------------------------------------------------------------
def test_a_taesd_decodes_the_sd1_probes_image(cpu_runtime, probe_model, tmp_path):
    # --taesd run for real: stable-diffusion.cpp decodes with the tiny autoencoder instead of the VAE
    # ("using TAE for encoding / decoding", src/stable-diffusion.cpp), so the same latents give other pixels.
    from component_files import write_taesd

    taesd = write_taesd(tmp_path / "taesd.safetensors")
    request = dict(prompt="a lighthouse", width=64, height=64, steps=1, seed=5)
    plain, _t, _r = _generate(cpu_runtime, probe_model.path, tmp_path, GenerateRequest(**request), "plain")
    tiny, text, report = _generate(cpu_runtime, probe_model.path, tmp_path,
                                   GenerateRequest(**request, taesd=str(taesd)), "tiny")
    assert tiny != plain and len(set(tiny)) > 16
    assert report.components == {"taesd": "taesd.safetensors"} and "TAESD: taesd.safetensors" in text


def test_a_taesd_for_other_latents_or_not_a_taesd_is_refused(cpu_runtime, probe_model, tmp_path, monkeypatch):
    # A 16-channel tiny autoencoder (taef1, Flux's) given to an SD 1.x model (4-channel latents), or a file that
    # is no tiny autoencoder: refused before any worker starts, naming --taesd and the reason.
    from component_files import write_taesd

    flux_tiny = write_taesd(tmp_path / "taef1.safetensors", latent=16)
    monkeypatch.setattr(generation, "Supervisor", lambda *a, **k: pytest.fail("a worker was started"))
    request = dict(prompt="a lighthouse", width=64, height=64, steps=1, seed=5)
    with pytest.raises(InvalidRequestError, match="--taesd") as info:
        generation.generate(cpu_runtime, probe_model.path, GenerateRequest(**request, taesd=str(flux_tiny)),
                            tmp_path / "no.png")
    assert "16-channel" in info.value.message and "4-channel" in info.value.message
    other = embedding(tmp_path / "word.safetensors")
    with pytest.raises(InvalidRequestError, match="not a tiny autoencoder"):
        generation.generate(cpu_runtime, probe_model.path, GenerateRequest(**request, taesd=str(other)), tmp_path / "no.png")
    assert not (tmp_path / "no.png").exists()
