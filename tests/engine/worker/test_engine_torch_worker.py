"""The torch generation worker, end to end: a real venv with torch + diffusers, the real worker
under the venv's interpreter (where accelstack is not installed), the real probe model.

The venv is conftest's ``torch_venv``, built once for the engine tests; where it cannot be built
(no torch wheel, no network), the module skips.
"""
from __future__ import annotations

import sys

import pytest

from accelstack.engine import GenerateRequest, Runtime, Supervisor
from accelstack.engine.errors import ModelLoadError
from accelstack.engine.generation import generate

from cli_helpers import result_of
from engine_helpers import cli_env, run_cli


@pytest.fixture(scope="module")
def torch_sup(torch_venv, probe_model):
    runtime = Runtime.torch(torch_venv).check()
    assert runtime.python and runtime.backend == "torch"
    with Supervisor(runtime, model=probe_model.path) as sup:
        yield sup


def _req(**kw) -> GenerateRequest:
    base = dict(prompt="a lighthouse", width=64, height=64, steps=1, seed=42, sampler="euler", scheduler="discrete")
    base.update(kw)
    return GenerateRequest(**base)


def test_torch_worker_generates_deterministically_on_cpu(torch_sup):
    status = torch_sup.status()
    assert status.phase == "ready" and status.load_seconds and status.load_seconds > 0
    assert status.device is not None and status.device.name == "cpu"  # no GPU torch here
    assert "torch" in status.runtime_version and "diffusers" in status.runtime_version

    first = torch_sup.generate(_req())
    second = torch_sup.generate(_req())
    assert len(first.images) == 1
    img = first.images[0]
    assert (img.width, img.height, img.seed) == (64, 64, 42)
    pixels = img.pixels
    assert len(pixels) == 64 * 64 * 3
    assert len(set(pixels)) > 1, "constant image"
    assert second.images[0].pixels == pixels, "same seed, different bytes"
    assert first.device is not None and first.device.name == "cpu" and first.device.kind == "cpu"
    assert first.steps == 1 and first.sampling_seconds > 0 and first.load_seconds
    assert (first.sampler, first.scheduler) == ("euler", "discrete")
    sys.stderr.write(f"\n[torch worker: load {first.load_seconds:.2f} s, step {first.step_seconds:.2f} s, "
                     f"job {first.seconds:.2f} s]\n")

    other = torch_sup.generate(_req(seed=7, width=72))
    assert other.images[0].width == 72 and other.images[0].pixels != pixels


def test_torch_worker_rejects_what_it_cannot_do(torch_sup):
    from accelstack.engine.errors import GenerationError

    with pytest.raises(GenerationError) as exc:
        torch_sup.generate(_req(sampler="ipndm"))
    assert "ipndm" in str(exc.value) and "torch worker" in str(exc.value)
    assert torch_sup.status().phase == "ready"  # the worker stays usable


def test_torch_worker_missing_model_is_a_clear_error(torch_venv, tmp_path):
    runtime = Runtime.torch(torch_venv)
    missing = tmp_path / "nope" / "model.safetensors"
    with pytest.raises(ModelLoadError) as exc:  # the worker's own check
        Supervisor(runtime, model=str(missing)).start()
    assert str(missing) in exc.value.message and "does not exist" in exc.value.message
    with pytest.raises(ModelLoadError) as exc:  # the library checks before any process starts
        generate(runtime, missing, _req(), tmp_path / "out.png")
    assert str(missing) in exc.value.message and exc.value.hint


def test_generate_cli_with_backend_torch(torch_venv, probe_model, tmp_path):
    out = tmp_path / "torch.png"
    args = ["generate", "--backend", "torch", "--runtime", torch_venv, "-m", probe_model.path, "-p", "a cat",
            "-W", 64, "-H", 64, "--steps", 1, "--seed", 3, "-o", out, "--json"]
    res = run_cli(args, cli_env(tmp_path / "cache", tmp_path), timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    report = result_of(res.stdout)
    assert report["images"] == [str(out)] and report["seeds"] == [3]
    assert report["device"]["name"] == "cpu" and report["width"] == 64
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and b"parameters" in data and b"(diffusers)" in data
