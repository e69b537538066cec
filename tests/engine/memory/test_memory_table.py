"""Known-good configurations are never refused (issue 45): SD 1.5, SDXL and FLUX.1 (bf16, Q8_0, Q4_K, with
T5-XXL in fp16 or Q8_0) at 1024x1024 on 4, 6, 8, 12, 16 and 24 GiB GPUs with 32 GiB of RAM, every file
synthesized at its real size from headers only (test_memory_plan's helpers). The decisions are written out
in docs/memory-table.md (rewrite it with ACCELSTACK_WRITE_TABLE=1 when the planner changes on purpose),
and checked against what stable-diffusion.cpp's docs and users report working:

- FLUX.1 q4 on 8 GB with offload (docs/flux.md's q4_k: 6395 MB);
- SDXL at 1024x1024 on 6 GB with VAE tiling;
- FLUX.1 on 4-6 GB with offload and the text encoders on the CPU (docs/flux.md: "a GPU that has 6GB or even 4GB",
  its examples run --clip-on-cpu; q4_k's 6.4 GB of weights are streamed in max_vram segments below that).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List

import model_specs as m
import pytest
from test_memory_levers import quantized
from test_memory_plan import GIB, _gpu, flux_files, sd1_file, sdxl_file

from accelstack.engine.memory.plan import MemoryPlan

TABLE = Path(__file__).resolve().parents[3] / "docs" / "memory-table.md"
SIZES = (4, 6, 8, 12, 16, 24)
RAM = 32


def _t5_q8(folder: Path) -> str:
    spec = dict(m.t5xxl_gguf())
    missing = 4_762_310_656 - 32128 * 4096 - 4096 - (4096 * 4096 + 10240 * 4096)  # T5-XXL's encoder, as flux_files
    spec["enc.blk.1.ffn_up.weight"] = ((missing // 4096, 4096), "Q8_0")
    return str(m.write_gguf(folder / "t5xxl_q8_0.gguf", spec))


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Dict[str, List[str]]:
    d = tmp_path_factory.mktemp("table")
    f = flux_files(d)
    q8 = str(m.write_gguf(d / "flux1-dev-q8_0.gguf", quantized(m.flux("dev"), "Q8_0")))
    q4 = str(m.write_gguf(d / "flux1-dev-q4_k.gguf", quantized(m.flux("dev"), "Q4_K")))
    t5q8 = _t5_q8(d)
    out = {"SD 1.5 fp16": [str(sd1_file(d))], "SDXL fp16": [str(sdxl_file(d))]}
    for name, dm in (("bf16", f["model"]), ("Q8_0", q8), ("Q4_K", q4)):
        for t5name, t5 in (("T5 fp16", f["t5xxl"]), ("T5 Q8_0", t5q8)):
            out[f"FLUX.1-dev {name}, {t5name}"] = [dm, f["vae"], f["clip_l"], t5]
    return out


def _cell(p: MemoryPlan) -> str:
    levers = ["offload" if p.offload_to_cpu else "", "TE on CPU" if p.keep_clip_on_cpu else "",
              f"tiles {p.vae_tile_size}" if p.vae_tiling else "", "VAE on CPU" if p.keep_vae_on_cpu else "",
              f"max_vram {p.max_vram:g}" if p.max_vram else "", p.weight_type if p.weight_type != "default" else ""]
    words = ", ".join(x for x in levers if x) or "as stored, all on the GPU"
    return f"{words} ({p.vram_need / GIB:.1f} GiB)"


def _table(models: Dict[str, List[str]]) -> Dict[str, Dict[int, MemoryPlan]]:
    return {name: {v: _gpu(files, 1024, v, ram=RAM * GIB) for v in SIZES} for name, files in models.items()}


def test_no_known_good_configuration_is_refused_and_the_table_is_written_out(models):
    plans = _table(models)  # a refusal would raise InsufficientMemoryError here
    lines = ["# What `auto` decides at 1024x1024 (issue 45)", "",
             f"Written by tests/engine/memory/test_memory_table.py: the memory planner's decision for each model on a GPU with "
             f"this much free memory and {RAM} GiB of RAM (files synthesized at their real sizes), the estimated "
             "VRAM peak in brackets. TE: the text encoders. Estimates, not measurements: no GPU run has checked "
             "them yet (scripts/device-check.sh is ready for one).", "",
             "| model | " + " | ".join(f"{v} GiB" for v in SIZES) + " |", "|---|" + "---|" * len(SIZES)]
    for name, row in plans.items():
        lines.append(f"| {name} | " + " | ".join(_cell(row[v]) for v in SIZES) + " |")
        for v, p in row.items():
            assert p.fits and p.vram_need <= v * GIB and p.ram_need <= RAM * GIB, (name, v)
    text = "\n".join(lines) + "\n"
    if os.environ.get("ACCELSTACK_WRITE_TABLE"):
        TABLE.write_text(text, encoding="utf-8")
    assert TABLE.read_text(encoding="utf-8") == text, "the planner's decisions changed: rewrite docs/memory-table.md " \
        "with ACCELSTACK_WRITE_TABLE=1 and check the differences"


def test_what_users_run_is_what_the_planner_picks(models):
    flux_q4 = _gpu(models["FLUX.1-dev Q4_K, T5 fp16"], 1024, 8, ram=RAM * GIB)
    assert flux_q4.offload_to_cpu and flux_q4.weight_type == "default" and not flux_q4.max_vram  # q4 on 8 GB, offloaded
    sdxl6 = _gpu(models["SDXL fp16"], 1024, 6, ram=RAM * GIB)
    assert sdxl6.vae_tiling and sdxl6.weight_type == "default"  # SDXL 1024x1024 on 6 GB with VAE tiling
    for vram in (4, 6):
        small = _gpu(models["FLUX.1-dev Q4_K, T5 fp16"], 1024, vram, ram=RAM * GIB)
        assert small.fits and small.offload_to_cpu and small.weight_type == "default"  # not converted: streamed
    for name in models:
        assert _gpu(models[name], 1024, 24, ram=RAM * GIB).weight_type == "default"  # 24 GB converts nothing
