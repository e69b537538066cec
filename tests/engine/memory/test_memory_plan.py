"""The memory planner (issue 26, "Settings that fit this machine"): ``auto`` offload, VAE tiling
and weight type chosen from the model files' headers, the image size and the free memory.

The planner's unit tests read synthesized files of each family (tests/engine/model_specs.py:
real tensor names, sparse data, padded here to the published parameter counts so the sizes are
the real ones) on simulated 4/6/8/16 GiB GPUs and small RAM. One test generates for real on the
CPU build with the SD 1.x probe, with the free RAM the planner sees lowered so that the untiled
decode does not fit: ``auto`` tiles the VAE, the image is made, and the reason is reported.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Dict

import model_specs as m
import pytest

from accelstack.cli import main
from accelstack.commands.verify import add_engine_arguments
from accelstack.core import direct, machine
from accelstack.engine import generation
from accelstack.engine.config import AUTO, LEGACY, EngineOptions, apply_overrides, load_config, options_from_mapping
from accelstack.engine.errors import ConfigError, InsufficientMemoryError
from accelstack.engine.memory.device import MachineMemory
from accelstack.engine.memory.plan import FAMILIES, MemoryPlan, plan_for_files
from accelstack.engine.models.inspection import inspect_model
from accelstack.engine.png import read_png
from accelstack.engine.supervision import process
from accelstack.engine.worker.protocol import GenerateRequest
from accelstack.serde import from_dict, to_dict

GIB = 2 ** 30
MIB = 2 ** 20


# -- synthesized files at their published sizes -----------------------------------------------------------
def _params(spec: m.Spec, prefix: str) -> int:
    total = 0
    for name, (shape, _dtype) in spec.items():
        if name.startswith(prefix):
            n = 1
            for d in shape:
                n *= d
            total += n
    return total


def _padded(spec: m.Spec, sizes: Dict[str, int], dtype: str = "F16", width: int = 0) -> m.Spec:
    """``spec`` with one filler tensor per prefix, so each part has its published parameter count: a vector (kept
    as loaded by a conversion, as a UNet's or VAE's convolutions are), or with ``width`` a matrix of rows that wide
    (converted, as a text encoder's layers are: models.conversion) and the few parameters left as a vector."""
    out = dict(spec)
    for prefix, target in sizes.items():
        missing = target - _params(spec, prefix)
        assert missing > 0, prefix
        if width:
            out[f"{prefix}filler_matrix.weight"] = ((missing // width, width), dtype)
            missing %= width
        if missing:
            out[f"{prefix}filler.weight"] = ((missing,), dtype)
    return out


# the SD VAE's 83.7M parameters: its decoder (with post_quant_conv), what a text-to-image load builds, and
# its encoder (with quant_conv), what img2img adds (counted on the SD 1.x probe's VAE, the same layout)
SD_VAE_SIZES = {"first_stage_model.decoder.": 49_490_199, "first_stage_model.encoder.": 34_163_664}


def sd1_file(folder: Path) -> Path:
    # v1-5-pruned-emaonly: UNet 859.5M, VAE 83.7M, CLIP-L 123.1M parameters (as the probe's parts)
    spec = _padded(m.sd1_original(), {"model.diffusion_model.": 859_520_964, **SD_VAE_SIZES,
                                       "cond_stage_model.transformer.": 123_060_480})
    return m.write_safetensors(folder / "v1-5-pruned-emaonly.safetensors", spec)


def sdxl_file(folder: Path) -> Path:
    # sd_xl_base_1.0: UNet 2.567B, VAE 83.7M, CLIP-L 123.1M, CLIP-G 694.7M parameters
    spec = _padded(m.sdxl_original(), {"model.diffusion_model.": 2_567_463_684, **SD_VAE_SIZES,
                                        "conditioner.embedders.0.transformer.": 123_060_480,
                                        "conditioner.embedders.1.": 694_659_841})
    return m.write_safetensors(folder / "sd_xl_base_1.0.safetensors", spec)


def flux_files(folder: Path) -> Dict[str, str]:
    """FLUX.1 [dev] (bf16, 11.9B parameters: the real tensors) with ae, clip_l and t5xxl files."""
    ae = _padded(m.sd_vae("", 16), {"decoder.": 49_490_199, "encoder.": 34_163_664}, "F32")
    t5 = _padded(m.t5xxl(), {"encoder.block.": 4_762_310_656 - 32128 * 4096 - 4096}, width=4096)
    clip = _padded(m.clip_hf("", 768), {"text_model.": 123_060_480}, width=768)
    return {"model": str(m.write_safetensors(folder / "flux1-dev.safetensors", m.flux("dev"))),
            "vae": str(m.write_safetensors(folder / "ae.safetensors", ae)),
            "t5xxl": str(m.write_safetensors(folder / "t5xxl_fp16.safetensors", t5)),
            "clip_l": str(m.write_safetensors(folder / "clip_l.safetensors", clip))}


def _gpu(files, side, vram, ram=64 * GIB, options=None, batch=1) -> MemoryPlan:
    return plan_for_files(files, side, side, batch, options or EngineOptions(), gpu=True, ram_free=ram,
                          vram_free=None if vram is None else int(vram * GIB))


def test_the_files_have_their_published_sizes(tmp_path):
    """The synthesized files are sized as the real ones (so the planner's figures are the real ones)."""
    sdxl = _gpu([sdxl_file(tmp_path)], 1024, 64)
    assert sdxl.family == "sdxl" and 6.3 * GIB < sdxl.weights < 6.5 * GIB  # 3.44B parameters in f16 (decode-only VAE)
    flux = flux_files(tmp_path)
    p = _gpu([flux["model"], flux["vae"], flux["clip_l"], flux["t5xxl"]], 1024, 64)
    assert p.family == "flux"
    by_phase = {x.phase: x.weights for x in p.phases}
    assert 22 * GIB < by_phase["diffusion"] < 22.5 * GIB  # flux1-dev.safetensors: 23.8 GB
    assert 9 * GIB < by_phase["text encoders"] < 9.2 * GIB  # t5xxl_fp16 9.5 GB + clip_l 0.25 GB
    assert by_phase["vae decode"] < 0.4 * GIB  # ae.safetensors 335 MB (f32)


def test_flux_counts_its_256_text_tokens_whatever_the_image_size(tmp_path):
    """FLUX.1's blocks run T5's 256 tokens (zeros without T5) beside the image's: measured at its real width
    (bench_memory.py --family flux-wide), 108/174/244 MiB above the loaded RSS at 256/384/512 px. The planner
    took only the image's tokens and estimated 0.53/0.62/0.74 of that: under, an out-of-memory unseen."""
    flux = flux_files(tmp_path)
    for side, measured in ((256, 108), (384, 174), (512, 244)):
        p = plan_for_files([flux["model"]], side, side, 1, EngineOptions(vae_tiling=True, vae_tile_size=8), gpu=False,
                           ram_free=None)
        diffusion = next(x for x in p.phases if x.phase == "diffusion").activations
        assert diffusion >= 72 * MIB + 40 * 1024 * (side // 8) ** 2
        working = p.ram_need - p.weights
        assert 1.0 <= working / (measured * MIB) <= 1.2, (side, working / MIB)


def test_t5xxls_text_phase_is_its_measured_one(tmp_path):
    """T5-XXL's pass over FLUX.1's 256-token chunk peaked 78 MiB above the loaded RSS (bench_memory.py --family
    flux --t5xxl); the planner took 256 MiB (derived), which offloaded or tiled what fits."""
    flux = flux_files(tmp_path)
    p = plan_for_files([flux["model"], flux["t5xxl"]], 512, 512, 1, EngineOptions(), gpu=False, ram_free=None)
    text = next(x for x in p.phases if x.phase == "text encoders").activations
    assert 78 * MIB <= text <= 1.3 * 78 * MIB


def test_sd3_5_large_gets_its_own_measured_constants(tmp_path):
    """SD3.5-large's MMDiT (38 blocks of 2432) peaked 51/66/126/157 MiB at 256/384/512/640 px (bench_memory.py
    --family sd3-large); SD3-medium's constants, which every SD3 file got, said 0.84/0.86/0.69/0.82 of that.
    model inspect names the variant from the block names (src/mmdit.hpp reads the depth from them)."""
    large = str(m.write_safetensors(tmp_path / "sd3.5_large.safetensors", m.sd3_large()))
    medium = str(m.write_safetensors(tmp_path / "sd3_medium.safetensors", m.sd3_original()))
    for side, measured in ((256, 51), (384, 66), (512, 126), (640, 157)):
        p = plan_for_files([large], side, side, 1, EngineOptions(vae_tiling=True, vae_tile_size=8), gpu=False,
                           ram_free=None)
        assert 1.0 <= (p.ram_need - p.weights) / (measured * MIB) <= 1.35, side
    assert plan_for_files([large], 512, 512, 1, EngineOptions(), gpu=False, ram_free=None).reason.startswith(
        "Stable Diffusion 3.5 Large at 512x512")
    assert plan_for_files([medium], 512, 512, 1, EngineOptions(), gpu=False, ram_free=None).reason.startswith(
        "Stable Diffusion 3.x at 512x512")


# -- SDXL on a 16/8/6/4 GiB GPU ----------------------------------------------------------------------------
def test_sdxl_on_gpus_of_each_size(tmp_path):
    model = [sdxl_file(tmp_path)]
    big = _gpu(model, 1024, 16)
    assert (big.offload_to_cpu, big.vae_tiling, big.weight_type) == (False, False, "default") and not big.changed
    assert big.reason.startswith("Stable Diffusion XL at 1024x1024 needs ~") and "no memory savings needed" in big.reason
    # issue 45: the levers in order of cost. Offloading first (docs/performance.md: VRAM saved "without reducing
    # generation speed"): each phase alone on 8 GiB, the untiled decode's 7.5 GiB buffer (PR #890's log) included
    eight = _gpu(model, 1024, 8)
    assert (eight.offload_to_cpu, eight.vae_tiling, eight.weight_type) == (True, False, "default")
    assert 7.5 * GIB < eight.vram_need <= 8 * GIB and eight.reason.endswith("8.0 GiB free: offloading weights to RAM")
    six = _gpu(model, 1024, 6)
    assert (six.offload_to_cpu, six.vae_tiling, six.weight_type) == (True, True, "default")
    assert six.reason.endswith(f"6.0 GiB free: offloading weights to RAM and tiling the VAE (tile {six.vae_tile_size})")
    assert six.ram_need > six.weights  # offloaded: the weights live in RAM
    # the UNet alone (4.8 GiB in f16) does not fit: streamed in graph segments (max_vram) before any conversion
    four = _gpu(model, 1024, 4)
    assert four.weight_type == "default" and four.max_vram and four.vram_need <= 4 * GIB and "max_vram" in four.reason
    for p in (big, eight, six, four):
        assert p.fits and p.vram_need <= p.vram_free and p.device == "gpu"
        assert set(p.chosen) == {"offload_to_cpu", "vae_tiling", "vae_tile_size", "weight_type", "keep_clip_on_cpu",
                                 "keep_vae_on_cpu", "max_vram"}
        options = p.apply(EngineOptions())
        assert not options.auto_keys() and options.validate(concrete=True) is options
    with pytest.raises(InsufficientMemoryError) as err:  # 0.5 GiB: nothing fits, the error says what to lower
        _gpu(model, 1024, 0.5)
    assert "Stable Diffusion XL at 1024x1024 needs about" in err.value.message and "0.5 GiB is available" in err.value.message
    assert "smaller (quantized) model" in err.value.hint and "--no-memory-check" in err.value.hint


def test_a_smaller_image_needs_no_savings(tmp_path):
    small = _gpu([sdxl_file(tmp_path)], 512, 10)  # on 10 GiB: 1024x1024 would tile the VAE
    assert (small.offload_to_cpu, small.vae_tiling, small.weight_type) == (False, False, "default")
    assert _gpu([sdxl_file(tmp_path)], 1024, 10).changed


# -- FLUX.1 with its companions -------------------------------------------------------------------------
def test_flux_on_a_16_gib_gpu_and_on_small_ram(tmp_path):
    f = flux_files(tmp_path)
    files = [f["model"], f["vae"], f["clip_l"], f["t5xxl"]]
    # 22 GiB of bf16 weights: offloaded, and still too many for the diffusion phase: streamed in segments
    # of a VRAM budget (max_vram), before any conversion (issue 45)
    p = _gpu(files, 1024, 16)
    assert p.family == "flux" and p.offload_to_cpu and p.weight_type == "default" and p.max_vram
    assert p.reason.startswith("FLUX.1 at 1024x1024 needs ~") and "16.0 GiB free" in p.reason
    assert "offloading weights to RAM" in p.reason and "max_vram" in p.reason
    roomy = _gpu(files, 1024, 40)
    assert (roomy.offload_to_cpu, roomy.vae_tiling, roomy.weight_type) == (False, False, "default")
    # 16 GiB of RAM on a CPU runtime: the weights alone (31 GiB as stored, 17 GiB as q8_0) need q4_k
    cpu = plan_for_files(files, 1024, 1024, 1, EngineOptions(), gpu=False, ram_free=16 * GIB)
    assert cpu.weight_type == "q4_k" and cpu.ram_need <= 16 * GIB and cpu.device == "cpu" and cpu.vram_need == 0
    # the component files may come in the options (as generate passes them to the worker)
    via_options = plan_for_files([f["model"]], 1024, 1024, 1, EngineOptions(vae=f["vae"], clip_l=f["clip_l"],
                                 t5xxl=f["t5xxl"]), gpu=False, ram_free=16 * GIB)
    assert via_options.weights == cpu.weights and via_options.weight_type == "q4_k"


# -- SD 1.x, RAM and the unknown ---------------------------------------------------------------------------
def test_sd1_on_a_cpu_with_small_ram_tiles_the_vae(tmp_path):
    model = [sd1_file(tmp_path)]
    roomy = plan_for_files(model, 512, 512, 1, EngineOptions(), gpu=False, ram_free=16 * GIB)
    assert not roomy.vae_tiling and roomy.offload_to_cpu is LEGACY["offload_to_cpu"] and not roomy.changed
    tight = plan_for_files(model, 512, 512, 1, EngineOptions(), gpu=False, ram_free=roomy.ram_need - 256 * 2 ** 20)
    assert tight.vae_tiling and tight.weight_type == "default" and tight.ram_need <= tight.ram_free
    assert "RAM" in tight.reason and f"tiling the VAE (tile {tight.vae_tile_size})" in tight.reason
    assert tight.vae_tile_size < 64  # the largest tile that fits, smaller than the latent (64)
    unknown = plan_for_files(model, 512, 512, 1, EngineOptions(), gpu=False, ram_free=None)
    assert not unknown.vae_tiling and "free RAM unknown" in unknown.reason


def test_an_unknown_gpu_keeps_weights_in_ram(tmp_path):
    """Before the worker starts, its GPU's free memory is not known: weights stay in RAM (the old
    default), and the worker's report is checked after loading (generation._check_device_memory)."""
    p = _gpu([sd1_file(tmp_path)], 512, None)
    assert p.offload_to_cpu and not p.vae_tiling and p.vram_free is None and not p.changed
    assert "GPU memory is not known before the worker starts" in p.reason


def test_each_family_constant_names_its_source():
    for family, fam in FAMILIES.items():
        assert fam.source and ("measured on" in fam.source or "not measured" in fam.source), family
    assert "measured" in FAMILIES["sd1"].source and "measured on the SDXL probe" in FAMILIES["sdxl"].source


def test_a_gpu_without_flash_attention_gets_the_attention_scores_lavapipe_allocated(tmp_path):
    # benchmarks/bench_memory_vulkan.py, SD 1.x probe on lavapipe, flash attention off: the UNet's compute
    # buffer was 192 MiB at 384 px and 560 MiB at 512 px, 32 bytes per latent pixel pair (8 heads of f32
    # scores), twice what the CPU build's RSS showed; the plan said 135 and 352 MiB.
    no_flash = EngineOptions(flash_attention=False)
    for side, measured in ((384, 192.25), (512, 559.90)):
        plan = _gpu([sd1_file(tmp_path)], side, 64, options=no_flash)
        diffusion = next(p for p in plan.phases if p.phase == "diffusion")
        assert diffusion.activations >= measured * MIB, (side, diffusion.activations / MIB)
        cpu = plan_for_files([sd1_file(tmp_path)], side, side, 1, no_flash, gpu=False, ram_free=None)
        assert next(p for p in cpu.phases if p.phase == "diffusion").activations < diffusion.activations


# -- explicit options win ----------------------------------------------------------------------------------
def test_explicit_options_always_win(tmp_path):
    model = [sdxl_file(tmp_path)]
    given = EngineOptions(offload_to_cpu=False, vae_tiling=False, weight_type="default", keep_clip_on_cpu=False,
                          keep_vae_on_cpu=False)
    with pytest.raises(InsufficientMemoryError) as err:  # on 6 GiB, as set, it does not fit: refused, not changed
        _gpu(model, 1024, 6, options=given)
    assert "6.0 GiB is available" in err.value.message and "--offload-to-cpu" in err.value.hint
    unchecked = _gpu(model, 1024, 6, options=EngineOptions(offload_to_cpu=False, vae_tiling=False,
                                                            weight_type="default", vae_tile_size=32, memory_check=False,
                                                            keep_clip_on_cpu=False, keep_vae_on_cpu=False, max_vram=0))
    assert (unchecked.offload_to_cpu, unchecked.vae_tiling, unchecked.weight_type) == (False, False, "default")
    assert not unchecked.fits and "the memory check is off" in unchecked.reason and not unchecked.chosen
    tiles = _gpu(model, 1024, 16, options=EngineOptions(vae_tiling=True, vae_tile_size=16))
    assert tiles.vae_tiling and tiles.vae_tile_size == 16 and tiles.chosen == [
        "offload_to_cpu", "weight_type", "keep_clip_on_cpu", "keep_vae_on_cpu", "max_vram"]
    assert tiles.apply(EngineOptions(vae_tiling=True, vae_tile_size=16)).vae_tile_size == 16
    typed = _gpu(model, 1024, 6, options=EngineOptions(weight_type="q4_k"))
    assert typed.weight_type == "q4_k" and "converting" not in typed.reason  # as given, not a saving made
    # memory_check off and nothing fits: the auto options economize, but never convert the weights
    loose = _gpu(model, 1024, 0.5, options=EngineOptions(memory_check=False))
    assert loose.weight_type == "default" and loose.vae_tiling and loose.offload_to_cpu and not loose.fits



def test_a_given_tile_size_is_kept_when_tiling_is_auto(tmp_path):
    # --vae-tile-size 24 with tiling left auto: when the planner tiles, it tiles with 24 (the size given
    # wins); only a tile size left auto is the planner's to pick. It was silently replaced by the plan's.
    model = [sd1_file(tmp_path)]
    roomy = plan_for_files(model, 512, 512, 1, EngineOptions(), gpu=False, ram_free=16 * GIB)
    tight = roomy.ram_need - 256 * 2 ** 20
    given = plan_for_files(model, 512, 512, 1, EngineOptions(vae_tile_size=24), gpu=False, ram_free=tight)
    assert given.vae_tiling and given.vae_tile_size == 24 and "vae_tile_size" not in given.chosen
    assert given.apply(EngineOptions(vae_tile_size=24)).vae_tile_size == 24
    picked = plan_for_files(model, 512, 512, 1, EngineOptions(), gpu=False, ram_free=tight)
    assert picked.vae_tiling and "vae_tile_size" in picked.chosen
    assert picked.apply(EngineOptions()).vae_tile_size == picked.vae_tile_size
    assert EngineOptions().concrete().vae_tile_size == 32  # nothing planned: the old default

def test_the_plan_round_trips_through_json(tmp_path):
    p = _gpu([sdxl_file(tmp_path)], 1024, 6)
    data = json.loads(json.dumps(to_dict(p)))
    assert data["changed"] is True and data["reason"] == p.reason and data["offload_to_cpu"] is True
    assert [x["phase"] for x in data["phases"]] == ["text encoders", "diffusion", "vae decode"]
    assert from_dict(MemoryPlan, data) == p


# -- config.yaml and flags ---------------------------------------------------------------------------------
def test_auto_is_the_default_and_old_configs_keep_working(tmp_path):
    opts = EngineOptions()
    assert opts.auto_keys() == ["offload_to_cpu", "vae_tiling", "vae_tile_size", "weight_type", "keep_clip_on_cpu",
                                "keep_vae_on_cpu", "max_vram"]
    assert opts.concrete() == EngineOptions(offload_to_cpu=True, vae_tiling=False, vae_tile_size=32, weight_type="default",
                                            keep_clip_on_cpu=False, keep_vae_on_cpu=False, max_vram=0)
    assert opts.validate() is opts  # auto is valid everywhere but in the worker
    with pytest.raises(ConfigError, match="must be resolved"):
        opts.validate(concrete=True)
    cfg = tmp_path / "config.yaml"
    cfg.write_text("engine:\n  offload_to_cpu: false\n  vae_tiling: true\n  weight_type: q8_0\n")  # an old file
    assert load_config(cfg) == EngineOptions(offload_to_cpu=False, vae_tiling=True, weight_type="q8_0")
    cfg.write_text("engine:\n  offload_to_cpu: auto\n  vae_tiling: AUTO\n  weight_type: Auto\n")
    assert load_config(cfg) == EngineOptions()
    assert options_from_mapping({"engine": {"vae_tiling": "auto"}}).vae_tiling == AUTO
    assert apply_overrides(EngineOptions(vae_tiling=True), {"vae_tiling": "auto"}).vae_tiling == AUTO


@pytest.mark.parametrize("key, value, words", [
    ("offload_to_cpu", "sometimes", "must be true or false (or auto)"),
    ("vae_tiling", 1, "must be true or false (or auto)"),
    ("vae_tiling", ["auto"], "must be true or false (or auto)"),
    ("vae_tiling", "auto" * 100, "..."),
    ("weight_type", "q9", "must be auto or one of"),
    ("weight_type", {"auto": 1}, "must be auto or one of"),
    ("flash_attention", "auto", "must be true or false"),  # only the three planned options take auto
    ("memory_check", "auto", "must be true or false"),
])
def test_hostile_values_are_config_errors(tmp_path, key, value, words):
    with pytest.raises(ConfigError) as err:
        options_from_mapping({"engine": {key: value}}, where="config.yaml")
    assert f"engine.{key}" in err.value.message and words in err.value.message and len(err.value.message) < 400


def test_flags_take_auto_on_and_off():
    p = argparse.ArgumentParser()
    add_engine_arguments(p)
    args = p.parse_args([])
    assert args.offload_to_cpu is None and args.vae_tiling is None and args.weight_type is None  # config decides
    assert p.parse_args(["--vae-tiling"]).vae_tiling is True  # alone: on, as before the planner
    assert p.parse_args(["--no-vae-tiling"]).vae_tiling is False
    assert p.parse_args(["--vae-tiling", "auto"]).vae_tiling == AUTO
    assert p.parse_args(["--offload-to-cpu", "off"]).offload_to_cpu is False
    assert p.parse_args(["--offload-to-cpu", "ON"]).offload_to_cpu is True
    assert p.parse_args(["--offload-to-cpu"]).offload_to_cpu is True
    assert apply_overrides(EngineOptions(), {"weight_type": p.parse_args(["--weight-type", "auto"]).weight_type}) \
        == EngineOptions()


def test_a_bad_flag_value_is_a_usage_error(capsys):
    assert main(["generate", "-m", "x.safetensors", "-p", "x", "--vae-tiling", "sometimes"]) == 2
    err = capsys.readouterr().err
    assert "expected auto, on or off" in err and "Traceback" not in err


# -- for real: auto fits a generation that the defaults would not ------------------------------------------
def _planned(probe_model, side: int, ram=None) -> MemoryPlan:
    return plan_for_files([probe_model.path], side, side, 1, EngineOptions(), gpu=False, ram_free=ram)


def test_auto_tiles_the_vae_when_the_untiled_decode_does_not_fit(tmp_path, cpu_runtime, probe_model, monkeypatch,
                                                                  capsys):
    """One real generation, through the CLI: the reason is in its output and in the report (and
    so in the JSON result), and the worker was given concrete options."""
    side = 128  # 16x16 latent: a tile of 8 decodes a quarter of the image at a time
    untiled = _planned(probe_model, side)
    tiled = plan_for_files([probe_model.path], side, side, 1, EngineOptions(vae_tiling=True, vae_tile_size=8),
                           gpu=False, ram_free=None)
    ram = (untiled.ram_need + tiled.ram_need) // 2  # between: only the tiled decode fits
    monkeypatch.setattr(machine, "available_ram", lambda system: ram)  # what the core reads of this machine
    req = GenerateRequest(prompt="a red cube", width=side, height=side, steps=1, seed=7)
    with pytest.raises(InsufficientMemoryError):  # the options as they were before auto: refused before any work
        generation.generate(cpu_runtime, probe_model.path, req, tmp_path / "old.png", options=EngineOptions().concrete(),
                            machine=MachineMemory(ram_available=ram))
    assert not (tmp_path / "old.png").exists()
    sent, reports = [], []  # the options the worker is given (the CLI's early worker gets them in its load file)
    real_send, real_generate = process.WorkerProcess.send_load, direct.generate_checked

    def send_load(self, model, options):
        sent.append(options)
        return real_send(self, model, options)

    def generate(*args, **kwargs):
        reports.append(real_generate(*args, **kwargs))
        return reports[-1]

    checked_after_load = []  # (options, estimate) the check against the device's free memory gets, once loaded
    real_check = generation._check_device_memory
    monkeypatch.setattr(generation, "_check_device_memory",
                        lambda sup, need, req, opts: (checked_after_load.append((opts, need)), real_check(sup, need, req, opts)))
    monkeypatch.setattr(process.WorkerProcess, "send_load", send_load)
    monkeypatch.setattr(direct, "generate_checked", generate)
    out = tmp_path / "auto.png"
    assert main(["generate", "--runtime", str(cpu_runtime.path), "-m", probe_model.path, "-p", "a red cube",
                 "--width", str(side), "--height", str(side), "--steps", "1", "--seed", "7", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    image = read_png(out)
    assert (image.width, image.height) == (side, side)
    plan_ = reports[0].memory
    assert plan_ is not None and plan_.vae_tiling and plan_.vae_tile_size == 8 and plan_.changed
    assert plan_.ram_free == ram and plan_.ram_need <= ram
    assert "tiling the VAE (tile 8)" in plan_.reason and plan_.reason.startswith("Stable Diffusion 1.x at 128x128")
    assert f"memory: {plan_.reason}" in text
    assert sent and sent[0].vae_tiling is True and sent[0].vae_tile_size == 8 and not sent[0].auto_keys()
    # The memory check stays on, and what it checks after the load is the planner's estimate (both were
    # lost to an `else` that belonged to the planner's `if`: the old estimate, and the check turned off).
    assert sent[0].memory_check is True
    [(opts, need)] = checked_after_load
    assert opts.memory_check is True and need.ram == plan_.ram_need and need.weights == plan_.weights
    memory = json.loads(json.dumps(to_dict(reports[0])))["memory"]  # what --json prints as the result
    assert memory["vae_tiling"] is True and memory["reason"] == plan_.reason and memory["changed"] is True


def test_a_text_to_image_load_counts_the_vae_decoder_only(tmp_path):
    # bench_memory_vulkan found the VAE's weights estimated 1.69x what lavapipe allocated: stable-diffusion.cpp
    # builds no VAE encoder for text-to-image (vae_decode_only), so only the decoder (and post_quant_conv) is
    # loaded; img2img loads the encoder too.
    import dataclasses

    f = sd1_file(tmp_path)
    inspected = next(p for p in inspect_model(f).parts if p.component == "vae")
    assert inspected.decoder_parameters == 49_490_199 and 83_653_863 <= inspected.parameters < 83_654_000

    def vae(options: EngineOptions) -> int:
        p = plan_for_files([f], 512, 512, 1, options, gpu=False, ram_free=64 * GIB)
        return next(x.weights for x in p.phases if x.phase == "vae decode")

    assert abs(vae(EngineOptions()) - 2 * 49_490_199) <= 1
    assert abs(vae(dataclasses.replace(EngineOptions(), vae_encode=True)) - 2 * inspected.parameters) <= 1
