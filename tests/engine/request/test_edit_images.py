"""--ref-image (repeatable) and --mask (issue 44): checked like --init-image and against the model's family,
before any worker starts (a typed error naming the flag, exit 2), and passed to the engine as the bindings
take them (generate_image's ref_images and mask_image)."""
from __future__ import annotations

import os

import pytest
from component_files import write_png_image, write_vae

from accelstack.engine import generation
from accelstack.engine.errors import InvalidRequestError
from accelstack.engine.png import read_png
from accelstack.engine.request.check import check_generation
from accelstack.engine.runtime import TORCH
from accelstack.engine.worker.protocol import GenerateRequest

from cli_helpers import json_lines
from engine_helpers import cli_env, run_cli


@pytest.fixture(scope="module")
def flux(tmp_path_factory):
    from accelstack.engine.probes.family_files import ensure_family_probe

    return ensure_family_probe("flux", 1234, tmp_path_factory.mktemp("flux"), keep=True).path


def _check(model, tmp_path, **kw):
    return check_generation(GenerateRequest(prompt="make it blue", width=64, height=64, steps=1, seed=5, **kw), model,
                            tmp_path / "o.png")


def test_a_reference_image_for_an_edit_family_is_read(flux, tmp_path):
    ref = write_png_image(tmp_path / "ref.png", 64, 64)
    ref2 = write_png_image(tmp_path / "ref2.png", 64, 64, seed=3)
    vae = write_vae(tmp_path / "ae.safetensors")  # the probe's own VAE is decode-only (test_vae_encoder)
    checked = _check(flux, tmp_path, ref_images=[str(ref), str(ref2)], vae=str(vae))
    assert len(checked.components.ref_rgb) == 2 and len(checked.components.ref_rgb[0]) == 64 * 64 * 3


def test_a_reference_image_is_refused_for_a_family_that_reads_none(probe_model, tmp_path):
    ref = write_png_image(tmp_path / "ref.png", 64, 64)
    with pytest.raises(InvalidRequestError, match="--ref-image: the model's family, Stable Diffusion 1.x, reads no"):
        _check(probe_model.path, tmp_path, ref_images=[str(ref)])


@pytest.mark.parametrize("bad", ["size", "fifo", "loop", "missing", "folder"])
def test_a_bad_reference_image_names_the_flag(flux, tmp_path, bad):
    path = tmp_path / "ref.png"
    if bad == "size":
        write_png_image(path, 96, 64)
    elif bad == "fifo":
        os.mkfifo(path)
    elif bad == "loop":
        os.symlink(path, path)
    elif bad == "folder":
        path.mkdir()
    with pytest.raises(InvalidRequestError, match=f"--ref-image {path}"):
        _check(flux, tmp_path, ref_images=[str(path)])


def test_too_many_reference_images_are_refused():
    with pytest.raises(InvalidRequestError, match="--ref-image"):
        GenerateRequest(prompt="x", ref_images=["a.png"] * 9).validate()


def test_a_mask_needs_the_init_image_of_its_size(probe_model, tmp_path):
    init, mask = write_png_image(tmp_path / "init.png", 64, 64), write_png_image(tmp_path / "mask.png", 64, 64)
    with pytest.raises(InvalidRequestError, match="--mask"):
        _check(probe_model.path, tmp_path, mask_image=str(mask))
    big = write_png_image(tmp_path / "big.png", 128, 64)
    with pytest.raises(InvalidRequestError, match=f"--mask {big}: it is 128x64"):
        _check(probe_model.path, tmp_path, init_image=str(init), mask_image=str(big))
    assert len(_check(probe_model.path, tmp_path, init_image=str(init), mask_image=str(mask)).components.mask_rgb) \
        == 64 * 64 * 3


def test_the_diffusers_stack_refuses_them(probe_model, tmp_path):
    ref = write_png_image(tmp_path / "ref.png", 64, 64)
    with pytest.raises(InvalidRequestError, match="--ref-image: not supported on the diffusers stack"):
        check_generation(GenerateRequest(prompt="x", width=64, height=64, ref_images=[str(ref)]),
                         probe_model.path, tmp_path / "o.png", traits=TORCH)


def test_the_cli_refuses_with_exit_2_and_one_json_line(probe_model, cache_with_probe, tmp_path):
    env = cli_env(cache_with_probe, tmp_path)
    ref = write_png_image(tmp_path / "ref.png", 64, 64)
    r = run_cli(["generate", "-m", probe_model.path, "-p", "cat", "--ref-image", ref, "-o", tmp_path / "o.png",
                 "--json"], env)
    assert r.returncode == 2, (r.stdout, r.stderr)
    final = json_lines(r.stdout)[-1]
    assert final["error"] == "InvalidRequestError" and "--ref-image" in final["message"]
    assert not (tmp_path / "o.png").exists()


def test_an_inpaint_runs_for_real(cpu_runtime, probe_model, tmp_path):
    # (an edit's real run is not here: the reduced family probes hold no VAE encoder, which a reference image
    # needs: stable-diffusion.cpp fails their load, 'first_stage_model.encoder.norm_out.bias' not in model file)
    init, mask = write_png_image(tmp_path / "init.png", 64, 64), write_png_image(tmp_path / "mask.png", 64, 64, seed=1)
    request = GenerateRequest(prompt="a lighthouse", width=64, height=64, steps=1, seed=5, init_image=str(init),
                              strength=0.9)
    plain = generation.generate(cpu_runtime, probe_model.path, request, tmp_path / "plain.png")
    masked = generation.generate(cpu_runtime, probe_model.path, GenerateRequest(**{**request.__dict__, "mask_image": str(
        mask)}), tmp_path / "masked.png")
    assert plain.images and masked.images
    assert read_png(tmp_path / "masked.png").rgb() != read_png(tmp_path / "plain.png").rgb()  # the mask kept pixels
    assert "Mask: mask.png" in read_png(tmp_path / "masked.png").text["parameters"]
