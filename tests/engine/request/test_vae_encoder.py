"""Issue 44 "Bad input": img2img, an edit's reference image or an inpaint with a VAE that holds only its decoder is
refused before the model loads, naming the flag and the VAE. stable-diffusion.cpp VAE-encodes the init and reference
images (src/stable-diffusion.cpp encode_first_stage), builds the encoder for it and fails the load of a decode-only
file ("first_stage_model.encoder.norm_out.bias not in model file", measured with the reduced Flux probe's VAE)."""
from __future__ import annotations

import pytest
from component_files import split_probe, write_png_image, write_taesd

from accelstack.engine.errors import InvalidRequestError
from accelstack.engine.request.check import check_generation
from accelstack.engine.worker.protocol import GenerateRequest

from cli_helpers import json_lines
from engine_helpers import cli_env, run_cli

FILES = {"flux1-dev.safetensors": "model.diffusion_model.", "ae.safetensors": "vae.",
         "clip_l.safetensors": "text_encoders.clip_l.transformer."}


@pytest.fixture(scope="module")
def flux(tmp_path_factory):
    return split_probe("flux", tmp_path_factory.mktemp("fluxvae"), FILES)


def _check(model, tmp_path, **kw):
    return check_generation(GenerateRequest(prompt="make it blue", width=64, height=64, steps=1, seed=5, **kw), model,
                            tmp_path / "o.png")


def test_an_init_image_with_a_decode_only_vae_is_refused(flux, tmp_path):
    whole, parts = flux
    init = write_png_image(tmp_path / "init.png", 64, 64)
    with pytest.raises(InvalidRequestError, match="--init-image: the VAE .*holds only its decoder") as err:
        _check(whole, tmp_path, init_image=str(init))
    assert "encoder" in (err.value.hint or "")
    with pytest.raises(InvalidRequestError, match=r"--init-image: the VAE \(--vae ae.safetensors\) holds only its decoder"):
        _check(None, tmp_path, init_image=str(init), diffusion_model=str(parts / "flux1-dev.safetensors"),
               vae=str(parts / "ae.safetensors"), clip_l=str(parts / "clip_l.safetensors"))


def test_a_reference_image_with_a_decode_only_vae_is_refused(flux, tmp_path):
    ref = write_png_image(tmp_path / "ref.png", 64, 64)
    with pytest.raises(InvalidRequestError, match="--ref-image: the VAE .*holds only its decoder"):
        _check(flux[0], tmp_path, ref_images=[str(ref)])


def test_a_vae_with_its_encoder_is_accepted(probe_model, tmp_path):
    init, mask = write_png_image(tmp_path / "init.png", 64, 64), write_png_image(tmp_path / "mask.png", 64, 64)
    assert _check(probe_model.path, tmp_path, init_image=str(init), mask_image=str(mask)).components.mask_rgb


def test_a_decode_only_taesd_is_refused_for_img2img(probe_model, tmp_path):
    # with --taesd the tiny autoencoder encodes as well as decodes (src/stable-diffusion.cpp use_tiny_autoencoder)
    taesd = write_taesd(tmp_path / "taesd.safetensors")
    init = write_png_image(tmp_path / "init.png", 64, 64)
    with pytest.raises(InvalidRequestError, match=r"--init-image: the tiny autoencoder \(--taesd taesd.safetensors\) "
                                                  "holds only its decoder"):
        _check(probe_model.path, tmp_path, init_image=str(init), taesd=str(taesd))
    assert _check(probe_model.path, tmp_path, taesd=str(taesd))  # text-to-image decodes only


def test_the_cli_refuses_with_exit_2_and_one_json_line(flux, cpu_runtime, cache_with_probe, tmp_path):
    env = cli_env(cache_with_probe, tmp_path)
    init = write_png_image(tmp_path / "init.png", 64, 64)
    r = run_cli(["generate", "--runtime", cpu_runtime.path, "-m", flux[0], "-p", "cat", "--init-image", init, "-o", tmp_path / "o.png", "--json"], env)
    assert r.returncode == 2, (r.stdout, r.stderr)
    final = json_lines(r.stdout)[-1]
    assert final["error"] == "InvalidRequestError" and "holds only its decoder" in final["message"]
    assert not (tmp_path / "o.png").exists()
