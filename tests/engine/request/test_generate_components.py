"""Issue 26: generate with separate components (--vae, --clip-l, --diffusion-model...), img2img
(--init-image, --strength) and ControlNet (--control-net, --control-image, --control-strength), on the
real CPU runtime with the SD 1.x probe; every refusal a typed error before the worker starts."""
from __future__ import annotations

import dataclasses
import json
import os
import struct
import time
import zlib
from pathlib import Path
from typing import Dict, Tuple

import pytest
from component_files import (  # noqa: E402
    SDXL_CONTROL,
    controlnet_shapes,
    extract_part,
    split_probe,
    standalone_vae,
    write_controlnet,
    write_png_image,
)

from accelstack.engine import generation
from accelstack.engine.errors import InvalidRequestError, ModelLoadError
from accelstack.engine.models.check import check_model
from accelstack.engine.png import SIGNATURE, read_png
from accelstack.engine.probes.architecture import sd1_tensors
from accelstack.engine.probes.weights import safetensors_header
from accelstack.engine.request.components import check_components
from accelstack.engine.runtime import Runtime
from accelstack.engine.worker.protocol import GenerateRequest

from cli_helpers import json_lines  # validates each line against the shipped schemas
from engine_helpers import cli_env, run_cli  # noqa: E402


def test_a_safetensors_file_whose_header_length_starts_with_0x80_is_not_taken_for_a_pickle(tmp_path):
    # The 8-byte header length is little-endian: 1 header in 256 has 0x80 as its first byte, the
    # magic of a legacy torch pickle (found with a synthesized ControlNet, whose header is 0x7380 bytes).
    header = {"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}}
    raw = json.dumps(header).encode()
    raw += b" " * (0x80 - len(raw))
    path = tmp_path / "net.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\x00" * 4)
    assert path.read_bytes()[0] == 0x80
    info = check_model(path)
    assert (info.kind, info.tensors) == ("safetensors", 1)


# -- shared pieces ------------------------------------------------------------------------------------
F8_HALF = 0x38  # 0.5 in F8_E5M2 (the top byte of float16 0x3800), the probe's storage type


def fast(prompt: str = "a lighthouse", **kw) -> GenerateRequest:
    return GenerateRequest(prompt=prompt, width=64, height=64, steps=1, seed=5, **kw)


def sparse_safetensors(path: Path, tensors: Dict[str, Tuple[int, ...]], prefix: str = "") -> Path:
    """A header-correct safetensors file whose data is a hole (no disk used): enough for every
    check made before a worker starts, which read headers only."""
    named = {prefix + k: v for k, v in tensors.items()}
    head = safetensors_header(named, {}, "F16")
    total = sum(2 * _count(shape) for shape in named.values())
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(len(head) + total)
    return path


def _count(shape: Tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def shifted_vae(probe_path: str, out: Path) -> Path:
    """The probe's VAE with its last decoder bias set to 0.5: a VAE whose images differ."""
    standalone_vae(probe_path, out)
    raw = out.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    a, b = json.loads(raw[8:8 + n])["decoder.conv_out.bias"]["data_offsets"]
    data = bytearray(raw)
    data[8 + n + a:8 + n + b] = bytes([F8_HALF]) * (b - a)
    out.write_bytes(bytes(data))
    return out


@pytest.fixture(scope="module")
def parts(probe_model, module_tmp):
    """The probe's VAE (its own bytes, and a shifted one), its CLIP-L, and 64x64 PNG images."""
    folder = module_tmp / "components"
    folder.mkdir()
    standalone_vae(probe_model.path, folder / "vae.safetensors")
    shifted_vae(probe_model.path, folder / "vae-shifted.safetensors")
    standalone_vae(probe_model.path, folder / "clip_l.safetensors", prefix="te.")
    write_png_image(folder / "init.png", 64, 64, seed=3)
    write_png_image(folder / "control.png", 64, 64, seed=1)
    write_png_image(folder / "big.png", 128, 64)
    return folder


@pytest.fixture(scope="module")
def plain(cpu_runtime, probe_model, module_tmp) -> bytes:
    """The txt2img image of :func:`fast` (the reference every other run is compared with)."""
    out = module_tmp / "plain.png"
    generation.generate(cpu_runtime, probe_model.path, fast(), out)
    return read_png(out).rgb()


@pytest.fixture
def no_worker(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a worker was started")
    monkeypatch.setattr(generation, "Supervisor", refuse)


def _generate(cpu_runtime, model, tmp_path, request: GenerateRequest, name: str = "out"):
    out = tmp_path / f"{name}.png"
    report = generation.generate(cpu_runtime, model, request, out)
    png = read_png(out)
    return png.rgb(), png.text["parameters"], report


# -- for real on the CPU build ------------------------------------------------------------------------
def test_a_separate_vae_and_clip_l_are_loaded_used_and_named(cpu_runtime, probe_model, parts, plain, tmp_path):
    shifted, text, report = _generate(cpu_runtime, probe_model.path, tmp_path, fast(
        vae=str(parts / "vae-shifted.safetensors"), clip_l=str(parts / "clip_l.safetensors")))
    assert shifted != plain  # the VAE given decodes (its last bias differs from the checkpoint's own)
    assert report.components == {"vae": "vae-shifted.safetensors", "clip_l": "clip_l.safetensors"}
    assert "VAE: vae-shifted.safetensors" in text and "Text encoders: clip_l.safetensors" in text
    assert str(parts) not in text  # file names only, never paths
    same, _text, _ = _generate(cpu_runtime, probe_model.path, tmp_path, fast(vae=str(parts / "vae.safetensors")), "same")
    assert same == plain  # the checkpoint's own VAE bytes as a file of their own: the same image


def test_img2img_starts_from_the_init_image(cpu_runtime, probe_model, parts, plain, tmp_path):
    pixels, text, report = _generate(cpu_runtime, probe_model.path, tmp_path,
                                     fast(init_image=str(parts / "init.png"), strength=0.5))
    assert pixels != plain
    assert (report.init_image, report.strength) == ("init.png", 0.5)
    assert "Denoising strength: 0.5" in text


def test_a_controlnet_guides_the_image(cpu_runtime, probe_model, parts, plain, tmp_path):
    # stable-diffusion.cpp fixes an SD 1.x ControlNet's widths (src/control.hpp), so it is full size:
    # 361 M parameters, stored as F8_E5M2 like the probe (361 MB, written in about a second).
    net = write_controlnet(tmp_path / "canny-sd15.safetensors")
    pixels, text, report = _generate(cpu_runtime, probe_model.path, tmp_path, fast(
        control_net=str(net), control_image=str(parts / "control.png"), control_strength=0.9))
    assert pixels != plain
    assert report.components == {"control_net": "canny-sd15.safetensors"}
    assert (report.control_image, report.control_strength) == ("control.png", 0.9)
    assert "ControlNet: canny-sd15.safetensors 0.9" in text


# -- refusals before any worker starts ----------------------------------------------------------------
def _refused(cpu_runtime, probe_model, tmp_path, match: str, model=None, **kw) -> InvalidRequestError:
    model = probe_model.path if model is None else model
    with pytest.raises(InvalidRequestError, match=match) as info:
        generation.generate(cpu_runtime, model or None, fast(**kw), tmp_path / "no.png")
    assert not (tmp_path / "no.png").exists()
    return info.value


def test_text_encoders_the_family_does_not_take_are_refused(cpu_runtime, probe_model, parts, tmp_path, no_worker):
    clip = str(parts / "clip_l.safetensors")
    _refused(cpu_runtime, probe_model, tmp_path, "--clip-g .*family, sd1, has no clip-g", clip_g=clip)
    err = _refused(cpu_runtime, probe_model, tmp_path, "--t5xxl .*no t5xxl", t5xxl=clip)
    assert err.hint == "leave out --t5xxl"
    _refused(cpu_runtime, probe_model, tmp_path, "--llm .*no llm", llm=clip)


def test_an_llm_of_another_family_is_refused_before_it_reaches_the_runtime(tmp_path):
    # Both LLM kinds go to --llm, but each family conditions on its own (src/conditioner.hpp LLMEmbedder: Qwen3 4B,
    # 2560 wide, for Z-Image; Qwen2.5-VL 7B, 3584 wide, for Qwen-Image): the other one's width does not fit the
    # DiT's caption input. It was accepted (the flag takes either) and reached the runtime.
    import model_specs as m

    zimage = str(m.write_safetensors(tmp_path / "z_image_turbo_bf16.safetensors", m.z_image()))
    qwen = str(m.write_safetensors(tmp_path / "qwen_image_fp8.safetensors", m.qwen_image()))
    qwen3 = str(m.write_safetensors(tmp_path / "qwen_3_4b.safetensors", m.qwen3_4b()))
    vl = str(m.write_safetensors(tmp_path / "qwen_2.5_vl_7b.safetensors", {
        "model.embed_tokens.weight": ((152064, 3584), "BF16"), "model.layers.0.mlp.gate_proj.weight": ((18944, 3584), "BF16")}))
    request = dict(prompt="a lighthouse", width=64, height=64)
    for model, llm, other, takes in ((zimage, vl, "qwen2.5-vl-7b", "qwen3-4b"), (qwen, qwen3, "qwen3-4b", "qwen2.5-vl-7b")):
        with pytest.raises(InvalidRequestError, match=f"--llm .*it is a {other} text encoder.* takes {takes}"):
            check_components(GenerateRequest(**request, diffusion_model=model, llm=llm), None)
    ae = str(m.write_safetensors(tmp_path / "ae.safetensors", m.sd_vae("", 16)))  # Z-Image cannot run without its VAE
    check_components(GenerateRequest(**request, diffusion_model=zimage, llm=qwen3, vae=ae), None)  # its own: accepted


def test_a_file_of_the_wrong_kind_is_refused_naming_the_flag(cpu_runtime, probe_model, parts, tmp_path, no_worker):
    _refused(cpu_runtime, probe_model, tmp_path, "--vae .*clip_l.safetensors: it holds no VAE",
             vae=str(parts / "clip_l.safetensors"))
    _refused(cpu_runtime, probe_model, tmp_path, "--clip-l .*no text encoder", clip_l=str(parts / "vae.safetensors"))
    _refused(cpu_runtime, probe_model, tmp_path, "--diffusion-model .*holds no diffusion model", model="",
             diffusion_model=str(parts / "vae.safetensors"))


def test_a_unet_given_alone_is_refused_citing_the_version_detection(cpu_runtime, probe_model, parts, tmp_path,
                                                                    no_worker):
    # In diffusers names (the probe's) and in the original ones: stable-diffusion.cpp 0.4.7 finds the
    # version of neither when the UNet is a file of its own (tried with the bindings).
    diffusers = sparse_safetensors(tmp_path / "unet.safetensors", sd1_tensors()["unet"])
    original = sparse_safetensors(tmp_path / "ldm.safetensors", {
        "input_blocks.0.0.weight": (320, 4, 3, 3), "input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight": (320, 768),
        "middle_block.1.norm.weight": (1280,)})
    for unet in (diffusers, original):
        _refused(cpu_runtime, probe_model, tmp_path, "get_sd_version", model="", diffusion_model=str(unet),
                 clip_l=str(parts / "clip_l.safetensors"))


def test_exactly_one_of_model_and_diffusion_model(cpu_runtime, probe_model, parts, tmp_path, no_worker):
    _refused(cpu_runtime, probe_model, tmp_path, "both --model and --diffusion-model",
             diffusion_model=str(parts / "vae.safetensors"))
    _refused(cpu_runtime, probe_model, tmp_path, "no model is given", model="")


def test_controlnet_refusals(cpu_runtime, probe_model, parts, tmp_path, no_worker):
    control = str(parts / "control.png")
    sd2_net = sparse_safetensors(tmp_path / "sd2-net.safetensors", controlnet_shapes(1024), "control_model.")
    _refused(cpu_runtime, probe_model, tmp_path, "ControlNet for sd2, not for this sd1 model",
             control_net=str(sd2_net), control_image=control)
    _refused(cpu_runtime, probe_model, tmp_path, "is not a ControlNet", control_net=str(parts / "vae.safetensors"),
             control_image=control)
    _refused(cpu_runtime, probe_model, tmp_path, "without the image", control_net=str(sd2_net))
    _refused(cpu_runtime, probe_model, tmp_path, "without a ControlNet", control_image=control)


def test_a_controlnet_for_a_family_stable_diffusion_cpp_runs_none_for_is_refused(parts, tmp_path):
    net = sparse_safetensors(tmp_path / "net.safetensors", controlnet_shapes(768), "control_model.")
    flux = sparse_safetensors(tmp_path / "flux.safetensors", {
        "double_blocks.0.img_attn.qkv.weight": (64, 64), "single_blocks.0.linear1.weight": (64, 64),
        "img_in.weight": (64, 64), "txt_in.weight": (64, 64)})
    request = fast(diffusion_model=str(flux), control_net=str(net), control_image=str(parts / "control.png"))
    with pytest.raises(InvalidRequestError, match="family, flux, takes no ControlNet.*src/control.hpp"):
        check_components(request, None)


def test_an_init_image_of_another_size_is_refused(cpu_runtime, probe_model, parts, tmp_path, no_worker):
    err = _refused(cpu_runtime, probe_model, tmp_path, "--init-image .*128x64, the request 64x64",
                   init_image=str(parts / "big.png"))
    assert "--width 128 --height 64" in (err.hint or "")


@pytest.mark.parametrize("strength, control", [(-0.1, -0.1), (1.5, 2.5), (float("nan"), float("nan")), (True, "1")])
def test_strength_out_of_range_is_refused(strength, control):
    with pytest.raises(InvalidRequestError, match="--strength"):
        fast(strength=strength).validate()
    with pytest.raises(InvalidRequestError, match="--control-strength"):
        fast(control_strength=control).validate()


def test_components_and_images_are_refused_on_the_torch_stack(probe_model, parts, tmp_path, no_worker):
    torch_runtime = Runtime(path=tmp_path, backend="torch")
    for kw in ({"vae": str(parts / "vae.safetensors")}, {"init_image": str(parts / "init.png")}):
        with pytest.raises(InvalidRequestError, match="not supported on the .* stack"):
            generation.generate(torch_runtime, probe_model.path, fast(**kw), tmp_path / "no.png")


# -- hostile paths: typed errors, fast ----------------------------------------------------------------
def test_hostile_component_paths_are_typed_errors(cpu_runtime, probe_model, tmp_path, no_worker):
    passwd = tmp_path / "vae.safetensors"
    passwd.symlink_to("/etc/passwd")
    loop = tmp_path / "loop.safetensors"
    loop.symlink_to(loop)
    folder = tmp_path / "folder.safetensors"
    folder.mkdir()
    fifo = tmp_path / "fifo.safetensors"
    os.mkfifo(fifo)
    cases = [({"vae": str(passwd)}, "--vae .*unknown model format|--vae .*not"),
             ({"clip_l": str(loop)}, "--clip-l .*symbolic links"),
             ({"vae": str(folder)}, "--vae .*it is a folder"),
             ({"t5xxl": str(tmp_path / "missing.safetensors")}, "--t5xxl .*does not exist"),
             ({"taesd": str(fifo)}, "--taesd .*not a regular file")]
    for kw, match in cases:
        start = time.monotonic()
        _refused(cpu_runtime, probe_model, tmp_path, match, **kw)
        assert time.monotonic() - start < 10


def test_hostile_images_are_typed_errors(cpu_runtime, probe_model, tmp_path, no_worker):
    fifo = tmp_path / "init.png"
    os.mkfifo(fifo)  # opening it to read would block for ever
    huge = tmp_path / "huge.png"  # a 20000 x 20000 header over a little data: refused before inflating
    ihdr = struct.pack(">IIBBBBB", 20000, 20000, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 100000)
    huge.write_bytes(SIGNATURE + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b""))
    text = tmp_path / "text.png"
    text.write_text("not a png")
    for kw, match in (({"init_image": str(fifo)}, "--init-image .*not a regular file"),
                      ({"init_image": str(huge)}, "--init-image .*20000x20000"),
                      ({"init_image": str(text)}, "--init-image .*not a PNG"),
                      ({"init_image": str(tmp_path)}, "--init-image .*not a regular file|--init-image .*directory")):
        start = time.monotonic()
        _refused(cpu_runtime, probe_model, tmp_path, match, **kw)
        assert time.monotonic() - start < 10


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def test_a_damaged_model_given_with_components_is_still_a_model_error(cpu_runtime, parts, tmp_path, no_worker):
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}......")
    with pytest.raises(ModelLoadError):
        generation.generate(cpu_runtime, str(bad), fast(vae=str(parts / "vae.safetensors")), tmp_path / "no.png")


# -- the command line ---------------------------------------------------------------------------------
def test_the_cli_refuses_with_one_json_line_and_exit_2(cpu_runtime, probe_model, cache_with_probe, parts, tmp_path):
    env = cli_env(cache_with_probe, tmp_path)
    common = ["generate", "--runtime", cpu_runtime.path, "-W", "64", "-H", "64", "--steps", "1", "-p", "cat",
              "-o", tmp_path / "no.png", "--json"]
    model = ["-m", probe_model.path]
    for extra, code in (([*model, "--clip-g", parts / "clip_l.safetensors"], "invalid-request"),
                        ([*model, "--control-image", parts / "control.png"], "invalid-request"),
                        ([*model, "--init-image", parts / "big.png"], "invalid-request"),
                        ([*model, "--strength", "2"], "invalid-request"),
                        ([], "invalid-request")):
        r = run_cli([*common, *extra], env)
        assert r.returncode == 2, (extra, r.stdout, r.stderr)
        final = json_lines(r.stdout)[-1]
        assert final["ok"] is False and final["error"] == "InvalidRequestError" and final["code"] == code, final
    assert not (tmp_path / "no.png").exists()
    help_text = run_cli(["generate", "--help"], env).stdout
    for flag in ("--diffusion-model", "--vae", "--clip-l", "--clip-g", "--t5xxl", "--llm", "--taesd", "--init-image",
                 "--strength", "--control-net", "--control-image", "--control-strength"):
        assert flag in help_text


def test_the_cli_runs_img2img_with_a_vae_and_reports_them(cpu_runtime, probe_model, cache_with_probe, parts, tmp_path):
    env = cli_env(cache_with_probe, tmp_path)
    r = run_cli(["generate", "--runtime", cpu_runtime.path, "-m", probe_model.path, "-W", "64", "-H", "64", "--steps",
                 "1", "-p", "cat", "--vae", parts / "vae.safetensors", "--init-image", parts / "init.png", "--strength",
                 "0.4", "-o", tmp_path / "cli.png", "--json"], env)
    assert r.returncode == 0, r.stderr
    result = json_lines(r.stdout)[-1]["result"]  # every line checked against the shipped schemas
    assert result["components"] == {"vae": "vae.safetensors"}
    assert (result["init_image"], result["strength"]) == ("init.png", 0.4)
    assert "Denoising strength: 0.4" in read_png(tmp_path / "cli.png").text["parameters"]


# -- a DiT family from separate files: the Flux probe's parts --------------------------------------------
@pytest.fixture(scope="module")
def flux_parts(module_tmp):
    """The reduced Flux probe (engine.probes.families) and its three parts as files of their own, as
    users have them (flux1-dev.safetensors, ae.safetensors, clip_l.safetensors)."""
    return split_probe("flux", module_tmp / "flux", {
        "flux1-dev.safetensors": "model.diffusion_model.", "ae.safetensors": "vae.",
        "clip_l.safetensors": "text_encoders.clip_l.transformer."})


FLUX_REQUEST = dict(prompt="a lighthouse", width=64, height=64, steps=1, seed=5, cfg_scale=1.0)


@pytest.fixture(scope="module")
def flux_whole(cpu_runtime, flux_parts, module_tmp):
    """The whole Flux probe's image for FLUX_REQUEST and its report, made once: the split files' image must
    equal it and the T5-XXL run's must differ from it (seeded, deterministic on the CPU build)."""
    probe, _folder = flux_parts
    folder = module_tmp / "flux-whole"
    folder.mkdir()
    pixels, _text, report = _generate(cpu_runtime, probe, folder, GenerateRequest(**FLUX_REQUEST), "whole")
    return pixels, report


def test_flux_from_a_diffusion_model_vae_and_clip_l_files_is_the_checkpoints_image(cpu_runtime, flux_parts, flux_whole,
                                                                                   tmp_path):
    _probe, folder = flux_parts
    whole, whole_report = flux_whole
    split, text, report = _generate(cpu_runtime, None, tmp_path, GenerateRequest(
        **FLUX_REQUEST, diffusion_model=str(folder / "flux1-dev.safetensors"), vae=str(folder / "ae.safetensors"),
        clip_l=str(folder / "clip_l.safetensors")), "split")
    assert split == whole  # the same tensors, given as three files
    assert report.components == {"diffusion_model": "flux1-dev.safetensors", "vae": "ae.safetensors",
                                 "clip_l": "clip_l.safetensors"}
    assert "Model: flux1-dev" in text and "VAE: ae.safetensors" in text
    # The memory planner counts each file once: the diffusion model given as --diffusion-model is
    # also the request's model, and was counted twice.
    assert report.memory.weights == whole_report.memory.weights


def test_a_vae_of_another_family_is_refused(cpu_runtime, flux_parts, parts, probe_model, tmp_path, no_worker):
    _probe, folder = flux_parts
    _refused(cpu_runtime, probe_model, tmp_path, "--vae .*sd-vae.* not the one the model's family, flux, decodes with", model="",
             diffusion_model=str(folder / "flux1-dev.safetensors"), vae=str(parts / "vae.safetensors"))
    _refused(cpu_runtime, probe_model, tmp_path, "--vae .*flux-vae.* family, sd1, decodes with",
             vae=str(folder / "ae.safetensors"))


def test_the_request_the_worker_gets_for_a_large_init_image_fits_its_body_limit(probe_model, tmp_path):
    # The worker reads at most WORKER_MAX_BODY_BYTES of a request (256 KiB): a 512x512 image is 1 MiB in
    # base64, so the pixels travel in a file of the run's private folder, not in the body.
    from accelstack.limits import WORKER_MAX_BODY_BYTES
    from accelstack.serde import to_dict

    side = 1024
    request = GenerateRequest(prompt="a lighthouse", width=side, height=side, init_image=str(
        write_png_image(tmp_path / "init.png", side, side)), control_net="", strength=0.5)
    checked = check_components(request, probe_model.path)
    with generation.wire_images(request, checked) as fields:
        sent = dataclasses.replace(request, **fields).validate()
        assert len(json.dumps(to_dict(sent))) < WORKER_MAX_BODY_BYTES // 4
        assert Path(sent.init_pixels).read_bytes() == checked.init_rgb
        folder = Path(sent.init_pixels).parent
        assert folder.stat().st_mode & 0o077 == 0  # private
    assert not folder.exists()


def test_a_chroma_model_with_the_default_flash_attention_gives_an_image_not_nan(cpu_runtime, tmp_path):
    # stable-diffusion.cpp's Chroma DiT mask is not supported with flash attention (its own warning,
    # src/stable-diffusion.cpp): with both on, as generate's defaults were, the image is NaN (all white).
    from accelstack.engine.probes.family_files import ensure_family_probe
    from accelstack.engine.verification.probe_verify import pixel_stats

    probe = ensure_family_probe("chroma", 1234, tmp_path / "cache", keep=True)
    pixels, text, report = _generate(cpu_runtime, probe.path, tmp_path, GenerateRequest(
        prompt="a lighthouse", width=64, height=64, steps=1, seed=5, cfg_scale=1.0))
    stats = pixel_stats(pixels)
    assert stats.saturated < 0.5 and stats.distinct > 8, stats


def test_a_flux_lora_and_an_embedding_apply_to_the_flux_probe(cpu_runtime, flux_parts, tmp_path):
    # issue 26 "Done when": each family's probe with a LoRA and an embedding. A kohya-named Flux LoRA
    # (lora_unet_double_blocks_0_img_attn_qkv...) on the reduced Flux probe (hidden 128) and a CLIP-L
    # (768-wide) embedding: both checked against the model, applied, and named in the result.
    from companion_files import embedding, flux_block_lora

    probe, _folder = flux_parts
    loras, embeds = tmp_path / "loras", tmp_path / "embeddings"
    loras.mkdir()
    embeds.mkdir()
    flux_block_lora(loras / "fluxstyle.safetensors", seed=11)
    embedding(embeds / "fluxword.safetensors", width=768)
    request = dict(width=64, height=64, steps=1, seed=5, cfg_scale=1.0)
    plain, _text, _ = _generate(cpu_runtime, probe, tmp_path, GenerateRequest(
        prompt="a fluxword lighthouse", embeddings_dir=str(embeds), **request), "plain")
    styled, text, report = _generate(cpu_runtime, probe, tmp_path, GenerateRequest(
        prompt="a fluxword lighthouse <lora:fluxstyle:1.0>", lora_dir=str(loras), embeddings_dir=str(embeds),
        **request), "styled")
    assert styled != plain  # the same prompt and embedding: the LoRA changed the image
    assert [(lora.name, lora.weight) for lora in report.loras] == [("fluxstyle", 1.0)]
    assert report.embeddings == ["fluxword"]
    assert "LoRA: fluxstyle:1" in text and "Embeddings: fluxword" in text


def test_flux_with_a_t5xxl_gguf_runs_it_and_the_image_follows_it(cpu_runtime, flux_parts, flux_whole, tmp_path):
    # --t5xxl for real: Flux's second text encoder as the GGUF file users run on small machines (llama.cpp's
    # names, Q4_0). T5-XXL cannot be reduced (src/t5.hpp fixes 24 x 4096): 2.7 GB, its 256-token pass the
    # slowest step here. Without it stable-diffusion.cpp feeds zeros of its width (the probe's default);
    # with it the conditioning, and so the image, is T5's.
    from component_files import t5xxl_gguf

    from accelstack.engine.models.inspection import inspect_model

    probe, _folder = flux_parts
    t5 = t5xxl_gguf(tmp_path / "t5-v1_1-xxl-encoder-Q4_0.gguf")
    assert [(p.component, p.kind) for p in inspect_model(str(t5)).parts] == [("text_encoder", "t5xxl")]
    zeros, _report = flux_whole  # without --t5xxl
    with_t5, text, report = _generate(cpu_runtime, probe, tmp_path, GenerateRequest(**FLUX_REQUEST, t5xxl=str(t5)), "t5")
    assert report.components == {"t5xxl": t5.name}
    assert with_t5 != zeros
    assert f"Text encoders: {t5.name}" in text


def test_img2img_without_a_size_takes_the_init_images(probe_model, tmp_path):
    # A user who gives --init-image and no --width/--height means "this picture": the request takes the
    # image's size (it was refused as not 512x512, the defaults'); a size given is still checked against it.
    from accelstack.cli import build_parser
    from accelstack.commands.generate import prepare

    # (128x64: an SD 1.x model makes multiples of 64 only, test_family_sizes)
    init = write_png_image(tmp_path / "photo.png", 128, 64, seed=2)
    base = ["generate", "-m", probe_model.path, "-p", "a lighthouse", "--init-image", str(init), "-o", str(tmp_path / "o.png")]
    request, _options = prepare(build_parser().parse_args(base))
    assert (request.width, request.height) == (128, 64)
    with pytest.raises(InvalidRequestError, match="128x64"):
        prepare(build_parser().parse_args(base + ["--width", "64", "--height", "64"]))
    plain, _options = prepare(build_parser().parse_args(base[:5] + ["-o", str(tmp_path / "p.png")]))
    assert (plain.width, plain.height) == (512, 512)  # no init image: the default size


def test_a_flux_lora_in_diffusers_names_applies_to_the_flux_probe(cpu_runtime, flux_parts, tmp_path):
    # ai-toolkit and diffusers write Flux LoRAs in diffusers' DiT names (transformer.transformer_blocks.N.attn.to_q,
    # single_transformer_blocks.N.proj_mlp...), which stable-diffusion.cpp converts to the original ones
    # (src/name_conversion.cpp convert_diffusers_dit_to_original_flux); to_q/to_k/to_v are thirds of the fused qkv.
    # It was refused as holding nothing the check reads.
    from companion_files import AITK_FLUX_MODULES, dit_lora_tensors, write_safetensors

    probe, _folder = flux_parts
    loras = tmp_path / "loras"
    loras.mkdir()
    tensors = dit_lora_tensors(AITK_FLUX_MODULES, "diffusers", seed=12)
    write_safetensors(loras / "aitk.safetensors", tensors)
    write_safetensors(loras / "zero.safetensors", {k: v * 0 if "lora_B" in k else v for k, v in tensors.items()})
    request = dict(width=64, height=64, steps=1, seed=5, cfg_scale=1.0, lora_dir=str(loras))
    plain, _text, _ = _generate(cpu_runtime, probe, tmp_path, GenerateRequest(prompt="a lighthouse", **request), "plain")
    styled, _text, report = _generate(cpu_runtime, probe, tmp_path, GenerateRequest(
        prompt="a lighthouse <lora:aitk:1.0>", **request), "styled")
    assert styled != plain
    # add_k_proj (txt_attn.qkv.weight.1) without add_q_proj, proj_mlp (linear1.weight.3) without to_q: stable-diffusion.cpp
    # applies a fused weight's slices from .weight on, up to the first missing one (src/lora.hpp), so not these two
    # ("Only (6 / 10) LoRA tensors have been applied")
    assert [(lora.name, lora.tensors) for lora in report.loras] == [("aitk", 3)]
    zero, _text, _ = _generate(cpu_runtime, probe, tmp_path, GenerateRequest(
        prompt="a lighthouse <lora:zero:1.0>", **request), "zero")
    assert zero == plain  # the same LoRA with zero up-weights: the tag alone changes nothing


@pytest.fixture(scope="module")
def sdxl_probe(family_probe) -> str:
    """The SDXL probe (1.6 GB), made once for the session (tests/conftest.py)."""
    return family_probe("sdxl").path


def test_an_sdxl_lora_and_a_two_encoder_embedding_apply_and_an_sdxl_controlnet_is_refused(cpu_runtime, sdxl_probe, tmp_path,
                                                                                          monkeypatch):
    # issue 26 "Done when" for SDXL: a kohya SDXL LoRA in LDM names (lora_unet_input_blocks_4_1_... is
    # down_blocks.1.attentions.0 of the Vega layout's UNet) and an SDXL embedding, which holds one vector set
    # per text encoder (clip_l: 768 wide, clip_g: 1280), on the SDXL probe: checked, applied and named.
    # A full-size SDXL ControlNet (src/control.hpp fixes its depths 2/10 and middle 10: 1.25 G parameters,
    # 1.25 GB as F8) killed the worker with SIGABRT on the first step (the runtime's ControlNet graph is too
    # small for it): it is refused before any worker starts, with the reason.
    import numpy as np
    from companion_files import write_safetensors

    loras, embeds = tmp_path / "loras", tmp_path / "embeddings"
    loras.mkdir()
    embeds.mkdir()
    rng = np.random.default_rng(13)
    tensors = {}
    for block, c in (("input_blocks_4_1", 640), ("output_blocks_0_1", 1280)):
        for proj in ("attn1_to_q", "attn1_to_v", "attn2_to_out_0"):
            key = f"lora_unet_{block}_transformer_blocks_0_{proj}"
            tensors[f"{key}.lora_down.weight"] = rng.normal(0, 0.5, (4, c))
            tensors[f"{key}.lora_up.weight"] = rng.normal(0, 0.5, (c, 4))
            tensors[f"{key}.alpha"] = np.array(4.0)
    write_safetensors(loras / "xlstyle.safetensors", tensors)
    write_safetensors(embeds / "xlword.safetensors", {"clip_l": rng.normal(0, 0.5, (2, 768)),
                                                       "clip_g": rng.normal(0, 0.5, (2, 1280))})
    request = dict(width=64, height=64, steps=1, seed=5, cfg_scale=1.0, embeddings_dir=str(embeds))
    plain, _text, _ = _generate(cpu_runtime, sdxl_probe, tmp_path, GenerateRequest(prompt="a xlword lighthouse", **request),
                                "plain")
    styled, text, report = _generate(cpu_runtime, sdxl_probe, tmp_path, GenerateRequest(
        prompt="a xlword lighthouse <lora:xlstyle:0.8>", lora_dir=str(loras), **request), "styled")
    assert styled != plain  # the same prompt and embedding: the LoRA changed the image
    assert [(lora.name, lora.weight, lora.tensors) for lora in report.loras] == [("xlstyle", 0.8, 6)]
    assert report.embeddings == ["xlword"]
    assert "LoRA: xlstyle:0.8" in text and "Embeddings: xlword" in text
    net = write_controlnet(tmp_path / "canny-sdxl.safetensors", context=2048, layout=SDXL_CONTROL)
    control = write_png_image(tmp_path / "edges.png", 64, 64, seed=4)
    monkeypatch.setattr(generation, "Supervisor", lambda *a, **k: pytest.fail("a worker was started"))
    with pytest.raises(InvalidRequestError, match="aborts on an SDXL ControlNet") as info:
        generation.generate(cpu_runtime, sdxl_probe, GenerateRequest(
            prompt="a lighthouse", control_net=str(net), control_image=str(control), **request), tmp_path / "no.png")
    assert "pull 1752" in info.value.message and "SD 1.x or SD 2.x" in info.value.hint
    assert not (tmp_path / "no.png").exists()


def test_an_embedding_applies_to_a_separate_clip_l_file(cpu_runtime, flux_parts, tmp_path):
    # Users run Flux as separate files (--diffusion-model, --vae, --clip-l). The embedding's check read the
    # text encoder's width from the diffusion model's file alone, found none and refused "this model has no
    # CLIP text encoder"; the --clip-l file is the encoder the embedding goes to. Same tensors, same image.
    from companion_files import embedding

    probe, folder = flux_parts
    embeds = tmp_path / "embeddings"
    embeds.mkdir()
    embedding(embeds / "fluxword.safetensors", width=768)
    request = dict(prompt="a fluxword lighthouse", width=64, height=64, steps=1, seed=5, cfg_scale=1.0,
                   embeddings_dir=str(embeds))
    whole, _text, _ = _generate(cpu_runtime, probe, tmp_path, GenerateRequest(**request), "whole")
    split, text, report = _generate(cpu_runtime, None, tmp_path, GenerateRequest(
        **request, diffusion_model=str(folder / "flux1-dev.safetensors"), vae=str(folder / "ae.safetensors"),
        clip_l=str(folder / "clip_l.safetensors")), "split")
    assert report.embeddings == ["fluxword"] and "Embeddings: fluxword" in text
    assert split == whole
    t5 = sparse_safetensors(tmp_path / "t5xxl_fp16.safetensors", {"shared.weight": (32128, 4096)})
    with pytest.raises(InvalidRequestError, match="no CLIP text encoder"):  # the DiT and T5-XXL alone: still refused
        generation.generate(cpu_runtime, None, GenerateRequest(**request, diffusion_model=str(folder / "flux1-dev.safetensors"),
                                                               vae=str(folder / "ae.safetensors"), t5xxl=str(t5)), tmp_path / "no.png")


def test_sdxl_with_its_clip_g_as_a_file_of_its_own_is_the_checkpoints_image(cpu_runtime, sdxl_probe, tmp_path):
    # --clip-g for real: the SDXL probe without its CLIP-G, and the CLIP-G as a file of its own (HF names,
    # as clip_g.safetensors is shared), give the all-in-one file's pixels; stable-diffusion.cpp gives the
    # file the prefix of the UNet models' second encoder (src/stable-diffusion.cpp new_sd_ctx).
    from component_files import drop_part

    clip_g_prefix = "conditioner.embedders.1.transformer."
    extract_part(sdxl_probe, tmp_path / "clip_g.safetensors", clip_g_prefix)
    rest = drop_part(sdxl_probe, tmp_path / "sdxl-no-clip-g.safetensors", clip_g_prefix)
    request = dict(prompt="a lighthouse", width=64, height=64, steps=1, seed=5, cfg_scale=1.0)
    whole, _text, _ = _generate(cpu_runtime, sdxl_probe, tmp_path, GenerateRequest(**request), "whole")
    split, text, report = _generate(cpu_runtime, str(rest), tmp_path, GenerateRequest(
        **request, clip_g=str(tmp_path / "clip_g.safetensors")), "split")
    assert report.components == {"clip_g": "clip_g.safetensors"}
    assert split == whole


def test_a_chroma_lora_applies_and_an_embedding_is_refused_for_want_of_a_clip(cpu_runtime, tmp_path):
    # Chroma's blocks are Flux's without their per-block modulation: a kohya LoRA on them applies. Its only
    # text encoder is T5-XXL, which takes no textual-inversion embedding: refused before any worker starts.
    from companion_files import embedding, flux_block_lora

    from accelstack.engine.probes.family_files import ensure_family_probe

    probe = ensure_family_probe("chroma", 1234, tmp_path / "cache", keep=True)
    loras, embeds = tmp_path / "loras", tmp_path / "embeddings"
    loras.mkdir()
    embeds.mkdir()
    flux_block_lora(loras / "chromastyle.safetensors", seed=14, alpha=False)
    embedding(embeds / "word.safetensors", width=768)
    request = dict(width=64, height=64, steps=1, seed=5, cfg_scale=1.0)
    plain, _text, _ = _generate(cpu_runtime, probe.path, tmp_path, GenerateRequest(prompt="a lighthouse", **request), "plain")
    styled, text, report = _generate(cpu_runtime, probe.path, tmp_path, GenerateRequest(
        prompt="a lighthouse <lora:chromastyle:1>", lora_dir=str(loras), **request), "styled")
    assert styled != plain and [(lora.name, lora.tensors) for lora in report.loras] == [("chromastyle", 2)]
    assert "LoRA: chromastyle:1" in text
    with pytest.raises(InvalidRequestError, match="no CLIP text encoder"):
        generation.generate(cpu_runtime, probe.path, GenerateRequest(prompt="a word", embeddings_dir=str(embeds), **request),
                            tmp_path / "no.png")
    assert not (tmp_path / "no.png").exists()
