"""FLUX.2 with --llm (issue 44): it was refused ("flux2 has no llm text encoder") while the bundled
stable-diffusion.cpp requires one (src/conditioner.hpp LLMEmbedder: Mistral Small 3.2 for FLUX.2 [dev],
Qwen3 for [klein]). Checked before any worker starts, on header-correct sparse files (no disk used)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from accelstack.engine.errors import InvalidRequestError
from accelstack.engine.probes.weights import safetensors_header
from accelstack.engine.request.check import check_generation
from accelstack.engine.worker.protocol import GenerateRequest

from cli_helpers import json_lines
from engine_helpers import cli_env, run_cli


def _sparse(path: Path, named) -> str:
    head = safetensors_header(named, {}, "F16")
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(len(head) + sum(2 * math.prod(s) for s in named.values()))
    return str(path)


@pytest.fixture
def files(tmp_path):
    dm = {"double_stream_modulation_img.lin.weight": (64, 32), "double_blocks.0.img_attn.qkv.weight": (96, 32),
          "img_in.weight": (32, 128)}
    return {
        "dev": _sparse(tmp_path / "flux2-dev.safetensors", {**dm, "single_blocks.47.linear1.weight": (64, 32)}),
        "klein": _sparse(tmp_path / "flux-2-klein-4b.safetensors", dm),
        "vae": _sparse(tmp_path / "flux2_ae.safetensors", {"decoder.conv_in.weight": (512, 32, 3, 3)}),
        "mistral": _sparse(tmp_path / "mistral.safetensors", {"model.embed_tokens.weight": (64, 5120)}),
        "qwen3": _sparse(tmp_path / "qwen_3_4b.safetensors", {"model.embed_tokens.weight": (64, 2560)}),
    }


def _check(tmp_path, dm, **kw):
    request = GenerateRequest(prompt="a cat", width=64, height=64, diffusion_model=dm, **kw)
    return check_generation(request, None, tmp_path / "o.png")


def test_flux2_dev_takes_mistral_as_its_llm(files, tmp_path):
    checked = _check(tmp_path, files["dev"], vae=files["vae"], llm=files["mistral"])
    assert checked.components.family == "flux2" and checked.components.paths["llm"] == files["mistral"]
    assert checked.warnings == []
    assert (checked.request.cfg_scale, checked.request.guidance) == (1.0, 4.0)  # docs/flux2.md


def test_flux2_klein_takes_qwen3(files, tmp_path):
    assert _check(tmp_path, files["klein"], vae=files["vae"], llm=files["qwen3"]).warnings == []


def test_flux2_without_its_llm_is_refused_naming_the_usual_file(files, tmp_path):
    with pytest.raises(InvalidRequestError, match="FLUX.2 \\[dev\\] needs its LLM") as err:
        _check(tmp_path, files["dev"], vae=files["vae"])
    assert "--llm Mistral-Small-3.2-24B-Instruct-2506-Q4_K_M.gguf" in (err.value.hint or "")


def test_another_variants_llm_is_refused(files, tmp_path):
    with pytest.raises(InvalidRequestError, match="--llm .*qwen3-4b.*FLUX.2 \\[dev\\] runs mistral-small-3.2"):
        _check(tmp_path, files["dev"], vae=files["vae"], llm=files["qwen3"])


def test_flux2_sizes_are_multiples_of_16(files, tmp_path):
    with pytest.raises(InvalidRequestError, match="multiples of 16"):
        check_generation(GenerateRequest(prompt="a cat", width=72, height=64, diffusion_model=files["dev"],
                                         vae=files["vae"], llm=files["mistral"]), None, tmp_path / "o.png")


def test_the_cli_refuses_flux2_without_llm_with_exit_2(files, tmp_path, cache_with_probe):
    env = cli_env(cache_with_probe, tmp_path)
    r = run_cli(["generate", "--diffusion-model", files["dev"], "--vae", files["vae"], "-p", "a cat", "-W", "64",
                 "-H", "64", "-o", tmp_path / "o.png", "--json"], env)
    assert r.returncode == 2, (r.stdout, r.stderr)
    final = json_lines(r.stdout)[-1]
    assert final["error"] == "InvalidRequestError" and "needs its LLM" in final["message"]
