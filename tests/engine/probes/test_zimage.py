"""Z-Image on the real CPU build: its whole DiT stored Q4_0 in GGUF (engine.probes.gguf), from one file and
from the files users run it from (a GGUF DiT, the Flux VAE, a Qwen3 GGUF in llama.cpp's names for --llm),
with a LoRA in the names Z-Image LoRAs ship in; an embedding and a ControlNet refused before any worker."""
from __future__ import annotations

import pytest
from companion_files import check_refuses_embedding_and_controlnet, dit_lora

from accelstack.engine import generation
from accelstack.engine.models.inspection import inspect_model
from accelstack.engine.png import read_png
from accelstack.engine.probes.families import family_spec
from accelstack.engine.probes.family_files import ensure_family_probe
from accelstack.engine.probes.gguf import quantized_prefixes, write_gguf
from accelstack.engine.probes.weights import Pools, write_parts
from accelstack.engine.probes.zimage import ZIMAGE_QUANTIZED
from accelstack.engine.worker.protocol import GenerateRequest

SEED = 7
REQUEST = dict(prompt="a lighthouse", width=64, height=64, steps=1, seed=5, cfg_scale=1.0)


@pytest.fixture(scope="module")
def zimage(module_tmp) -> str:
    """The Z-Image probe (3.7 GB), made once for this module."""
    return ensure_family_probe("z-image", SEED, module_tmp / "zimage", keep=True).path


@pytest.fixture(scope="module")
def plain(cpu_runtime, zimage, module_tmp) -> bytes:
    out = module_tmp / "plain.png"
    generation.generate(cpu_runtime, zimage, GenerateRequest(**REQUEST), out)
    return read_png(out).rgb()


def test_zimage_from_a_gguf_dit_the_vae_and_a_qwen3_gguf_is_the_checkpoints_image(cpu_runtime, zimage, plain, tmp_path):
    # The files of stable-diffusion.cpp's docs/z_image.md: --diffusion-model z_image_turbo-Q4_0.gguf, --vae
    # ae.safetensors, --llm Qwen3-4B-Q4_0.gguf, the last in llama.cpp's GGUF names (token_embd, blk.N.attn_q),
    # which stable-diffusion.cpp converts. The same seed writes the same values under any prefix, so the
    # three files hold the probe's tensors: the same pixels.
    parts = family_spec("z-image").parts()
    pools = Pools(SEED, "F16")
    dit, vae, llm = tmp_path / "z_image_turbo-Q4_0.gguf", tmp_path / "ae.safetensors", tmp_path / "Qwen3-4B-Q4_0.gguf"
    write_gguf(dit, {"model.diffusion_model.": parts["model.diffusion_model."]}, pools, {}, lambda n: None,
               quantized_prefixes(ZIMAGE_QUANTIZED))
    write_parts(vae, {"": parts["vae."]}, pools, {}, lambda n: None)
    write_gguf(llm, {"": parts["text_encoders.llm."]}, pools, {}, lambda n: None, lambda name, shape: True)
    found = inspect_model(str(llm))
    assert [(p.component, p.kind) for p in found.parts] == [("text_encoder", "qwen3-4b")], found.evidence
    out = tmp_path / "split.png"
    report = generation.generate(cpu_runtime, None, GenerateRequest(**REQUEST, diffusion_model=str(dit), vae=str(vae),
                                                                    llm=str(llm)), out)
    assert report.components == {"diffusion_model": dit.name, "vae": vae.name, "llm": llm.name}
    assert read_png(out).rgb() == plain


def test_a_zimage_lora_in_diffusers_block_names_applies(cpu_runtime, zimage, plain, tmp_path):
    # Z-Image LoRAs name the attention's to_q/to_k/to_v and to_out.0 (diffusers' Lumina 2 names), which
    # stable-diffusion.cpp maps onto slices of the fused qkv and onto out (src/name_conversion.cpp
    # convert_diffusers_dit_to_original_lumina2). Our check read them as matching nothing and refused.
    loras = tmp_path / "loras"
    loras.mkdir()
    dit_lora(loras / "zstyle.safetensors", {"layers.0.attention.to_q": (3840, 3840), "layers.0.attention.to_v": (3840, 3840),
                                            "layers.0.attention.to_out.0": (3840, 3840),
                                            "layers.1.feed_forward.w2": (3840, 10240)}, "comfy", 23)
    out = tmp_path / "styled.png"
    report = generation.generate(cpu_runtime, zimage, GenerateRequest(**dict(REQUEST, prompt="a lighthouse <lora:zstyle:1.0>"),
                                                                      lora_dir=str(loras)), out)
    assert [(lora.name, lora.tensors) for lora in report.loras] == [("zstyle", 3)]  # to_q and to_v: one qkv weight
    assert read_png(out).rgb() != plain  # stable-diffusion.cpp applied it, not only our check
    assert "LoRA: zstyle:1" in read_png(out).text["parameters"]


def test_zimage_refuses_an_embedding_and_a_controlnet_before_any_worker(cpu_runtime, zimage, tmp_path, monkeypatch):
    check_refuses_embedding_and_controlnet(cpu_runtime, zimage, REQUEST, tmp_path, monkeypatch)
