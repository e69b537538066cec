"""Issue 44: a LoRA is matched against the model as stable-diffusion.cpp loads it, for each way the model
can be given. A Flux LoRA was refused ("changes nothing in this model") whenever Flux came as separate files
(--diffusion-model, --vae, --clip-l): stable-diffusion.cpp loads a --diffusion-model file's tensors under
``model.diffusion_model.`` (src/stable-diffusion.cpp new_sd_ctx: init_from_file(path, "model.diffusion_model."),
kept where a name already has it), and the check read the file's bare names. Each naming a trainer writes
(kohya, ComfyUI, diffusers/PEFT as diffusers and AI-toolkit write it, diffusers words under ComfyUI's prefix, LyCORIS LoHa and LoKr) is checked on the single checkpoint, the
split safetensors files and a GGUF diffusion model, with the count stable-diffusion.cpp logs ("(N / M) LoRA
tensors have been applied")."""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest
from companion_files import AITK_FLUX_MODULES, dit_lora, write_safetensors  # noqa: E402
from component_files import split_probe  # noqa: E402

from accelstack.engine.errors import InvalidRequestError
from accelstack.engine.models.check import check_model
from accelstack.engine.request.companions import prepare_companions

FILES = {"flux1-dev.safetensors": "model.diffusion_model.", "ae.safetensors": "vae.",
         "clip_l.safetensors": "text_encoders.clip_l.transformer."}
H = 128  # the reduced Flux probe's hidden size: qkv 384 rows, linear1 896 (3 x 128 + an MLP of 512)


@pytest.fixture(scope="module")
def flux(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fluxsplit")
    probe, folder = split_probe("flux", folder, FILES)
    _gguf_copy(folder / "flux1-dev.safetensors", folder / "flux1-dev-f32.gguf")
    return probe, folder


def _gguf_copy(src: Path, out: Path) -> None:
    """The diffusion model's tensors (bare names, as a city96-style GGUF has them) as a GGUF v3 file of F32 zeros."""
    with open(src, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))

    def text(b: bytes) -> bytes:
        return struct.pack("<Q", len(b)) + b
    infos, offset = b"", 0
    items = [(k, v["shape"]) for k, v in header.items() if k != "__metadata__"]
    for name, shape in items:
        dims = list(reversed(shape)) or [1]
        infos += text(name.encode()) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", 0, offset)
        size = 4 * int(np.prod(shape or [1]))
        offset += size + (-size % 32)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(items), 0) + infos
    with open(out, "wb") as fh:
        fh.write(head + b"\0" * (-len(head) % 32))
        fh.truncate(fh.tell() + offset)


def _layouts(flux) -> Dict[str, tuple]:
    probe, folder = flux
    parts = {"vae": str(folder / "ae.safetensors"), "clip_l": str(folder / "clip_l.safetensors")}
    out = {"checkpoint": (check_model(probe), {})}
    for name in ("flux1-dev.safetensors", "flux1-dev-f32.gguf"):
        path = str(folder / name)
        out[name] = (check_model(path), {"diffusion_model": path, **parts})
    return out


def _pair(rng, rows: int, cols: int, rank: int = 4):
    return rng.normal(0, 0.5, (rank, cols)), rng.normal(0, 0.5, (rows, rank))


# {naming: (tensors, LoRA tensors stable-diffusion.cpp applies)}
def _namings() -> Dict[str, tuple]:
    rng = np.random.default_rng(44)
    out: Dict[str, tuple] = {}
    kohya: Dict[str, np.ndarray] = {}
    for module, (rows, cols) in {"double_blocks_0_img_attn_qkv": (3 * H, H), "double_blocks_0_txt_mlp_0": (512, H),
                                 "single_blocks_0_linear1": (896, H), "single_blocks_0_linear2": (H, 640)}.items():
        down, up = _pair(rng, rows, cols)
        kohya.update({f"lora_unet_{module}.lora_down.weight": down, f"lora_unet_{module}.lora_up.weight": up,
                      f"lora_unet_{module}.alpha": np.array(4.0)})
    out["kohya"] = (kohya, 12)
    comfy: Dict[str, np.ndarray] = {}
    for module, (rows, cols) in {"double_blocks.0.img_attn.proj": (H, H), "double_blocks.0.img_mod.lin": (6 * H, H),
                                 "single_blocks.0.modulation.lin": (3 * H, H)}.items():
        down, up = _pair(rng, rows, cols)
        comfy.update({f"diffusion_model.{module}.lora_down.weight": down, f"diffusion_model.{module}.lora_up.weight": up,
                      f"diffusion_model.{module}.alpha": np.array(8.0)})
    out["comfyui"] = (comfy, 9)
    peft: Dict[str, np.ndarray] = {}  # diffusers/PEFT as AI-toolkit writes it: qkv in thirds, linear1 in four
    for module, (rows, cols) in {"transformer_blocks.0.attn.to_q": (H, H), "transformer_blocks.0.attn.to_k": (H, H),
                                 "transformer_blocks.0.attn.to_v": (H, H), "transformer_blocks.0.ff.net.2": (H, 512),
                                 "single_transformer_blocks.0.attn.to_q": (H, H),
                                 "single_transformer_blocks.0.attn.to_k": (H, H),
                                 "single_transformer_blocks.0.attn.to_v": (H, H),
                                 "single_transformer_blocks.0.proj_mlp": (512, H)}.items():
        down, up = _pair(rng, rows, cols)
        peft.update({f"transformer.{module}.lora_A.weight": down, f"transformer.{module}.lora_B.weight": up})
    out["diffusers"] = (peft, 16)
    out["comfyui-diffusers"] = ({k.replace("transformer.", "diffusion_model.", 1) if "single" in k else k: v
                          for k, v in peft.items() if "to_v" not in k or "single" not in k}, 12)
    loha: Dict[str, np.ndarray] = {}
    for module, (rows, cols) in {"double_blocks_0_img_attn_qkv": (3 * H, H), "single_blocks_0_linear2": (H, 640)}.items():
        for half in ("1", "2"):
            down, up = _pair(rng, rows, cols)
            loha.update({f"lora_unet_{module}.hada_w{half}_a": up, f"lora_unet_{module}.hada_w{half}_b": down})
        loha[f"lora_unet_{module}.alpha"] = np.array(4.0)
    out["loha"] = (loha, 10)
    lokr: Dict[str, np.ndarray] = {}
    for module, (rows, cols) in {"double_blocks_0_img_mlp_0": (512, H), "double_blocks_0_txt_attn_qkv": (3 * H, H)}.items():
        down, up = _pair(rng, rows // 4, cols // 4)
        lokr.update({f"lora_unet_{module}.lokr_w1": rng.normal(0, 0.5, (4, 4)), f"lora_unet_{module}.lokr_w2_a": up,
                     f"lora_unet_{module}.lokr_w2_b": down, f"lora_unet_{module}.alpha": np.array(4.0)})
    out["lokr"] = (lokr, 8)
    return out


NAMINGS = _namings()


@pytest.mark.parametrize("naming", sorted(NAMINGS))
def test_a_flux_lora_in_each_naming_applies_to_every_layout(flux, naming, tmp_path):
    tensors, applied = NAMINGS[naming]
    loras = tmp_path / "loras"
    loras.mkdir()
    write_safetensors(loras / f"{naming}.safetensors", tensors)
    seen: List[tuple] = []
    for layout, (model, encoders) in _layouts(flux).items():
        found = prepare_companions(f"a lighthouse <lora:{naming}:0.8>", str(loras), "", model, encoders=encoders)
        found.cleanup()
        (lora,) = found.loras
        seen.append((layout, lora.applied, lora.total))
    assert seen == [(layout, applied, len(tensors)) for layout, *_ in seen]


def test_the_diffusers_lora_counts_what_stable_diffusion_cpp_logged(flux, tmp_path):
    # tests/engine/request/test_generate_components.py ran this LoRA through stable-diffusion.cpp 0.4.7, which logged
    # "Only (6 / 10) LoRA tensors have been applied" (companion_files.AITK_FLUX_MODULES says why)
    loras = tmp_path / "loras"
    loras.mkdir()
    dit_lora(loras / "aitk.safetensors", AITK_FLUX_MODULES, "diffusers", seed=12)
    for _layout, (model, encoders) in _layouts(flux).items():
        found = prepare_companions("a lighthouse <lora:aitk:1>", str(loras), "", model, encoders=encoders)
        found.cleanup()
        (lora,) = found.loras
        assert (lora.tensors, lora.applied, lora.total) == (3, 6, 10)
        assert lora.summary() == "aitk ×1: 6 of 10 tensors"
        assert "in part" in lora.warning and "4 of its 10 tensors" in lora.warning


def test_the_cli_applies_a_lora_to_split_flux_files_and_says_how_much(cpu_runtime, cache_with_probe, flux, tmp_path):
    """On the real CPU build: the kohya LoRA changes the image made from the split files, the result says
    "kohya ×0.8: 12 of 12 tensors" in the terminal and the PNG; a LoRA that applies in part is a warning."""
    from accelstack.engine.png import read_png

    from engine_helpers import cli_env, run_cli  # noqa: E402

    _probe, folder = flux
    loras = tmp_path / "loras"
    loras.mkdir()
    write_safetensors(loras / "kohya.safetensors", NAMINGS["kohya"][0])
    write_safetensors(loras / "part.safetensors", NAMINGS["comfyui-diffusers"][0])
    env = cli_env(cache_with_probe, tmp_path)
    common = ["generate", "--runtime", cpu_runtime.path, "--diffusion-model", folder / "flux1-dev.safetensors",
              "--vae", folder / "ae.safetensors", "--clip-l", folder / "clip_l.safetensors", "-W", "64", "-H", "64",
              "--steps", "1", "--seed", "5", "--cfg-scale", "1", "--lora-dir", loras]
    images = {}
    for name, prompt in (("plain", "a lighthouse"), ("kohya", "a lighthouse <lora:kohya:0.8>"),
                         ("part", "a lighthouse <lora:part:1>")):
        r = run_cli([*common, "-p", prompt, "-o", tmp_path / f"{name}.png"], env)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        png = read_png(tmp_path / f"{name}.png")
        images[name] = (png.rgb(), png.text["parameters"], r.stdout)
    assert images["kohya"][0] != images["plain"][0]  # applied to the split files
    assert "LoRA applied: kohya ×0.8: 12 of 12 tensors" in images["kohya"][1]
    assert "LoRA kohya ×0.8: 12 of 12 tensors" in images["kohya"][2] and "applies only in part" not in images["kohya"][2]
    assert "add --t5xxl" in images["kohya"][2]  # the one warning: the probe's split files have no T5-XXL
    assert "LoRA part ×1: 12 of 14 tensors" in images["part"][2]
    assert "warning: the LoRA part applies only in part: 2 of its 14 tensors" in images["part"][2]


@pytest.mark.parametrize("case, words", [
    ("loha-halves", ("hada_w1_a x hada_w1_b of 384x128", "hada_w2_a x hada_w2_b of 128x128")),
    ("loha-size", ("lora_unet_double_blocks_0_img_attn_qkv", "hada_w1_a x hada_w1_b is 512x128", "384x128")),
    ("loha-rank", ("hada_w1_b of 4x128 (rank 4)", "hada_w1_a of 384x8 (rank 8)")),
    ("lokr-size", ("lora_unet_double_blocks_0_img_mlp_0", "lokr_w1 (x) lokr_w2 is 512x64", "512x128")),
])
def test_a_lycoris_module_of_the_wrong_shape_is_refused_naming_it(flux, case, words, tmp_path):
    # stable-diffusion.cpp multiplies LoHa halves value by value and asserts a change's size against the weight
    # (src/lora.hpp get_loha_weight_diff, get_weight_diff: GGML_ASSERT; a matrix of the weight's columns and fewer
    # rows it pads): each would abort the worker; the check let them by
    rng = np.random.default_rng(3)
    qkv, mlp = "lora_unet_double_blocks_0_img_attn_qkv", "lora_unet_double_blocks_0_img_mlp_0"
    rows = {"loha-halves": (384, 128), "loha-size": (512, 512), "loha-rank": (384, 384)}
    if case.startswith("loha"):
        first, second = rows[case]
        tensors = {f"{qkv}.hada_w1_a": rng.normal(0, 0.5, (first, 8 if case == "loha-rank" else 4)),
                   f"{qkv}.hada_w1_b": rng.normal(0, 0.5, (4, 128)),
                   f"{qkv}.hada_w2_a": rng.normal(0, 0.5, (second if case != "loha-rank" else 384, 4)),
                   f"{qkv}.hada_w2_b": rng.normal(0, 0.5, (4, 128))}
    else:
        tensors = {f"{mlp}.lokr_w1": rng.normal(0, 0.5, (4, 2)), f"{mlp}.lokr_w2": rng.normal(0, 0.5, (128, 32))}
    loras = tmp_path / "loras"
    loras.mkdir()
    write_safetensors(loras / "bad.safetensors", tensors)
    for model, encoders in _layouts(flux).values():
        with pytest.raises(InvalidRequestError) as caught:
            prepare_companions("a lighthouse <lora:bad:1>", str(loras), "", model, encoders=encoders)
        for word in words:
            assert word in caught.value.message, caught.value.message


def _with_a_scalar(src: Path, out: Path, target: str) -> Path:
    """``src`` (safetensors) with its tensor ``target`` of no dimensions (one value), every other as it was."""
    with open(src, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    new, offset = {}, 0
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        shape = [] if name == target else meta["shape"]
        size = int(np.prod(shape or [1]))  # F8: one byte a value
        new[name] = {"dtype": meta["dtype"], "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(new).encode()
    out.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))
    return out


@pytest.mark.parametrize("naming", ["kohya", "loha"])
def test_a_model_weight_of_no_dimensions_is_refused_naming_the_flag_and_the_weight(cpu_runtime, cache_with_probe, flux,
                                                                                   naming, tmp_path):
    """Issue 44 "Bad input": a 0-dimension tensor in the model that a LoRA targets is a typed error naming the
    flag that gave the file and its weight, exit 2, one final JSON line, before any worker starts."""
    from engine_helpers import cli_env, run_cli  # noqa: E402

    _probe, folder = flux
    model = _with_a_scalar(folder / "flux1-dev.safetensors", tmp_path / "scalar.safetensors", "double_blocks.0.img_attn.qkv.weight")
    loras = tmp_path / "loras"
    loras.mkdir()
    write_safetensors(loras / "style.safetensors", NAMINGS[naming][0])
    env = cli_env(cache_with_probe, tmp_path)
    r = run_cli(["generate", "--runtime", cpu_runtime.path, "--diffusion-model", model, "--vae", folder / "ae.safetensors",
                 "--clip-l", folder / "clip_l.safetensors", "-W", "64", "-H", "64", "--steps", "1",
                 "--lora-dir", loras, "-p", "a lighthouse <lora:style:1>", "-o", tmp_path / "no.png", "--json"], env)
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 2 and last["event"] == "error", r.stdout + r.stderr
    message = last["message"]
    assert "--diffusion-model scalar.safetensors" in message and "double_blocks.0.img_attn.qkv.weight" in message, message
    assert "a scalar" in message and not (tmp_path / "no.png").exists()


def test_a_flux_lora_s_text_encoder_modules_count_as_stable_diffusion_cpp_maps_them(flux, tmp_path):
    """For a Flux model stable-diffusion.cpp maps kohya lora_te1_ (and te1.) to the CLIP-L it loads under
    text_encoders.clip_l.transformer., but lora_te_ (te.) to cond_stage_model.transformer., which a Flux model
    does not have (src/name_conversion.cpp convert_tensor_name's prefix_map, te1. overridden for Flux only): a
    lora_te_ module changes nothing there. Both were counted as applied."""
    rng = np.random.default_rng(5)
    unet = "lora_unet_double_blocks_0_img_attn_proj"
    tensors = {f"{unet}.lora_down.weight": rng.normal(0, 0.5, (4, H)), f"{unet}.lora_up.weight": rng.normal(0, 0.5, (H, 4))}
    for prefix in ("lora_te1_", "lora_te_"):
        key = f"{prefix}text_model_encoder_layers_0_self_attn_q_proj"
        loras = tmp_path / prefix
        loras.mkdir()
        write_safetensors(loras / "te.safetensors", {**tensors, f"{key}.lora_down.weight": rng.normal(0, 0.5, (4, 768)),
                                                     f"{key}.lora_up.weight": rng.normal(0, 0.5, (768, 4))})
        for layout, (model, encoders) in _layouts(flux).items():
            found = prepare_companions("a lighthouse <lora:te:1>", str(loras), "", model, encoders=encoders)
            found.cleanup()
            (lora,) = found.loras
            assert (lora.applied, lora.total) == ((4, 4) if prefix == "lora_te1_" else (2, 4)), (prefix, layout)
