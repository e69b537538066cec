"""Per-family defaults as data (issue 44): what a request leaves out is the family's reference value
(Flux: cfg 1 with distilled guidance 3.5, not SD's cfg 7 with no guidance), a value given always wins,
and the PNG's parameters record what was used. --guidance, --flow-shift and --clip-skip in the CLI."""
from __future__ import annotations

import json
import re

import pytest

from accelstack.engine import generation
from accelstack.engine.errors import EngineError, InvalidRequestError
from accelstack.engine.models.settings import DEFAULT_KEYS, SETTINGS_FILE, _parse, family_settings
from accelstack.engine.png import read_png
from accelstack.engine.request.check import check_generation
from accelstack.engine.runtime import TORCH
from accelstack.engine.worker.protocol import GenerateRequest
from accelstack.engine.worker.values import is_given

from cli_helpers import json_lines
from engine_helpers import cli_env, run_cli


@pytest.fixture(scope="module")
def flux(tmp_path_factory):
    from accelstack.engine.probes.family_files import ensure_family_probe

    return ensure_family_probe("flux", 1234, tmp_path_factory.mktemp("flux"), keep=True).path


def _checked(model, tmp_path, traits=None, **kw):
    request = GenerateRequest(prompt="a lighthouse", width=64, height=64, **kw)
    extra = {"traits": traits} if traits else {}
    return check_generation(request, model, tmp_path / "o.png", **extra).request


def test_every_family_default_is_data_with_its_source():
    doc = json.loads(SETTINGS_FILE.read_text())
    for family, node in doc["families"].items():
        assert node["source"] in doc["sources"] and set(node["defaults"]) <= set(DEFAULT_KEYS), family
    assert family_settings()["flux"].defaults == {"cfg_scale": 1.0, "guidance": 3.5, "sampler": "euler", "steps": 20}
    assert "docs/flux.md" in family_settings()["flux"].source
    with pytest.raises(EngineError, match="flux.defaults.cfg"):
        _parse({"sources": {"S": "s"}, "families": {"flux": {"size_multiple": 8, "size_source": "S", "source": "S",
                                                             "defaults": {"cfg": 1}}}})


def test_flux_runs_at_cfg_1_with_guidance_3_5(flux, tmp_path):
    request = _checked(flux, tmp_path)
    assert (request.cfg_scale, request.guidance, request.sampler, request.steps) == (1.0, 3.5, "euler", 20)
    assert is_given(request.cfg_scale) and is_given(request.steps)  # concrete values from here on


def test_a_value_given_always_wins_even_the_engines_default(flux, tmp_path):
    request = _checked(flux, tmp_path, cfg_scale=7.0, guidance=2.0, steps=4, sampler="euler_a")
    assert (request.cfg_scale, request.guidance, request.steps, request.sampler) == (7.0, 2.0, 4, "euler_a")


def test_sd1_keeps_the_engine_defaults_and_no_guidance(probe_model, tmp_path):
    request = _checked(probe_model.path, tmp_path)
    assert (request.cfg_scale, request.steps, request.guidance, request.sampler) == (7.0, 20, None, "default")


def test_the_diffusers_stack_takes_the_engine_defaults(flux, tmp_path):
    request = _checked(flux, tmp_path, traits=TORCH)
    assert (request.cfg_scale, request.steps, request.guidance) == (7.0, 20, None)


@pytest.mark.parametrize("field,value", [("guidance", -1.0), ("guidance", float("nan")), ("guidance", 1e9),
                                         ("flow_shift", 0.0), ("flow_shift", float("inf")), ("guidance", "3")])
def test_bad_guidance_and_flow_shift_are_refused_naming_the_flag(field, value):
    with pytest.raises(InvalidRequestError, match="--" + field.replace("_", "-")):
        GenerateRequest(prompt="x", **{field: value}).validate()


def test_the_cli_takes_guidance_flow_shift_and_clip_skip(probe_model, flux, tmp_path):
    from accelstack.cli import build_parser
    from accelstack.commands.generate import prepare

    base = ["generate", "-p", "a lighthouse", "-W", "64", "-H", "64", "-o", str(tmp_path / "o.png")]
    request, _ = prepare(build_parser().parse_args([*base, "-m", probe_model.path, "--clip-skip", "2"]))
    assert request.clip_skip == 2 and request.cfg_scale == 7.0
    request, _ = prepare(build_parser().parse_args([*base, "-m", flux, "--guidance", "2.5", "--flow-shift", "1.5"]))
    assert (request.cfg_scale, request.guidance, request.flow_shift) == (1.0, 2.5, 1.5)
    request, _ = prepare(build_parser().parse_args([*base, "-m", flux, "--cfg-scale", "7"]))
    assert (request.cfg_scale, request.guidance) == (7.0, 3.5)


def test_the_cli_refuses_a_bad_guidance_with_exit_2_and_one_json_line(probe_model, cache_with_probe, tmp_path):
    env = cli_env(cache_with_probe, tmp_path)
    r = run_cli(["generate", "-m", probe_model.path, "-p", "cat", "-W", "64", "-H", "64", "--guidance", "-3",
                 "-o", tmp_path / "o.png", "--json"], env)
    assert r.returncode == 2, (r.stdout, r.stderr)
    final = json_lines(r.stdout)[-1]
    assert final["error"] == "InvalidRequestError" and "--guidance" in final["message"]


def test_the_png_records_the_flux_settings_used(cpu_runtime, flux, tmp_path):
    out = tmp_path / "flux.png"
    report = generation.generate(cpu_runtime, flux, GenerateRequest(prompt="a lighthouse", width=64, height=64, steps=1,
                                                                    seed=5), out)
    text = read_png(out).text["parameters"]
    assert "CFG scale: 1.0" in text and "Guidance: 3.5" in text and "Sampler: euler" in text, text
    assert (report.cfg_scale, report.guidance) == (1.0, 3.5)
    # the runtime's own version and a cheap identity of the model file (not a full sha256: engine.request.identity)
    # (this CPU build, made from the bindings' sdist without git, calls itself "unknown unknown": said as it is)
    assert any(part.startswith("Runtime: ") for part in text.split(", ")), text
    assert re.search(r"Model hash: [0-9a-f]{12} \(sha256-ends\)", text), text


def test_the_identity_tells_files_apart_by_their_ends(tmp_path):
    from accelstack.engine.request.identity import END_BYTES, file_identity

    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    a.write_bytes(b"x" * (3 * END_BYTES))
    b.write_bytes(b"x" * (3 * END_BYTES - 1) + b"y")
    assert file_identity(str(a)) != file_identity(str(b)) and len(file_identity(str(a)) or "") == 12
    assert file_identity(str(tmp_path)) is None and file_identity(str(tmp_path / "none")) is None
