"""Companions on the family probes added after the first four: SD 2.x's LoRA, embedding and ControlNet,
each checked, applied and named, on the real CPU build with files the tests synthesize."""
from __future__ import annotations

import numpy as np
import pytest
from companion_files import embedding, write_safetensors
from component_files import write_controlnet, write_png_image

from accelstack.engine import generation
from accelstack.engine.errors import InvalidRequestError
from accelstack.engine.png import read_png
from accelstack.engine.probe_family_files import ensure_family_probe
from accelstack.engine.protocol import GenerateRequest


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


def test_an_sd2_lora_embedding_and_controlnet_apply_to_the_sd2_probe(cpu_runtime, tmp_path):
    # issue 26 "Done when" for SD 2.x: a LoRA, an embedding (1024 wide: OpenCLIP-H's) and a ControlNet
    # (SD 2.x's 1024-wide context, src/control.hpp) on the full-size SD 2.x probe.
    probe = ensure_family_probe("sd2", 7, tmp_path / "cache", keep=True)
    loras, embeds = tmp_path / "loras", tmp_path / "embeddings"
    loras.mkdir()
    embeds.mkdir()
    sd2_lora(loras / "sd2style.safetensors")
    embedding(embeds / "sd2word.safetensors", width=1024)
    request = dict(width=64, height=64, steps=1, seed=5, cfg_scale=1.0, embeddings_dir=str(embeds))
    plain, _t, first = _generate(cpu_runtime, probe.path, tmp_path, GenerateRequest(prompt="a sd2word lighthouse", **request),
                                 "plain")
    assert first.embeddings == ["sd2word"]
    bare, _t, _r = _generate(cpu_runtime, probe.path, tmp_path, GenerateRequest(prompt="a lighthouse", **request), "bare")
    assert bare != plain  # the embedding's vectors changed the conditioning
    styled, text, report = _generate(cpu_runtime, probe.path, tmp_path, GenerateRequest(
        prompt="a sd2word lighthouse <lora:sd2style:0.8>", lora_dir=str(loras), **request), "styled")
    assert styled != plain
    assert [(lora.name, lora.weight, lora.tensors) for lora in report.loras] == [("sd2style", 0.8, 4)]  # every module matched, the text encoder's too
    assert "LoRA: sd2style:0.8" in text and "Embeddings: sd2word" in text
    net = write_controlnet(tmp_path / "depth-sd21.safetensors", context=1024)  # projections as control.hpp builds them
    control = write_png_image(tmp_path / "depth.png", 64, 64, seed=4)
    guided, text, report = _generate(cpu_runtime, probe.path, tmp_path, GenerateRequest(
        prompt="a sd2word lighthouse", control_net=str(net), control_image=str(control), control_strength=0.9,
        **request), "guided")
    assert guided != plain
    assert report.components == {"control_net": "depth-sd21.safetensors"}
    assert "ControlNet: depth-sd21.safetensors 0.9" in text


def test_an_sd1_controlnet_on_the_sd2_probe_is_refused_before_any_worker(cpu_runtime, tmp_path, monkeypatch):
    probe = ensure_family_probe("sd2", 7, tmp_path / "cache", keep=True)
    net = write_controlnet(tmp_path / "canny-sd15.safetensors")
    control = write_png_image(tmp_path / "edges.png", 64, 64, seed=4)
    monkeypatch.setattr(generation, "Supervisor", lambda *a, **k: pytest.fail("a worker was started"))
    with pytest.raises(InvalidRequestError, match="for sd1, not for this sd2 model"):
        generation.generate(cpu_runtime, probe.path, GenerateRequest(
            prompt="a lighthouse", width=64, height=64, control_net=str(net), control_image=str(control)),
            tmp_path / "no.png")
    assert not (tmp_path / "no.png").exists()


def test_a_controlnet_with_linear_projections_is_refused_before_it_crashes_the_worker(cpu_runtime, tmp_path, monkeypatch):
    # SD 2.x ControlNets are trained with linear transformer projections (copied from SD 2.x's UNet). The
    # runtime's ControlNet looks for the file's proj_out among the *model's* tensor names (src/control.hpp
    # ControlNet passes the model's tensor map to SpatialTransformer::init_params), never finds it and builds
    # 1x1 convolutions: measured here, "tensor 'input_blocks.1.1.proj_in.weight' has wrong shape in model
    # file: got [320, 320, 1, 1], expected [1, 1, 320, 320]", then the worker died of SIGSEGV, reported as
    # the model failing to load. Refused before any worker starts, naming the ControlNet and the reason.
    probe = ensure_family_probe("sd2", 7, tmp_path / "cache", keep=True)
    net = write_controlnet(tmp_path / "depth-sd21.safetensors", context=1024, linear=True)
    control = write_png_image(tmp_path / "depth.png", 64, 64, seed=4)
    monkeypatch.setattr(generation, "Supervisor", lambda *a, **k: pytest.fail("a worker was started"))
    with pytest.raises(InvalidRequestError, match="--control-net") as info:
        generation.generate(cpu_runtime, probe.path, GenerateRequest(
            prompt="a lighthouse", width=64, height=64, control_net=str(net), control_image=str(control)),
            tmp_path / "no.png")
    assert "linear" in info.value.message and "src/control.hpp" in info.value.message
    assert not (tmp_path / "no.png").exists()
