"""Issue 44: ``verify --model`` on a quantized file said the runtime ran "this family's kernels" while the
family's probe ran F16 weights (stored F8_E5M2, widened to F16 on load: src/model.cpp) and the Q4_K / Q8_0
kernels the file needs were never exercised. The verdict now names, per model, which of the file's weight
types the probe ran and which it did not."""
from __future__ import annotations

import pytest
from model_specs import flux, write_gguf, write_safetensors

from accelstack.engine.probes.families import probe_families_of
from accelstack.engine.verification.kernels import kernel_coverage, kernel_type

from cli_helpers import result_of
from engine_helpers import cli_env, run_cli


def test_each_stored_type_runs_as_what_stable_diffusion_cpp_loads_it_as():
    """src/model.cpp load_tensors: F8_E4M3 and F8_E5M2 are widened to F16, F64 to F32; others load as stored."""
    assert [kernel_type(t) for t in ("F8_E4M3", "F8_E5M2", "F64", "Q4_K", "BF16", "F16")] == \
        ["F16", "F16", "F32", "Q4_K", "BF16", "F16"]


BLOCK = {"Q4_K": 256, "Q8_0": 32}


def quantized_flux(dtype: str):
    """FLUX.1 [dev] as quantized GGUF files have it: the matrices whose rows fill ``dtype``'s blocks in it,
    the others F16, the 1-D tensors F32 (the shapes a GGUF allows: a row a whole number of blocks)."""
    out = {}
    for name, (shape, _) in flux("dev", dtype="F16").items():
        out[name] = (shape, "F32" if len(shape) == 1 else dtype if shape[-1] % BLOCK[dtype] == 0 else "F16")
    return out


@pytest.mark.parametrize("dtype, ran, not_run", [("Q4_K", ["F16"], ["Q4_K", "F32"]), ("Q8_0", [], ["Q8_0", "F32"]),
                                                 ("F8_E4M3", ["F16"], []), ("BF16", [], ["BF16"])])
def test_the_coverage_names_the_file_s_kernels_the_probe_did_not_run(dtype, ran, not_run, tmp_path):
    if dtype in BLOCK:
        path = write_gguf(tmp_path / f"flux1-dev-{dtype}.gguf", quantized_flux(dtype))
    else:
        path = write_safetensors(tmp_path / "flux1-dev.safetensors", flux("dev", dtype=dtype))
    (model,) = probe_families_of([str(path)])
    cov = kernel_coverage(model)
    assert (cov.ran, cov.not_run, cov.probe_types) == (ran, not_run, ["F16"])
    if not_run:
        assert f"its {', '.join(not_run)} weights were not run" in cov.statement
        assert "this family's kernels" not in cov.statement
    else:
        assert "every weight type this file loads as (F16)" in cov.statement


def test_verify_model_on_a_q4_k_file_says_its_kernels_were_not_run(cpu_runtime, tmp_path):
    gguf = write_gguf(tmp_path / "flux1-dev-Q4_K.gguf", quantized_flux("Q4_K"))
    res = run_cli(["verify", "--runtime", cpu_runtime.path, "--model", str(gguf), "--json"],
                  cli_env(tmp_path / "cache", tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    model = result_of(res.stdout)["models"][0]
    assert model["kernels"]["not_run"] == ["Q4_K", "F32"] and model["kernels"]["probe"] == ["F16"]
    assert "Q4_K, F32 weights were not run" in model["statement"] and "not loaded" in model["statement"]
    text = run_cli(["verify", "--runtime", cpu_runtime.path, "--model", str(gguf)], cli_env(tmp_path / "cache", tmp_path))
    assert "Q4_K, F32 weights were not run" in text.stdout
