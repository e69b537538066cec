"""`accelstack model inspect` / ``accelstack.inspect_model``: the family, size, weight types, parts
and missing companions of model files, read from their headers only (issue 26, first part).

Every file is synthesized with its family's real tensor names and shapes (tests/engine/model_specs.py)
and a sparse data region, so a 22 GiB FLUX.1 [dev] costs kilobytes; the CLI runs as a real
subprocess and its --json line is validated against the shipped schema.
"""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import model_specs as m
import pytest

import accelstack
from accelstack import schemas
from accelstack.engine.errors import EngineError, ModelLoadError
from accelstack.engine.models.check import DIFFUSERS_PARTS
from accelstack.engine.models.families import DATA_FILE, knowledge, parse_knowledge
from accelstack.engine.models.inspection import inspect_model

from engine_helpers import cli_env, run_cli

QUANT = {k: (s, "Q4_K" if len(s) == 2 and s[1] % 256 == 0 else "F32") for k, (s, _) in m.flux("schnell").items()}
# an SDXL checkpoint converted to GGUF keeps its names, up to 87 bytes here (the runtime holds 127: GGML_MAX_NAME=128)
SDXL_Q8 = {k: (s, "Q8_0" if len(s) == 2 and s[1] % 32 == 0 else "F32") for k, (s, _) in m.sdxl_original().items()}

# file name -> (writer, spec, family, variant, role, the companions still needed)
CASES = {
    "flux1-dev.safetensors": (m.write_safetensors, m.flux("dev"), "flux", "dev", "diffusion_model",
                              ["flux-vae", "clip-l", "t5xxl"]),
    "flux1-schnell.safetensors": (m.write_safetensors, m.flux("schnell"), "flux", "schnell", "diffusion_model",
                                  ["flux-vae", "clip-l", "t5xxl"]),
    "flux1-fill-dev.safetensors": (m.write_safetensors, m.flux("fill"), "flux", "fill", "diffusion_model",
                                   ["flux-vae", "clip-l", "t5xxl"]),
    "flux-original.safetensors": (m.write_safetensors, m.flux("dev", "model.diffusion_model."), "flux", "dev",
                                  "diffusion_model", ["flux-vae", "clip-l", "t5xxl"]),
    "flux-diffusers.safetensors": (m.write_safetensors, m.flux_diffusers(dev=True), "flux", "dev", "diffusion_model",
                                   ["flux-vae", "clip-l", "t5xxl"]),
    "flux-diffusers-schnell.safetensors": (m.write_safetensors, m.flux_diffusers(dev=False), "flux", "schnell",
                                           "diffusion_model", ["flux-vae", "clip-l", "t5xxl"]),
    "flux1-schnell-Q4_K.gguf": (m.write_gguf, QUANT, "flux", "schnell", "diffusion_model",
                                ["flux-vae", "clip-l", "t5xxl"]),
    "chroma-unlocked-v50.safetensors": (m.write_safetensors, m.chroma(), "chroma", "", "diffusion_model",
                                        ["flux-vae", "t5xxl"]),
    "sd1-diffusers-prefixes.safetensors": (m.write_safetensors, m.sd1_diffusers(), "sd1", "", "checkpoint", []),
    "v1-5-pruned-emaonly.safetensors": (m.write_safetensors, m.sd1_original(), "sd1", "", "checkpoint", []),
    "v1-5-pruned-emaonly.ckpt": (m.write_ckpt, m.sd1_original(), "sd1", "", "checkpoint", []),
    "sd1-unet.safetensors": (m.write_safetensors, m.unet_original(768), "sd1", "", "diffusion_model",
                             ["sd-vae", "clip-l"]),
    "sd1-inpainting.safetensors": (m.write_safetensors, m.unet_original(768, in_ch=9), "sd1", "inpaint",
                                   "diffusion_model", ["sd-vae", "clip-l"]),
    "v2-1_768-ema-pruned.safetensors": (m.write_safetensors, m.sd2_original(), "sd2", "", "checkpoint", []),
    "sd_xl_base_1.0.safetensors": (m.write_safetensors, m.sdxl_original(), "sdxl", "", "checkpoint", []),
    "sd_xl_base_1.0-Q8_0.gguf": (m.write_gguf, SDXL_Q8, "sdxl", "", "checkpoint", []),
    "sd_xl_refiner_1.0.safetensors": (m.write_safetensors, m.sdxl_refiner(), "sdxl-refiner", "", "checkpoint", []),
    "sd3_medium.safetensors": (m.write_safetensors, m.sd3_original(), "sd3", "medium", "checkpoint", []),
    "sd3.5_large.safetensors": (m.write_safetensors, m.sd3_large(), "sd3", "large", "diffusion_model",
                                ["flux-vae", "clip-l", "clip-g", "t5xxl"]),
    "z_image_turbo_bf16.safetensors": (m.write_safetensors, m.z_image(), "z-image", "", "diffusion_model",
                                       ["flux-vae", "qwen3-4b"]),
    "qwen_image_fp8.safetensors": (m.write_safetensors, m.qwen_image(), "qwen-image", "", "diffusion_model",
                                   ["wan-vae", "qwen2.5-vl-7b"]),
    "ae.safetensors": (m.write_safetensors, m.sd_vae("", 16), "none", "", "vae", []),
    "clip_l.safetensors": (m.write_safetensors, m.clip_hf("", 768), "none", "", "text_encoder", []),
    "t5xxl_fp16.safetensors": (m.write_safetensors, m.t5xxl(), "none", "", "text_encoder", []),
    "qwen_3_4b.safetensors": (m.write_safetensors, m.qwen3_4b(), "none", "", "text_encoder", []),
    # llama.cpp's GGUF names, which stable-diffusion.cpp converts (src/name_conversion.cpp t5_name_map, llm_name_map):
    # they were "tensors of no known part", so --t5xxl / --llm refused the GGUF files its docs name
    "t5xxl-Q8_0.gguf": (m.write_gguf, m.t5xxl_gguf(), "none", "", "text_encoder", []),
    "Qwen3-4B-Instruct-2507-Q4_K_M.gguf": (m.write_gguf, m.qwen3_4b_gguf(), "none", "", "text_encoder", []),
    "mystery.safetensors": (m.write_safetensors, {"foo.bar.weight": ((4, 4), "F32"), "foo.baz": ((2,), "F32")},
                            "unknown", "", "unknown", []),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("models")
    for name, (writer, spec, *_rest) in CASES.items():
        writer(d / name, spec)
    return d


@pytest.mark.parametrize("name", list(CASES))
def test_every_kind_of_file_gets_its_family_role_and_missing_companions(models, name):
    _writer, spec, family, variant, role, needs = CASES[name]
    r = inspect_model(models / name)
    assert (r.family, r.variant, r.role) == (family, variant, role), r.evidence
    assert [c.kind for c in r.needs] == needs
    assert r.tensors == len(spec)
    assert r.parameters == sum(m._count(shape) for shape, _ in spec.values())
    assert r.evidence or family == "none"


def test_flux_dev_reads_its_real_size_and_names_the_files_it_still_needs(models):
    r = inspect_model(models / "flux1-dev.safetensors")
    assert 11.8e9 < r.parameters < 12.0e9  # FLUX.1 [dev] has 11.9 B parameters
    assert r.size_bytes > 23e9 and (models / "flux1-dev.safetensors").stat().st_blocks * 512 < 10e6  # sparse
    assert r.family_name == "FLUX.1 [dev]" and [w.dtype for w in r.weight_types] == ["BF16"]
    files = {c.kind: c.files for c in r.needs}
    assert files["flux-vae"] == ["ae.safetensors"] and files["clip-l"] == ["clip_l.safetensors"]
    assert "t5xxl_fp16.safetensors" in files["t5xxl"]
    assert any("guidance_in" in e for e in r.evidence) and "get_sd_version" in r.source


@pytest.mark.parametrize("name, kind", [("clip_l.safetensors", "clip-l"), ("t5xxl_fp16.safetensors", "t5xxl"),
                                        ("qwen_3_4b.safetensors", "qwen3-4b"), ("t5xxl-Q8_0.gguf", "t5xxl"),
                                        ("Qwen3-4B-Instruct-2507-Q4_K_M.gguf", "qwen3-4b")])
def test_a_text_encoder_file_is_named_by_its_embedding_in_either_naming(models, name, kind):
    r = inspect_model(models / name)
    assert [(p.component, p.kind, p.prefix) for p in r.parts] == [("text_encoder", kind, "")], r.evidence


def test_gguf_quantization_is_named(models):
    r = inspect_model(models / "flux1-schnell-Q4_K.gguf")
    assert r.quantization == "Q4_K" and {w.dtype for w in r.weight_types} == {"Q4_K", "F32"}


def test_parts_of_a_full_checkpoint_and_of_separate_files(models):
    sdxl = inspect_model(models / "sd_xl_base_1.0.safetensors")
    assert [(p.component, p.kind, p.layout) for p in sdxl.parts] == [
        ("diffusion_model", "sdxl", "original"), ("vae", "sd-vae", "original"),
        ("text_encoder", "clip-l", "original"), ("text_encoder", "clip-g", "original")]
    sd3 = inspect_model(models / "sd3_medium.safetensors")
    assert {p.kind for p in sd3.parts if p.component == "text_encoder"} == {"clip-l", "clip-g", "t5xxl"}
    assert "flux" in inspect_model(models / "ae.safetensors").fits
    assert inspect_model(models / "t5xxl_fp16.safetensors").parts[0].kind == "t5xxl"
    # Qwen3 4B is Z-Image's LLM and FLUX.2 [klein]'s (src/conditioner.hpp LLMEmbedder: QWEN3)
    assert inspect_model(models / "qwen_3_4b.safetensors").fits == ["flux2", "z-image"]


def test_ckpt_names_and_shapes_come_from_the_pickle_without_unpickling(models):
    r = inspect_model(models / "v1-5-pruned-emaonly.ckpt")
    assert r.format == "ckpt" and {w.dtype for w in r.weight_types} == {"F16"}
    same = inspect_model(models / "v1-5-pruned-emaonly.safetensors")
    assert [(p.kind, p.prefix, p.parameters) for p in r.parts] == [(p.kind, p.prefix, p.parameters) for p in same.parts]


def test_ckpt_with_training_state_beside_the_weights(tmp_path):
    r = inspect_model(m.write_ckpt(tmp_path / "sd1-trained.ckpt", m.sd1_original(), extra=True))
    assert (r.family, r.role, r.tensors) == ("sd1", "checkpoint", len(m.sd1_original()))


def test_a_diffusers_folder_is_read_as_stable_diffusion_cpp_prefixes_it(tmp_path):
    spec = m.sd1_diffusers()
    for part, prefix in zip(DIFFUSERS_PARTS, ("unet.", "vae.", "te.")):
        (tmp_path / part).parent.mkdir(parents=True, exist_ok=True)
        m.write_safetensors(tmp_path / part, {k[len(prefix):]: v for k, v in spec.items() if k.startswith(prefix)})
    r = inspect_model(tmp_path)
    assert (r.format, r.family, r.role, r.needs) == ("diffusers", "sd1", "checkpoint", [])
    assert 1.0e9 < r.parameters < 1.1e9  # UNet 860 M + VAE 84 M + CLIP-L 123 M


def test_unknown_file_says_what_it_found(models):
    r = inspect_model(models / "mystery.safetensors")
    assert r.family == "unknown" and "foo.bar (1)" in r.evidence[-1]


def test_a_legacy_pickle_is_unknown_with_the_reason(tmp_path):
    import pickle

    path = tmp_path / "old.ckpt"
    path.write_bytes(b"".join(pickle.dumps(x, protocol=2) for x in (1, 2, {}, {"a": 1}, [])))
    r = inspect_model(path)
    assert r.family == "unknown" and r.parameters is None and "legacy" in r.evidence[0]


def test_bad_files_keep_their_typed_errors(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    with pytest.raises(ModelLoadError, match="not JSON"):
        inspect_model(bad)
    with pytest.raises(ModelLoadError, match="does not exist"):
        accelstack.inspect_model(tmp_path / "missing.safetensors")


def test_public_api_inspects_several_paths_in_order(models):
    got = accelstack.inspect_models([models / "ae.safetensors", models / "flux1-dev.safetensors"])
    assert [r.role for r in got] == ["vae", "diffusion_model"]


def test_shipped_rules_cite_their_sources_and_bad_data_is_refused():
    k = knowledge()
    assert all(k.source(f.source).startswith(("sd.cpp 0.4.7", "Stability-AI")) for f in k.families)
    ids = [f.id for f in k.families]
    for family in ("sd1", "sd2", "sdxl", "sdxl-refiner", "sd3", "flux", "chroma", "z-image", "qwen-image"):
        assert family in ids
    assert ids.index("sdxl") < ids.index("flux") < ids.index("sd1")  # sd.cpp's order: SDXL, Flux, then SD1/SD2
    doc = json.loads(DATA_FILE.read_text())
    doc["families"]["rules"][0]["source"] = "NOWHERE"
    with pytest.raises(EngineError, match="NOWHERE"):
        parse_knowledge(doc)
    doc = json.loads(DATA_FILE.read_text())
    doc["families"]["rules"][0]["needs"]["text_encoders"] = ["no-such-encoder"]
    with pytest.raises(EngineError, match="no-such-encoder"):
        parse_knowledge(doc)


def test_cli_text_and_json(models, tmp_path):
    env = cli_env(tmp_path / "cache", tmp_path)
    out = run_cli(["model", "inspect", models / "flux1-dev.safetensors", models / "v1-5-pruned-emaonly.ckpt"], env)
    assert out.returncode == 0, out.stderr
    assert "flux1-dev.safetensors: FLUX.1 [dev]" in out.stdout
    assert "usually ae.safetensors" in out.stdout and "usually clip_l.safetensors" in out.stdout
    assert "still needs  nothing" in out.stdout  # the SD 1.5 checkpoint holds all its parts
    out = run_cli(["model", "inspect", "--json", models / "flux1-schnell-Q4_K.gguf", models / "mystery.safetensors"], env)
    lines = out.stdout.strip().splitlines()
    assert out.returncode == 0 and len(lines) == 1, out.stderr
    line = json.loads(lines[0])
    jsonschema.validate(line["result"], schemas.load("model"))
    assert [r["family"] for r in line["result"]["models"]] == ["flux", "unknown"]
    assert line["result"]["models"][0]["quantization"] == "Q4_K"


def test_cli_exit_codes(models, tmp_path):
    env = cli_env(tmp_path / "cache", tmp_path)
    missing = run_cli(["model", "inspect", tmp_path / "nope.safetensors", "--json"], env)
    assert missing.returncode == 2 and json.loads(missing.stdout)["event"] == "error"
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    assert run_cli(["model", "inspect", bad], env).returncode == 1
    assert run_cli(["model", "inspect"], env).returncode == 2


@pytest.mark.parametrize("name", ["flux1-dev.safetensors", "flux1-schnell-Q4_K.gguf"])
def test_a_header_is_read_once_per_process_while_the_file_is_unchanged(tmp_path, monkeypatch, name):
    """One `generate` checked the same model's header up to 8 times (the CLI's and the engine's
    component checks, inspection, the memory planner): ~35 ms on the FLUX.1 probe before the worker
    started. A changed file (same path, new bytes) is read again."""
    from accelstack.engine.models import gguf_check, safetensors_check
    from accelstack.engine.models import reader as model_io
    from accelstack.limits import parse_json

    writer, spec, family, *_ = CASES[name]
    path = writer(tmp_path / name, spec)
    reads = []
    if name.endswith(".safetensors"):
        monkeypatch.setattr(safetensors_check, "parse_json", lambda *a, **k: reads.append(1) or parse_json(*a, **k))
    else:
        real = gguf_check._read_index

        def counted(*a, **k):
            reads.append(1)
            return real(*a, **k)
        monkeypatch.setattr(gguf_check, "_read_index", counted)
    model_io.forget_indexes()
    for _ in range(3):
        assert inspect_model(path).family == family
    assert len(reads) == 1
    # rewritten in place: another family, same name
    other = CASES["chroma-unlocked-v50.safetensors"] if name.endswith(".safetensors") else None
    if other is not None:
        other[0](path, other[1])
        assert inspect_model(path).family == "chroma"
        assert len(reads) == 2
