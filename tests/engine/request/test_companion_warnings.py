"""Companions the family needs (issue 44): Flux without --t5xxl ran silently (stable-diffusion.cpp puts zeros
in T5's place) while `model inspect` said T5-XXL is needed; now a warning in the result and on the
terminal names the flag and the usual file. What the engine cannot run without stays a refusal."""
from __future__ import annotations

import pytest

from accelstack.engine.request.check import check_generation
from accelstack.engine.worker.protocol import GenerateRequest

from engine_helpers import cli_env, run_cli


@pytest.fixture(scope="module")
def flux(tmp_path_factory):
    from accelstack.engine.probes.family_files import ensure_family_probe

    return ensure_family_probe("flux", 1234, tmp_path_factory.mktemp("flux"), keep=True).path


def _warnings(model, tmp_path, **kw):
    request = GenerateRequest(prompt="a fox", width=64, height=64, **kw)
    return check_generation(request, model, tmp_path / "o.png").warnings


def test_flux_without_t5xxl_is_warned_naming_the_usual_file(flux, tmp_path):
    warnings = _warnings(flux, tmp_path)
    assert len(warnings) == 1 and "FLUX.1" in warnings[0] and "T5-XXL" in warnings[0], warnings
    assert "--t5xxl t5xxl_fp16.safetensors" in warnings[0]


def test_a_whole_sd1_checkpoint_needs_nothing_more(probe_model, tmp_path):
    assert _warnings(probe_model.path, tmp_path) == []


def test_the_result_and_the_terminal_say_it(cpu_runtime, flux, cache_with_probe, tmp_path):
    env = cli_env(cache_with_probe, tmp_path)
    r = run_cli(["generate", "--runtime", cpu_runtime.path, "-m", flux, "-p", "a fox", "-W", "64", "-H", "64",
                 "--steps", "1", "-o", tmp_path / "fox.png"], env)
    assert r.returncode == 0, r.stderr
    assert "warning: FLUX.1 normally runs with its T5-XXL text encoder" in r.stdout, r.stdout
    assert "add --t5xxl t5xxl_fp16.safetensors" in r.stdout
    assert "cfg 1, guidance 3.5" in r.stdout  # the family's settings (test_family_defaults)
