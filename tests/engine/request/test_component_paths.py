"""Issue 26 review of generate's component files: relative paths (the worker runs in its own folder),
a DiT family without the parts stable-diffusion.cpp cannot run without, a part given as the whole
model (-m), a damaged ControlNet or component blamed on the model, and 16-bit input PNGs. Real files
(the SD 1.x and Flux probes and their parts), real runs on the CPU build; every refusal a typed error
before any worker starts."""
from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Dict, Tuple

import pytest
from companion_files import kohya_lora
from component_files import (  # noqa: E402
    _rewrite,
    controlnet_shapes,
    split_probe,
    standalone_vae,
    write_png_image,
    write_taesd,
)

from accelstack.engine import generation
from accelstack.engine.config import EngineOptions
from accelstack.engine.errors import InvalidRequestError, ModelLoadError
from accelstack.engine.png import SIGNATURE, PngError, read_input_png, read_png
from accelstack.engine.probes.architecture import sd1_tensors
from accelstack.engine.probes.weights import safetensors_header
from accelstack.engine.request.components import check_components
from accelstack.engine.supervision.supervisor import Supervisor
from accelstack.engine.worker.protocol import GenerateRequest

from cli_helpers import json_lines  # validates each line against the shipped schemas
from engine_helpers import CrashOnLoadRuntime, cli_env, run_cli  # noqa: E402

F8_HALF = 0x38  # 0.5 in F8_E5M2, the probe's storage type


def fast(prompt: str = "a lighthouse", **kw) -> GenerateRequest:
    return GenerateRequest(prompt=prompt, width=64, height=64, steps=1, seed=5, **kw)


def flux_request(**kw) -> GenerateRequest:
    return GenerateRequest(prompt="a lighthouse", width=64, height=64, steps=1, seed=5, cfg_scale=1.0, **kw)


def sparse(path: Path, tensors: Dict[str, Tuple[int, ...]], prefix: str = "") -> Path:
    """A header-correct safetensors file whose data is a hole: enough for the checks made before a worker starts."""
    named = {prefix + k: v for k, v in tensors.items()}
    head = safetensors_header(named, {}, "F16")
    total = 0
    for shape in named.values():
        n = 2
        for d in shape:
            n *= d
        total += n
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(len(head) + total)
    return path


def _generate(runtime, model, request: GenerateRequest, out: Path):
    report = generation.generate(runtime, model, request, out)
    return read_png(out).rgb(), report


@pytest.fixture
def no_worker(monkeypatch):
    monkeypatch.setattr(generation, "Supervisor", lambda *a, **k: pytest.fail("a worker was started"))


@pytest.fixture(scope="module")
def parts(probe_model, module_tmp) -> Path:
    """The SD 1.x probe's VAE shifted (its images differ), a TAESD and 64x64 PNGs, in one folder."""
    folder = module_tmp / "parts"
    folder.mkdir()
    vae = standalone_vae(probe_model.path, folder / "vae-shifted.safetensors")
    raw = bytearray(vae.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    a, b = json.loads(bytes(raw[8:8 + n]))["decoder.conv_out.bias"]["data_offsets"]
    raw[8 + n + a:8 + n + b] = bytes([F8_HALF]) * (b - a)
    vae.write_bytes(bytes(raw))
    write_taesd(folder / "taesd.safetensors")
    (folder / "loras").mkdir()
    kohya_lora(folder / "loras" / "style.safetensors")
    write_png_image(folder / "init.png", 64, 64, seed=3)
    write_png_image(folder / "control.png", 64, 64, seed=1)
    sparse(folder / "canny.safetensors", controlnet_shapes(768), "control_model.")
    return folder


@pytest.fixture(scope="module")
def flux_parts(module_tmp):
    """The reduced Flux probe and its parts as users have them: the DiT alone (bare names), ae, clip_l."""
    return split_probe("flux", module_tmp / "flux", {
        "flux1-dev.safetensors": "model.diffusion_model.", "ae.safetensors": "vae.",
        "clip_l.safetensors": "text_encoders.clip_l.transformer."})


# -- 1. relative paths ----------------------------------------------------------------------------------
def test_a_file_name_that_begins_or_ends_with_a_space_is_refused(probe_model, parts, tmp_path, no_worker):
    """The bindings load os.path.normpath(path.strip()) (stable_diffusion.py _clean_path): "vae.safetensors "
    was checked as itself and loaded as "vae.safetensors", another file or none."""
    spaced = tmp_path / "vae-shifted.safetensors "
    spaced.write_bytes((parts / "vae-shifted.safetensors").read_bytes())
    with pytest.raises(InvalidRequestError, match="--vae .*space"):
        check_components(fast(vae=str(spaced)), probe_model.path)
    model = tmp_path / "model.safetensors\t"
    model.symlink_to(probe_model.path)
    with pytest.raises(InvalidRequestError, match="model .*space"):
        check_components(fast(), str(model))


def test_relative_component_paths_reach_the_worker_as_absolute_ones(probe_model, parts, flux_parts, monkeypatch):
    # The worker runs in its own folder (engine.supervision.process): a path relative to the caller's folder named
    # another file there, or none (the VAE was silently not used; --control-net and Flux failed to load).
    monkeypatch.chdir(parts.parent)
    checked = check_components(fast(vae="parts/vae-shifted.safetensors", taesd="parts/taesd.safetensors",
                                    control_net="parts/canny.safetensors", control_image="parts/control.png"),
                               probe_model.path)
    assert checked.paths == {name: str(parts / f) for name, f in (
        ("vae", "vae-shifted.safetensors"), ("taesd", "taesd.safetensors"), ("control_net", "canny.safetensors"))}
    _probe, folder = flux_parts
    monkeypatch.chdir(folder)
    checked = check_components(flux_request(diffusion_model="flux1-dev.safetensors", vae="ae.safetensors",
                                            clip_l="./clip_l.safetensors"), None)
    assert checked.paths == {"diffusion_model": str(folder / "flux1-dev.safetensors"),
                             "vae": str(folder / "ae.safetensors"), "clip_l": str(folder / "clip_l.safetensors")}


def test_a_relative_vae_changes_the_image_exactly_as_the_absolute_one(cpu_runtime, probe_model, parts, tmp_path,
                                                                      monkeypatch):
    # The images and the LoRA folder are read by the parent (relative paths always worked there): checked too.
    monkeypatch.chdir(parts)
    prompt = "a lighthouse <lora:style:0.8>"
    plain, _r = _generate(cpu_runtime, probe_model.path, fast(prompt, lora_dir="loras", init_image="init.png", strength=0.6),
                          tmp_path / "p.png")
    absolute, _r = _generate(cpu_runtime, probe_model.path, fast(
        prompt, vae=str(parts / "vae-shifted.safetensors"), lora_dir=str(parts / "loras"), init_image=str(parts / "init.png"),
        strength=0.6), tmp_path / "a.png")
    relative, report = _generate(cpu_runtime, probe_model.path, fast(
        prompt, vae="vae-shifted.safetensors", lora_dir="loras", init_image="init.png", strength=0.6), tmp_path / "r.png")
    assert absolute != plain  # the shifted VAE decodes
    assert relative == absolute
    assert report.components == {"vae": "vae-shifted.safetensors"} and report.init_image == "init.png"
    assert [lora.name for lora in report.loras] == ["style"]


def test_a_relative_taesd_decodes_as_the_absolute_one(cpu_runtime, probe_model, parts, tmp_path, monkeypatch):
    monkeypatch.chdir(parts.parent)
    absolute, _r = _generate(cpu_runtime, probe_model.path, fast(taesd=str(parts / "taesd.safetensors")), tmp_path / "a.png")
    relative, _r = _generate(cpu_runtime, probe_model.path, fast(taesd="parts/taesd.safetensors"), tmp_path / "r.png")
    assert relative == absolute


# -- 2. a family's parts stable-diffusion.cpp cannot run without ---------------------------------------
def test_flux_without_a_text_encoder_or_a_vae_is_refused_naming_the_flags(flux_parts, no_worker):
    # src/conditioner.hpp FluxCLIPEmbedder: with neither CLIP-L nor T5-XXL it builds no condition, and the
    # worker died of SIGSEGV on the first step (retried, the hint blamed the runtime). Without a VAE the load
    # failed with "tensor 'first_stage_model...' not in model file", blamed on the diffusion model.
    _probe, folder = flux_parts
    dit, ae, clip = (str(folder / n) for n in ("flux1-dev.safetensors", "ae.safetensors", "clip_l.safetensors"))
    with pytest.raises(InvalidRequestError, match="--diffusion-model .*FLUX.1") as info:
        check_components(flux_request(diffusion_model=dit, vae=ae), None)
    err = info.value
    assert "--clip-l" in err.message and "clip_l.safetensors" in err.message and "--t5xxl" in err.message
    assert "--vae" not in err.message and "--clip-l clip_l.safetensors" in err.hint
    with pytest.raises(InvalidRequestError, match="--vae .*ae.safetensors") as info:
        check_components(flux_request(diffusion_model=dit, clip_l=clip), None)
    assert "--taesd" in info.value.message and "--clip-l" not in info.value.message
    with pytest.raises(InvalidRequestError) as info:
        check_components(flux_request(diffusion_model=dit), None)
    assert "--vae" in info.value.message and "--clip-l" in info.value.message


def test_flux_runs_with_either_text_encoder_and_a_taesd_for_its_vae(cpu_runtime, flux_parts, tmp_path):
    # What stable-diffusion.cpp runs is not refused: T5-XXL alone (CLIP-L's pooled vector zeros, a warning),
    # CLIP-L alone (T5's hidden states zeros: the probe's default), a TAESD instead of the VAE
    # (src/stable-diffusion.cpp new_sd_ctx: "using TAE for encoding / decoding").
    _probe, folder = flux_parts
    dit, ae = str(folder / "flux1-dev.safetensors"), str(folder / "ae.safetensors")
    t5 = sparse(tmp_path / "t5xxl_fp16.safetensors", {"shared.weight": (32128, 4096),
                                                     "encoder.final_layer_norm.weight": (4096,)})
    check_components(flux_request(diffusion_model=dit, vae=ae, t5xxl=str(t5)), None)
    taef1 = write_taesd(tmp_path / "taef1.safetensors", latent=16)
    pixels, report = _generate(cpu_runtime, None, flux_request(diffusion_model=dit, taesd=str(taef1),
                                                               clip_l=str(folder / "clip_l.safetensors")), tmp_path / "t.png")
    assert report.components == {"diffusion_model": "flux1-dev.safetensors", "taesd": "taef1.safetensors",
                                 "clip_l": "clip_l.safetensors"}
    assert len(set(pixels)) > 16


def test_a_flux_checkpoint_without_text_encoders_needs_one_given(flux_parts, tmp_path, no_worker):
    # The same crash with -m: the checkpoint's DiT and VAE, no text encoder (measured: SIGSEGV, retried).
    probe, folder = flux_parts
    rest = _rewrite(probe, tmp_path / "flux-no-te.safetensors", lambda n: None if n.startswith("text_encoders.") else n)
    with pytest.raises(InvalidRequestError, match="--model .*--clip-l"):
        check_components(flux_request(), str(rest))
    check_components(flux_request(clip_l=str(folder / "clip_l.safetensors")), str(rest))


def test_other_dit_families_need_what_their_conditioner_builds(tmp_path, no_worker):
    import model_specs as m

    ae = m.write_safetensors(tmp_path / "ae.safetensors", m.sd_vae("", 16))
    sd3 = m.write_safetensors(tmp_path / "sd3.5_large.safetensors", m.sd3_large())
    with pytest.raises(InvalidRequestError, match="--clip-l .*--clip-g .*--t5xxl"):  # SD3CLIPEmbedder: any one
        check_components(flux_request(diffusion_model=str(sd3), vae=str(ae)), None)
    t5 = m.write_safetensors(tmp_path / "t5xxl_fp16.safetensors", m.t5xxl())
    check_components(flux_request(diffusion_model=str(sd3), vae=str(ae), t5xxl=str(t5)), None)
    zimage = m.write_safetensors(tmp_path / "z_image_turbo_bf16.safetensors", m.z_image())
    with pytest.raises(InvalidRequestError, match="--llm .*qwen_3_4b.safetensors"):  # LLMEmbedder always builds its LLM
        check_components(flux_request(diffusion_model=str(zimage), vae=str(ae)), None)


def test_the_cli_refuses_flux_without_a_text_encoder_with_exit_2(cpu_runtime, flux_parts, cache_with_probe, tmp_path):
    _probe, folder = flux_parts
    r = run_cli(["generate", "--runtime", cpu_runtime.path, "--diffusion-model", folder / "flux1-dev.safetensors",
                 "--vae", folder / "ae.safetensors", "--cfg-scale", "1", "-p", "cat", "-W", "64", "-H", "64", "--steps", "1",
                 "--threads", "1", "-o", tmp_path / "no.png", "--json"], cli_env(cache_with_probe, tmp_path))
    assert r.returncode == 2, (r.stdout, r.stderr)
    final = json_lines(r.stdout)[-1]
    assert final["error"] == "InvalidRequestError" and "--clip-l" in final["message"], final
    assert not (tmp_path / "no.png").exists()


# -- 3. a part given as the whole model ---------------------------------------------------------------
def test_a_part_given_as_the_model_is_refused_saying_what_it_is(cpu_runtime, probe_model, flux_parts, parts, tmp_path,
                                                                 no_worker):
    # stable-diffusion.cpp's version detection reads -m's tensor names (src/model.cpp get_sd_version) and
    # failed on each: "get sd version from file failed", with a hint about a complete model.
    from companion_files import flux_block_lora

    _probe, folder = flux_parts
    unet = sparse(tmp_path / "unet.safetensors", sd1_tensors()["unet"])
    lora = flux_block_lora(tmp_path / "style.safetensors", seed=3)
    cases = [(folder / "flux1-dev.safetensors", "FLUX.1 .*diffusion model alone", "--diffusion-model"),
             (folder / "ae.safetensors", "16-channel VAE .*alone", "--vae"),
             (folder / "clip_l.safetensors", "CLIP-L text encoder alone", "--clip-l"),
             (parts / "taesd.safetensors", "tiny autoencoder", "--taesd"),
             (parts / "canny.safetensors", "ControlNet", "--control-net"),
             (lora, "LoRA", "--lora-dir"),
             (unet, "UNet alone", "whole checkpoint")]
    for path, what, hint in cases:
        with pytest.raises(InvalidRequestError, match=f"--model .*{what}") as info:
            generation.generate(cpu_runtime, str(path), fast(), tmp_path / "no.png")
        assert hint in info.value.hint, (path, info.value.hint)
    flux_hint = "--diffusion-model " + str(folder / "flux1-dev.safetensors")
    with pytest.raises(InvalidRequestError) as info:
        generation.generate(cpu_runtime, str(folder / "flux1-dev.safetensors"), fast(), tmp_path / "no.png")
    assert flux_hint in info.value.hint and "--vae ae.safetensors" in info.value.hint
    assert not (tmp_path / "no.png").exists()


def test_a_diffusion_model_under_its_checkpoint_prefix_is_taken_as_the_model(flux_parts, tmp_path, no_worker):
    # model.diffusion_model. names are what the version detection reads: -m with --vae and --clip-l runs (measured).
    probe, folder = flux_parts
    dit = _rewrite(probe, tmp_path / "flux-dit.safetensors", lambda n: n if n.startswith("model.diffusion_model.") else None)
    check_components(flux_request(vae=str(folder / "ae.safetensors"), clip_l=str(folder / "clip_l.safetensors")), str(dit))


# -- 4. a damaged component is blamed on itself ---------------------------------------------------------
def test_a_controlnet_with_a_wrong_or_missing_tensor_is_refused_naming_it(probe_model, parts, tmp_path, no_worker):
    # src/control.hpp builds an SD ControlNet's every tensor with fixed shapes: one wrong or missing tensor
    # failed the load ("load control net tensors from model loader failed"), blamed on the model.
    good = controlnet_shapes(768)
    cases = {"input_hint_block.0.weight": ((16, 4, 3, 3), "input_hint_block.0.weight .*16, 4, 3, 3.*16, 3, 3, 3"),
             "zero_convs.1.0.weight": ((320, 320, 3, 3), "zero_convs.1.0.weight"),
             "middle_block_out.0.weight": (None, "lacks .*middle_block_out.0.weight")}
    control = str(parts / "control.png")
    for name, (shape, match) in cases.items():
        tensors = {k: v for k, v in good.items() if k != name or shape is not None}
        if shape is not None:
            tensors[name] = shape
        net = sparse(tmp_path / "net.safetensors", tensors, "control_model.")
        with pytest.raises(InvalidRequestError, match=f"--control-net .*net.safetensors: .*{match}") as info:
            check_components(fast(control_net=str(net), control_image=control), probe_model.path)
        assert "src/control.hpp" in info.value.message
    check_components(fast(control_net=str(parts / "canny.safetensors"), control_image=control), probe_model.path)


def test_a_component_that_fails_the_load_is_named_not_only_the_model(cpu_runtime, flux_parts, tmp_path):
    # A VAE whose one tensor has another shape passes the parent's checks (its kind is right) and fails in
    # stable-diffusion.cpp; the error named only the diffusion model and hinted at "a complete model".
    _probe, folder = flux_parts
    bad = tmp_path / "ae-bad.safetensors"
    raw = (folder / "ae.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    shape = header["decoder.conv_out.weight"]["shape"]
    header["decoder.conv_out.weight"]["shape"] = [shape[1], shape[0], *shape[2:]]  # the same bytes, another shape
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    bad.write_bytes(struct.pack("<Q", len(head)) + head + raw[8 + n:])
    with pytest.raises(ModelLoadError) as info:
        generation.generate(cpu_runtime, None, flux_request(diffusion_model=str(folder / "flux1-dev.safetensors"),
                                                            vae=str(bad), clip_l=str(folder / "clip_l.safetensors")),
                            tmp_path / "no.png")
    err = info.value
    assert "--vae" in err.message and str(bad) in err.message, err.message
    assert "complete Stable Diffusion model" not in err.hint


# -- 5. input PNGs --------------------------------------------------------------------------------------
def _png(path: Path, width: int, height: int, depth: int, color: int, samples: bytes) -> Path:
    """A PNG written byte by byte (filter 0 on each row): any bit depth and colour type."""
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[color]
    row = width * channels * depth // 8
    raw = b"".join(b"\x00" + samples[y * row:(y + 1) * row] for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    path.write_bytes(SIGNATURE + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, depth, color, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    return path


@pytest.mark.parametrize("color", [0, 2, 4, 6])
def test_16_bit_pngs_are_scaled_to_8_bits_not_clipped(tmp_path, color):
    # A ControlNet depth map is usually 16-bit gray (Pillow's I;16): convert("RGB") clipped every value
    # above 255 to white (99.6% of a gradient's pixels). The high byte is the 8-bit value.
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[color]
    width, height = 16, 4
    values = [(i * 4099 + c * 977) % 65536 for i in range(width * height) for c in range(channels)]
    img = read_input_png(_png(tmp_path / "in.png", width, height, 16, color, struct.pack(f">{len(values)}H", *values)))
    high = [v >> 8 for v in values]
    colour = {0: lambda p: high[p:p + 1] * 3, 4: lambda p: high[p:p + 1] * 3,
              2: lambda p: high[p:p + 3], 6: lambda p: high[p:p + 3]}[color]
    assert img.pixels == bytes(b for i in range(width * height) for b in colour(i * channels))


def test_a_16_bit_big_endian_gray_image_is_scaled_too():
    from PIL import Image

    from accelstack.engine.png import to_rgb

    img = Image.frombytes("I;16B", (4, 1), struct.pack(">4H", 0, 255, 256, 65535))
    assert to_rgb(img).tobytes() == bytes([0] * 3 + [0] * 3 + [1] * 3 + [255] * 3)


def test_a_damaged_png_is_said_so_without_a_python_object_and_the_hint_takes_any_png(probe_model, tmp_path, no_worker):
    good = write_png_image(tmp_path / "good.png", 64, 64).read_bytes()
    bad = tmp_path / "bad.png"
    bad.write_bytes(good[:29] + bytes([good[29] ^ 0xFF]) + good[30:])  # IHDR's checksum no longer matches
    with pytest.raises(PngError) as info:
        read_input_png(bad)
    assert "object at 0x" not in str(info.value) and "BytesIO" not in str(info.value)
    with pytest.raises(InvalidRequestError, match="--init-image") as info:
        check_components(fast(init_image=str(bad)), probe_model.path)
    assert "object at 0x" not in info.value.message and "8-bit" not in info.value.hint


def test_a_gray_16_bit_init_image_reaches_the_worker_scaled(probe_model, tmp_path):
    width = height = 64
    values = [(x * 1024 + y * 16) % 65536 for y in range(height) for x in range(width)]
    path = _png(tmp_path / "depth.png", width, height, 16, 0, struct.pack(f">{len(values)}H", *values))
    checked = check_components(fast(init_image=str(path)), probe_model.path)
    assert checked.init_rgb == bytes(v >> 8 for v in values for _ in range(3))
    assert sum(b == 255 for b in checked.init_rgb) < len(checked.init_rgb) // 10


def test_a_load_that_crashes_with_components_names_them_and_keeps_the_log(cpu_runtime, tmp_path):
    # A crash while loading (stable-diffusion.cpp dies of SIGSEGV on some files) was told as the model's alone.
    model, vae = tmp_path / "model.safetensors", tmp_path / "vae.safetensors"
    model.write_bytes(b"\0" * 64)
    vae.write_bytes(b"\0" * 64)
    sup = Supervisor(CrashOnLoadRuntime(cpu_runtime.path, cpu_runtime.backend), model=str(model),
                     options=EngineOptions(vae=str(vae)))
    with pytest.raises(ModelLoadError) as info:
        sup.start()
    err = info.value
    assert "crashed while loading" in err.message and f"--vae {vae}" in err.message and str(model) in err.message
    assert "kept at" in err.hint
