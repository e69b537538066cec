"""The memory levers of the bundled engine (issue 45): text encoders on the CPU, the VAE on the CPU,
``max_vram`` (graph-cut segmented execution), ``enable_mmap``, each an option (config.yaml, a flag, a
service job field) and each usable by the planner's ``auto``, tried in order of cost, converting the
weights last. Files are synthesized at their published sizes (test_memory_plan's helpers)."""
from __future__ import annotations

import argparse
import io
import types

import model_specs as m
import pytest
from test_memory_plan import GIB, MIB, _gpu, flux_files, sd1_file, sdxl_file

from accelstack.commands.verify import add_engine_arguments, engine_options
from accelstack.engine.config import AUTO, EngineOptions, apply_overrides, options_from_mapping
from accelstack.engine.errors import ConfigError, InvalidRequestError
from accelstack.engine.worker.ggml_backend import GgmlBackend
from accelstack.settings import Settings


def quantized(spec: m.Spec, dtype: str) -> m.Spec:
    """``spec`` as a quantizer writes it: matrices whose rows fill the type's blocks in ``dtype``, the rest F16."""
    block = {"Q8_0": 32, "Q4_K": 256}[dtype]
    return {k: (shape, dtype if len(shape) > 1 and shape[-1] % block == 0 else "F16") for k, (shape, _) in spec.items()}


def _flux(tmp_path, model="flux1-dev.safetensors", dtype="BF16", t5="fp16"):
    f = flux_files(tmp_path)
    if dtype != "BF16":
        f["model"] = str(m.write_gguf(tmp_path / model, quantized(m.flux("dev"), dtype)))
    if t5 == "q8_0":
        spec = dict(m.t5xxl_gguf())
        spec["enc.blk.filler.weight"] = ((4_762_310_656 - 32128 * 4096 * 2 - 4096 * 4096 - 10240 * 4096 - 4096,), "Q8_0")
        f["t5xxl"] = str(m.write_gguf(tmp_path / "t5xxl_q8_0.gguf", spec))
    return [f["model"], f["vae"], f["clip_l"], f["t5xxl"]]


# -- options ---------------------------------------------------------------------------------------------
def test_the_levers_are_config_keys_flags_and_auto(tmp_path):
    opts = options_from_mapping({"engine": {"keep_clip_on_cpu": True, "keep_vae_on_cpu": "auto", "max_vram": 3.5,
                                            "enable_mmap": True}})
    assert (opts.keep_clip_on_cpu, opts.keep_vae_on_cpu, opts.max_vram, opts.enable_mmap) == (True, AUTO, 3.5, True)
    assert {"keep_clip_on_cpu", "keep_vae_on_cpu", "max_vram"} <= set(EngineOptions().auto_keys())
    concrete = EngineOptions().concrete()
    assert (concrete.keep_clip_on_cpu, concrete.keep_vae_on_cpu, concrete.max_vram, concrete.enable_mmap) == \
        (False, False, 0, False)  # what the bindings do by default (stable_diffusion.py 0.4.7)
    p = argparse.ArgumentParser()
    add_engine_arguments(p)
    args = p.parse_args(["--clip-on-cpu", "--vae-on-cpu", "off", "--max-vram", "6", "--mmap"])
    args.config, args.threads = None, None
    got = engine_options(args, Settings.resolve(config_file=tmp_path / "none.yaml", cache=tmp_path / "cache", env={}))
    assert (got.keep_clip_on_cpu, got.keep_vae_on_cpu, got.max_vram, got.enable_mmap) == (True, False, 6.0, True)
    assert p.parse_args(["--max-vram", "auto"]).max_vram == AUTO


@pytest.mark.parametrize("value", ["lots", -1, 0.01, 100000, True, float("nan"), float("inf")])
def test_a_bad_max_vram_is_a_typed_error(value):
    with pytest.raises(ConfigError) as err:
        options_from_mapping({"engine": {"max_vram": value}}, where="config.yaml")
    assert "engine.max_vram" in err.value.message and len(err.value.message) < 300
    with pytest.raises(InvalidRequestError, match="--max-vram"):
        apply_overrides(EngineOptions(), {"max_vram": value})


def _recording_backend(tmp_path):
    """A GgmlBackend whose bindings record the arguments of the last load (the worker's side of each lever)."""
    seen: dict = {}

    class FakeSD:
        def __init__(self, **kw):
            seen.clear()
            seen.update(kw)
            self._model = types.SimpleNamespace(model=object())

    backend = GgmlBackend(io.StringIO())
    backend.bindings = types.SimpleNamespace(StableDiffusion=FakeSD)
    backend.sd_cpp = types.SimpleNamespace(sd_get_num_physical_cores=lambda: 2, sd_embedding_t=None)
    model = tmp_path / "m.safetensors"
    model.write_bytes(b"x")
    return backend, model, seen


def test_the_worker_hands_every_lever_to_the_bindings(tmp_path):
    """GgmlBackend.load passes the levers as the bindings' own arguments (stable_diffusion.py 0.4.7)."""
    backend, model, seen = _recording_backend(tmp_path)
    options = EngineOptions(keep_clip_on_cpu=True, keep_vae_on_cpu=True, max_vram=5.5, enable_mmap=True).concrete()
    backend.load(str(model), options)
    assert (seen["keep_clip_on_cpu"], seen["keep_vae_on_cpu"], seen["max_vram"], seen["enable_mmap"]) == \
        (True, True, 5.5, True)


# -- the planner -----------------------------------------------------------------------------------------
def test_the_untiled_sdxl_decode_on_a_gpu_is_the_buffer_sd_cpp_allocates(tmp_path):
    """stable-diffusion.cpp logs a 'vae compute buffer size: 7680.25 MB(VRAM)' for an untiled SDXL 1024x1024
    decode (leejet/stable-diffusion.cpp PR #890, before its change); the planner said 6.45 GiB (the CPU
    build's RSS per pixel), an out-of-memory after all the sampling on an 8 GB card."""
    p = _gpu([sdxl_file(tmp_path)], 1024, 64)
    vae = next(x for x in p.phases if x.phase == "vae decode")
    assert vae.activations >= 7680 * MIB
    cpu = _gpu([sdxl_file(tmp_path)], 1024, 64, options=EngineOptions(keep_vae_on_cpu=True))
    assert next(x for x in cpu.phases if x.phase == "vae decode").activations < vae.activations  # RSS on the CPU


def test_flux_with_t5_in_fp16_keeps_the_text_encoders_on_the_cpu_before_converting(tmp_path):
    """docs/flux.md runs FLUX.1 with t5xxl_fp16 and --clip-on-cpu (q4_k: 6.4 GB); T5 in fp16 (9 GiB) does not
    fit an 8 GiB GPU even alone, so the planner converted the weights to q4_k."""
    files = _flux(tmp_path, "flux1-dev-q4_k.gguf", "Q4_K")
    p = _gpu(files, 1024, 8, ram=32 * GIB)
    assert p.keep_clip_on_cpu and p.weight_type == "default" and p.fits
    assert "keeping the text encoders on the CPU" in p.reason
    text = next(x for x in p.phases if x.phase == "text encoders")
    assert p.ram_need >= text.weights  # T5 lives in RAM
    assert p.vram_need <= 8 * GIB and p.offload_to_cpu


def test_max_vram_streams_the_weights_before_any_conversion(tmp_path):
    """With the weights offloaded, max_vram makes stable-diffusion.cpp cut each graph into segments that fit
    the budget (src/ggml_graph_cut.cpp apply_max_vram_budget): bf16 FLUX.1 (22 GiB) on 16 GiB needs no q8_0."""
    p = _gpu(_flux(tmp_path), 1024, 16, ram=48 * GIB)
    assert p.offload_to_cpu and p.max_vram > 0 and p.weight_type == "default" and p.fits
    assert p.max_vram * GIB <= 16 * GIB and p.vram_need <= 16 * GIB
    assert "VRAM budget" in p.reason
    given = _gpu(_flux(tmp_path), 1024, 16, ram=48 * GIB, options=EngineOptions(max_vram=0))
    assert given.max_vram == 0 and given.weight_type == "q8_0"  # a value given wins: converted instead


def test_the_levers_come_in_order_of_cost(tmp_path):
    model = [sdxl_file(tmp_path)]
    roomy = _gpu(model, 1024, 24)
    assert not (roomy.offload_to_cpu or roomy.keep_clip_on_cpu or roomy.keep_vae_on_cpu or roomy.vae_tiling
                or roomy.max_vram) and not roomy.changed
    order = ["offloading weights to RAM", "keeping the text encoders on the CPU", "tiling the VAE",
             "keeping the VAE on the CPU", "VRAM budget", "converting"]
    deepest = []  # the costliest lever each size needed, from 16 GiB down: never cheaper on a smaller GPU
    for vram in (16, 12, 10, 8, 7, 6, 5, 4, 3):
        p = _gpu(model, 1024, vram, ram=32 * GIB)
        deepest.append(max((i for i, lever in enumerate(order) if lever in p.reason), default=-1))
    assert deepest == sorted(deepest) and deepest[-1] >= 2, deepest
    sd1 = _gpu([sd1_file(tmp_path)], 512, 4)
    assert not sd1.changed and sd1.fits


def test_a_conversion_counts_only_the_tensors_stable_diffusion_cpp_converts(tmp_path):
    """Converted on load, a tensor changes type only when model.cpp tensor_should_be_converted says so (its rows,
    ne[0], fill the type's blocks; not a bias, scale or embedding); Conv2d weights stay F16 (ggml_extend.hpp), so
    the SD 1.x UNet's 3x3 convolutions keep their size. Measured on this machine's CPU build (bench_memory.py
    --convert, the worker's RSS after loading the SD 1.x probe): q8_0 1824 MiB, q4_k 1711 MiB; before, the planner
    counted every parameter converted: 1087 and 595 MiB."""
    from accelstack.engine.memory.levers import phase_weights
    from accelstack.engine.memory.weights import components_of, decode_only
    from accelstack.engine.probes.architecture import sd1_tensors

    parts = sd1_tensors()
    spec = {f"{p}.{n}": (tuple(s), "F16") for p, key in (("unet", "unet"), ("vae", "vae"), ("te", "text_encoder"))
            for n, s in parts[key].items()}
    _fam, _var, weights = components_of([m.write_safetensors(tmp_path / "probe.safetensors", spec)])
    for weight_type, measured in (("q8_0", 1824), ("q4_k", 1711)):
        counted = sum(phase_weights(decode_only(weights), weight_type).values()) / MIB
        assert 0.85 <= counted / measured <= 1.15, (weight_type, counted)


def test_lora_apply_mode_is_a_config_key_a_flag_a_job_field_and_a_bindings_argument(tmp_path):
    """stable-diffusion.cpp's lora_apply_mode (stable-diffusion.cpp ``apply_loras``; the bindings'
    LORA_APPLY_MODE_MAP): auto (at_runtime when any weight is quantized, else immediately), immediately (merged
    into the weights once), at_runtime (applied in every step's graph). auto is stable-diffusion.cpp's own: it is
    not sent, so bindings without the argument still load."""
    from accelstack.core import direct

    assert EngineOptions().lora_apply_mode == AUTO
    opts = options_from_mapping({"engine": {"lora_apply_mode": "at_runtime"}})
    assert opts.lora_apply_mode == "at_runtime"
    with pytest.raises(ConfigError, match="engine.lora_apply_mode"):
        options_from_mapping({"engine": {"lora_apply_mode": "sometimes"}}, where="config.yaml")
    with pytest.raises(InvalidRequestError, match="--lora-apply-mode"):
        apply_overrides(EngineOptions(), {"lora_apply_mode": 3})
    settings = Settings.resolve(config_file=tmp_path / "none.yaml", cache=tmp_path / "cache", env={})
    assert direct.engine_options_over(settings, {"lora_apply_mode": "immediately"}, "job option 'engine'") \
        .lora_apply_mode == "immediately"  # a service job's engine field
    p = argparse.ArgumentParser()
    add_engine_arguments(p)
    args = p.parse_args(["--lora-apply-mode", "immediately"])
    args.config, args.threads = None, None
    assert engine_options(args, settings).lora_apply_mode == "immediately"

    backend, model, seen = _recording_backend(tmp_path)
    backend.load(str(model), EngineOptions(lora_apply_mode="at_runtime").concrete())
    assert seen["lora_apply_mode"] == "at_runtime"
    backend.load(str(model), EngineOptions().concrete())
    assert "lora_apply_mode" not in seen
