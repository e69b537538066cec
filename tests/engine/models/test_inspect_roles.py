"""Issue 44: `model inspect` knows the files `generate` takes beside a model. A LoRA was "unknown family" with a
dump of tensor names and an SD 1.x ControlNet "an SD 1.x diffusion model that still needs a VAE and CLIP-L",
which sent a user the wrong way, while generate itself told them apart. Each is named with its family and the
figures that matter (a LoRA's kind, rank and modules, an embedding's width and vectors), in text and --json."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from companion_files import dit_lora, embedding, flux_block_lora, kohya_lora, write_safetensors  # noqa: E402
from component_files import write_controlnet, write_taesd  # noqa: E402

from accelstack import schemas
from accelstack.engine.models.inspection import inspect_model

from engine_helpers import cli_env, run_cli  # noqa: E402


def _loha(path: Path) -> Path:
    rng = np.random.default_rng(1)
    key = "lora_unet_double_blocks_0_img_attn_qkv"
    return write_safetensors(path, {f"{key}.hada_w1_a": rng.normal(0, 1, (384, 8)), f"{key}.hada_w1_b": rng.normal(0, 1, (8, 128)),
                                    f"{key}.hada_w2_a": rng.normal(0, 1, (384, 8)), f"{key}.hada_w2_b": rng.normal(0, 1, (8, 128)),
                                    f"{key}.alpha": np.array(8.0)})


def _upscaler(path: Path) -> Path:
    tensors = {"conv_first.weight": np.zeros((8, 3, 3, 3)), "conv_body.weight": np.zeros((8, 8, 3, 3)),
               "conv_up1.weight": np.zeros((8, 8, 3, 3)), "conv_up2.weight": np.zeros((8, 8, 3, 3)),
               "conv_hr.weight": np.zeros((8, 8, 3, 3)), "conv_last.weight": np.zeros((3, 8, 3, 3))}
    tensors.update({f"body.0.rdb{i}.conv{j}.weight": np.zeros((4, 8, 3, 3)) for i in (1, 2, 3) for j in (1, 2)})
    return write_safetensors(path, tensors)


def _sd1_cross_lora(path: Path) -> Path:
    rng = np.random.default_rng(2)
    key = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn2_to_k"
    return write_safetensors(path, {f"{key}.lora_down.weight": rng.normal(0, 1, (16, 768)),
                                    f"{key}.lora_up.weight": rng.normal(0, 1, (320, 16))})


# file name -> (writer, role, family, details that must hold, words of the text report)
CASES = {
    "flux-kohya.safetensors": (lambda p: flux_block_lora(p, 3), "lora", "flux", {"kind": "LoRA", "rank": 4, "modules": 2},
                               ("a LoRA for FLUX.1", "rank 4", "2 modules", "--lora-dir")),
    "flux-peft.safetensors": (lambda p: dit_lora(p, {"transformer_blocks.0.attn.to_q": (128, 128),
                                                     "single_transformer_blocks.0.proj_out": (128, 640)}, "diffusers", 4),
                              "lora", "flux", {"kind": "LoRA", "rank": 4, "modules": 2}, ("a LoRA for FLUX.1",)),
    "flux-loha.safetensors": (_loha, "lora", "flux", {"kind": "LoHa", "rank": 8, "modules": 1}, ("a LoHa (LyCORIS) for",)),
    "sd1-style.safetensors": (kohya_lora, "lora", "sd1", {"kind": "LoRA", "rank": 4}, ("a LoRA for",)),
    "sd1-cross.safetensors": (_sd1_cross_lora, "lora", "sd1", {"kind": "LoRA", "rank": 16, "modules": 1}, ("rank 16",)),
    "control_sd15.safetensors": (write_controlnet, "controlnet", "sd1", {"kind": "ControlNet"},
                                 ("a ControlNet for", "--control-net")),
    "glowword.safetensors": (lambda p: embedding(p, rows=3), "embedding", "sd1", {"width": 768, "vectors": 3},
                             ("a textual-inversion embedding for", "3 vectors of 768 values", "--embeddings-dir")),
    "taesd.safetensors": (write_taesd, "vae", "none", {"kind": "TAESD", "width": 4}, ("a tiny autoencoder (TAESD) for 4-channel",)),
    "4x-esrgan.safetensors": (_upscaler, "upscaler", "none", {"kind": "ESRGAN", "scale": 4}, ("an ESRGAN upscaler (x4)",)),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("roles")
    for name, (writer, *_rest) in CASES.items():
        writer(folder / name)
    return folder


@pytest.mark.parametrize("name", list(CASES))
def test_each_file_generate_takes_beside_a_model_is_named_with_its_family(files, name):
    _writer, role, family, details, _words = CASES[name]
    r = inspect_model(files / name)
    assert (r.role, r.family) == (role, family), r.evidence
    assert r.details is not None and {k: getattr(r.details, k) for k in details} == details
    assert r.needs == []  # a ControlNet no longer "still needs a VAE and CLIP-L"


def test_the_cli_says_what_each_is_and_how_generate_takes_it(files, tmp_path):
    env = cli_env(tmp_path / "cache", tmp_path)
    out = run_cli(["model", "inspect", *(files / name for name in CASES)], env)
    assert out.returncode == 0, out.stderr
    reports = out.stdout.split("\n\n")
    for (name, (*_rest, words)), text in zip(CASES.items(), reports):
        assert text.startswith(name), text
        for word in words:
            assert word in text, text
        assert "unknown family" not in text and "still needs" not in text, text
    out = run_cli(["model", "inspect", "--json", *(files / name for name in CASES)], env)
    line = json.loads(out.stdout.strip().splitlines()[-1])
    jsonschema.validate(line["result"], schemas.load("model"))
    got = [(m["role"], m["family"], {k: m["details"][k] for k in d}) for m, (_w, _r, _f, d, _x) in
           zip(line["result"]["models"], CASES.values())]
    assert got == [(role, family, d) for _w, role, family, d, _words in CASES.values()]
