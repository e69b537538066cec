"""Issue 44: a FLUX.2 probe joins ``verify --family`` and ``generate`` runs FLUX.2 from separate files with ``--llm``.

The probe is FLUX.2 [klein] reduced (:mod:`accelstack.engine.probes.flux2`): inspect and stable-diffusion.cpp
("Version: Flux.2 klein") both call it that; the real CPU runtime generates a non-constant image with it,
whole and as a diffusion model + LLM + VAE given one by one, as users have FLUX.2.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from component_files import split_probe
from model_specs import write_safetensors

from accelstack.engine.models.inspection import inspect_model
from accelstack.engine.png import read_png
from accelstack.engine.probes.families import FAMILIES, probe_families_of
from accelstack.engine.probes.family_files import ensure_family_probe
from accelstack.engine.probes.flux2 import flux2_dit_tensors

from cli_helpers import result_of
from engine_helpers import cli_env, run_cli

SPLIT = {"flux-2-klein-4b.safetensors": "model.diffusion_model.", "qwen_3_4b.safetensors": "text_encoders.llm.",
         "flux2_ae.safetensors": "vae."}


def test_the_flux2_probe_is_flux2_klein_for_inspect(tmp_path):
    probe = ensure_family_probe("flux2", 7, tmp_path, keep=True)
    found = inspect_model(probe.model)
    assert (found.family, found.variant, found.role) == ("flux2", "klein", "checkpoint"), found.evidence
    assert {p.kind for p in found.parts} == {"flux2", "flux2-vae", "qwen3-4b"}
    assert [c.kind for c in found.needs] == [], "its Qwen3 is what [klein] takes: nothing more is needed"
    assert [(m.family, m.probe) for m in probe_families_of([probe.model])] == [("flux2", "flux2")]
    assert 490_000_000 < probe.parameters < 500_000_000  # the 152k x 2560 embedding is most of it


@pytest.mark.parametrize("dev, needs", [(False, ["qwen3-4b"]), (True, ["mistral-small-3.2"])])
def test_a_flux2_diffusion_model_needs_its_own_variant_s_llm(dev, needs, tmp_path):
    """``model inspect`` and ``generate`` agree: [klein] takes Qwen3, [dev] Mistral (src/conditioner.hpp
    LLMEmbedder), never the other variant's LLM (inspect named the family's union)."""
    spec = {n: (s, "F16") for n, s in flux2_dit_tensors(5120 if dev else 2560, dev=dev).items()}
    found = inspect_model(str(write_safetensors(tmp_path / "flux2.safetensors", spec)))
    assert (found.family, found.variant) == ("flux2", "dev" if dev else "klein")
    assert [c.kind for c in found.needs] == ["flux2-vae", *needs]


def test_the_dev_layout_is_told_apart_by_its_48th_single_block():
    """src/model.cpp get_sd_version: single_blocks.47 makes FLUX.2 [dev]; guidance_in its guidance embedding."""
    dev, klein = flux2_dit_tensors(5120, dev=True), flux2_dit_tensors(2560)
    assert "single_blocks.47.linear1.weight" in dev and "guidance_in.in_layer.weight" in dev
    assert "single_blocks.1.linear1.weight" not in klein and "guidance_in.in_layer.weight" not in klein
    assert not [n for n in dev if n.endswith(".bias")], "FLUX.2 has no biases (disable_bias)"


def test_verify_family_flux2_passes_on_the_cpu_runtime(cpu_runtime, tmp_path):
    res = run_cli(["verify", "--runtime", cpu_runtime.path, "--family", "flux2", "--json"],
                  cli_env(tmp_path / "cache", tmp_path), timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    report = result_of(res.stdout)
    assert report["verdict"] == "PASS"
    family = next(c for c in report["checks"] if c["name"] == "flux2:family")
    assert f"as {FAMILIES['flux2'].sdcpp_version} " in family["detail"]
    img = read_png(tmp_path / "cache" / "verify" / "verify-cpu-flux2.png")
    assert (img.width, img.height) == (64, 64) and len(set(img.pixels)) > 16
    one = report["details"]["families"]["flux2"]
    print(f"verify --family flux2: load {one['load_seconds']} s, generate {one['generate_seconds']} s")  # (-s)


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> Path:
    return split_probe("flux2", tmp_path_factory.mktemp("flux2"), SPLIT)[1]


def test_generate_runs_flux2_klein_from_its_three_files(cpu_runtime, cache_with_probe, parts, tmp_path):
    out = tmp_path / "klein.png"
    res = run_cli(["generate", "--runtime", cpu_runtime.path, "--diffusion-model", parts / "flux-2-klein-4b.safetensors",
                   "--llm", parts / "qwen_3_4b.safetensors", "--vae", parts / "flux2_ae.safetensors", "-p", "a lighthouse",
                   "-W", "64", "-H", "64", "--steps", "2", "--seed", "5", "--threads", "2", "-o", out, "--json"],
                  cli_env(cache_with_probe, tmp_path), timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    result = result_of(res.stdout)
    img = read_png(out)
    assert (img.width, img.height) == (64, 64) and len(set(img.pixels)) > 16
    assert result["width"] == 64 and "flux2" in res.stdout


SETTINGS = ["-W", "64", "-H", "64", "--steps", "2", "--cfg-scale", "1", "--guidance", "4"]


def test_flux2_with_llm_gives_sd_cli_s_pixels(cpu_runtime, cache_with_probe, parts, tmp_path, ggml_cpu_build):
    """Issue 44's pixel identity: the same three files through stable-diffusion.cpp's own sd-cli (built from
    the runtime's source with its CMake options; skipped with the reason where that build is absent) and
    through ``accelstack generate`` give the same pixels."""
    from sd_cli_helpers import sd_cli as find_sd_cli  # the one sd-cli lookup (tests/engine)

    sd_cli = find_sd_cli(ggml_cpu_build)
    files = ["--diffusion-model", parts / "flux-2-klein-4b.safetensors", "--vae", parts / "flux2_ae.safetensors",
             "--llm", parts / "qwen_3_4b.safetensors"]
    cli = subprocess.run([sd_cli, *files, "-p", "a lighthouse", *SETTINGS, "-s", "5", "--sampling-method", "euler",
                          "--scheduler", "discrete", "-t", "2", "-o", tmp_path / "sdcli.png"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    assert cli.returncode == 0, cli.stdout[-3000:]
    assert "Flux.2 klein" in cli.stdout
    ours = run_cli(["generate", "--runtime", cpu_runtime.path, *files, "-p", "a lighthouse", *SETTINGS, "--seed", "5",
                    "--sampler", "euler", "--scheduler", "discrete", "--threads", "2", "--no-flash-attention",
                    "-o", tmp_path / "ours.png"], cli_env(cache_with_probe, tmp_path), timeout=900)
    assert ours.returncode == 0, ours.stderr
    theirs = read_png(tmp_path / "sdcli.png")
    assert len(set(theirs.pixels)) > 16
    assert read_png(tmp_path / "ours.png").rgb() == theirs.rgb()
