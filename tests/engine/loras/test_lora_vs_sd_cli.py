"""Issue 44 "Tests and measurements": Flux split files (--diffusion-model, --vae, --clip-l) and a LoRA in each
naming, through stable-diffusion.cpp's own sd-cli (built from the same source by benchmarks/bench_engine.py,
with the runtime's CMake options) and through `accelstack generate`: identical pixels. sd-cli is taken from the
build cache when bench_engine built it there; this test never starts that 20-minute build (skipped instead)."""
from __future__ import annotations

import subprocess

import pytest
from companion_files import write_safetensors  # noqa: E402
from component_files import split_probe  # noqa: E402
from sd_cli_helpers import sd_cli  # noqa: E402
from test_lora_layouts import FILES, NAMINGS  # noqa: E402

from accelstack.engine.png import read_png

from engine_helpers import cli_env, run_cli  # noqa: E402


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    return split_probe("flux", tmp_path_factory.mktemp("fluxcli"), FILES)[1]


SETTINGS = ["-W", "64", "-H", "64", "--steps", "2", "--cfg-scale", "1", "--guidance", "3.5"]


@pytest.mark.parametrize("naming", ["none", *sorted(NAMINGS)])
def test_split_flux_with_a_lora_gives_sd_cli_s_pixels(cpu_runtime, cache_with_probe, parts, naming, tmp_path,
                                                       ggml_cpu_build):
    exe = sd_cli(ggml_cpu_build)
    loras = tmp_path / "loras"
    loras.mkdir()
    prompt = "a lighthouse"
    if naming != "none":
        write_safetensors(loras / "style.safetensors", NAMINGS[naming][0])
        prompt += " <lora:style:0.8>"
    files = ["--diffusion-model", parts / "flux1-dev.safetensors", "--vae", parts / "ae.safetensors"]
    cli = subprocess.run([exe, *files, "--clip_l", parts / "clip_l.safetensors", "--lora-model-dir", loras, "-p", prompt,
                          *SETTINGS, "-s", "5", "--sampling-method", "euler", "--scheduler", "discrete", "-t", "2",
                          "-o", tmp_path / "sdcli.png"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=600)
    assert cli.returncode == 0, cli.stdout[-3000:]
    env = cli_env(cache_with_probe, tmp_path)
    ours = run_cli(["generate", "--runtime", cpu_runtime.path, *files, "--clip-l", parts / "clip_l.safetensors",
                    "--lora-dir", loras, "-p", prompt, *[a for a in SETTINGS if not a.startswith("--guid") and a != "3.5"],
                    "--seed", "5", "--sampler", "euler", "--scheduler", "discrete", "--threads", "2",
                    "--no-flash-attention", "-o", tmp_path / "ours.png"], env, timeout=600)
    assert ours.returncode == 0, ours.stderr
    assert read_png(tmp_path / "ours.png").rgb() == read_png(tmp_path / "sdcli.png").rgb()
    if naming != "none":
        applied, total = NAMINGS[naming][1], len(NAMINGS[naming][0])
        logged = f"({applied} / {total}) LoRA tensors have been applied"
        assert logged in cli.stdout, [line for line in cli.stdout.splitlines() if "LoRA tensors" in line]
        assert f"style ×0.8: {applied} of {total} tensors" in ours.stdout
