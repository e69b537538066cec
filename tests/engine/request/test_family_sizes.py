"""Honest sizes (issue 44): a size the model's family cannot make exactly is refused before any worker
starts, with the nearest sizes it can make; the PNG, the result and its parameters always agree.

stable-diffusion.cpp aligns every size up to its family's multiple (src/stable-diffusion.cpp
align_image_size: VAE scale x diffusion down factor, 64 for the UNets), with only a log warning: an
SD 1.x model asked for 96x72 wrote 128x128 while the result and the PNG's Size: said 96x72.
"""
from __future__ import annotations

import pytest
from component_files import write_controlnet, write_png_image

from accelstack.engine.errors import InvalidRequestError
from accelstack.engine.models.settings import family_settings, settings_for
from accelstack.engine.request.check import check_generation
from accelstack.engine.request.sizes import nearest_sizes
from accelstack.engine.runtime import TORCH
from accelstack.engine.worker.protocol import GenerateRequest

from cli_helpers import json_lines
from engine_helpers import cli_env, run_cli


def _request(**kw) -> GenerateRequest:
    return GenerateRequest(prompt="a lighthouse", steps=1, seed=5, **kw)


def test_the_size_rule_is_data_with_its_source():
    rules = family_settings()
    assert {f: rules[f].size_multiple for f in ("sd1", "sd2", "sdxl", "flux", "flux2", "sd3")} == {
        "sd1": 64, "sd2": 64, "sdxl": 64, "flux": 8, "flux2": 16, "sd3": 8}
    assert all("align_image_size" in r.size_source for r in rules.values())
    assert settings_for("no-such-family").size_multiple == 8


def test_nearest_sizes_are_multiples_nearest_first():
    assert nearest_sizes(96, 72, 64)[:2] == [(64, 64), (128, 64)]
    assert all(w % 64 == 0 and h % 64 == 0 and w >= 64 and h >= 64 for w, h in nearest_sizes(96, 72, 64))
    assert max(w for w, _h in nearest_sizes(4088, 64, 64)) == 4096  # never past the largest side


def test_sd1_at_96x72_is_refused_with_the_nearest_sizes(probe_model, tmp_path):
    with pytest.raises(InvalidRequestError) as err:
        check_generation(_request(width=96, height=72), probe_model.path, tmp_path / "o.png")
    msg = err.value.message
    assert "--width and --height" in msg and "96x72" in msg and "multiples of 64" in msg, msg
    assert "64x64" in msg and "128x64" in msg and "Stable Diffusion 1.x" in msg, msg
    assert "--width 64 --height 64" in (err.value.hint or "")
    with pytest.raises(InvalidRequestError, match="--height: .*128x72"):
        check_generation(_request(width=128, height=72), probe_model.path, tmp_path / "o.png")
    assert check_generation(_request(width=128, height=64), probe_model.path, tmp_path / "o.png")
    assert not (tmp_path / "o.png").exists()


def test_the_diffusers_stack_keeps_multiples_of_8(probe_model, tmp_path):
    # diffusers pipelines make any multiple of 8 exactly: the rule is stable-diffusion.cpp's
    assert check_generation(_request(width=96, height=72), probe_model.path, tmp_path / "o.png", traits=TORCH)


def test_a_dit_family_takes_multiples_of_8(tmp_path):
    from accelstack.engine.probes.family_files import ensure_family_probe

    flux = ensure_family_probe("flux", 1234, tmp_path / "cache", keep=True)
    assert check_generation(_request(width=96, height=72), flux.path, tmp_path / "o.png").components.family == "flux"


def test_an_init_image_the_family_cannot_make_names_the_image(probe_model, tmp_path):
    # img2img from a 96x64 image wrote 128x64
    init = write_png_image(tmp_path / "photo.png", 96, 64)
    with pytest.raises(InvalidRequestError) as err:
        check_generation(_request(width=96, height=64, init_image=str(init)), probe_model.path, tmp_path / "o.png")
    assert err.value.message.startswith(f"--init-image {init}"), err.value.message
    assert "128x64" in err.value.message and "resize the image" in (err.value.hint or "")


def test_the_cli_refuses_with_exit_2_and_one_json_line(probe_model, cache_with_probe, tmp_path):
    env = cli_env(cache_with_probe, tmp_path)
    r = run_cli(["generate", "-m", probe_model.path, "-p", "cat", "-W", "96", "-H", "72", "-o", tmp_path / "o.png",
                 "--json"], env)
    assert r.returncode == 2, (r.stdout, r.stderr)
    final = json_lines(r.stdout)[-1]
    assert final["error"] == "InvalidRequestError" and "--width" in final["message"] and "64x64" in final["message"]
    assert not (tmp_path / "o.png").exists()


def test_a_control_image_sets_the_size_as_an_init_image_does(probe_model, tmp_path):
    # the README's ControlNet example gives no --width/--height: the 64x64 edges image is the size
    from accelstack.cli import build_parser
    from accelstack.commands.generate import prepare

    edges = write_png_image(tmp_path / "edges.png", 64, 64)
    net = write_controlnet(tmp_path / "control_canny.safetensors")
    args = build_parser().parse_args(["generate", "-m", probe_model.path, "--control-net", str(net), "--control-image",
                                      str(edges), "-p", "a house", "-o", str(tmp_path / "house.png")])
    request, _options = prepare(args)
    assert (request.width, request.height) == (64, 64)


def test_the_png_the_result_and_its_parameters_agree_on_a_non_square_size(cpu_runtime, probe_model, cache_with_probe,
                                                                         tmp_path):
    # the real runtime: what the check lets through is made exactly (128x64 is a multiple of 64)
    from accelstack.engine.png import read_png

    env = cli_env(cache_with_probe, tmp_path)
    r = run_cli(["generate", "--runtime", cpu_runtime.path, "-m", probe_model.path, "-p", "cat", "-W", "128", "-H", "64",
                 "--steps", "1", "-o", tmp_path / "o.png", "--json"], env)
    assert r.returncode == 0, r.stderr
    result = json_lines(r.stdout)[-1]["result"]
    png = read_png(tmp_path / "o.png")
    assert (png.width, png.height) == (result["width"], result["height"]) == (128, 64)
    assert "Size: 128x64" in png.text["parameters"]
