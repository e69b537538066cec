"""The --json contract (docs/json.md): JSON Lines, one final line, schemas, exit codes.

Every test in the suite that reads --json output through cli_helpers (or installer_helpers)
validates it against the shipped schemas; this file covers what the others do not: the schema
files themselves, every command's schema existing, the commands that are cheap to run whole,
and the exit codes that must be the same across commands.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from accelstack import schemas
from accelstack.cli import COMMANDS
from accelstack.commands.common import FORMAT_VERSION

from cli_helpers import error_of, events_of, json_lines, result_of, run_cli

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "tests" / "fixtures" / "captures"


@pytest.fixture
def env(tmp_path):
    return {"ACCELSTACK_HOME": str(tmp_path / "home"), "ACCELSTACK_CACHE": str(tmp_path / "cache"),
            "ACCELSTACK_CONFIG": str(tmp_path / "config")}


def test_shipped_schemas_are_current_and_valid():
    expected = schemas.expected_files()
    for name, schema in expected.items():
        path = schemas.HERE / name
        assert path.exists(), f"{name} is missing: run `python -m accelstack.schemas`"
        assert path.read_text(encoding="utf-8") == schemas.dumps(schema), \
            f"{name} is out of date with the result types: run `python -m accelstack.schemas`"
        Draft202012Validator.check_schema(json.loads(path.read_text(encoding="utf-8")))
    shipped = {p.name for p in schemas.HERE.glob("*.json")}
    assert shipped == set(expected), f"stale schema files: {sorted(shipped - set(expected))}"
    assert schemas.FORMAT_VERSION == FORMAT_VERSION


def test_every_command_has_a_documented_result_schema():
    docs = (REPO / "docs" / "json.md").read_text(encoding="utf-8")
    for command in COMMANDS:
        assert command in schemas.COMMANDS, f"`accelstack {command}` has no result schema"
        assert f"result-{command}.schema.json" in docs, f"docs/json.md does not list {command}'s schema"
    for code in ("0", "1", "2", "3", "130"):
        assert f"| {code} " in docs


@pytest.mark.parametrize("capture", sorted(p.name for p in CAPTURES.iterdir() if (p / "capture.json").exists()))
def test_detect_and_plan_of_real_machines_match_their_schemas(capture, env):
    rc, out, err = run_cli(["detect", "--replay", CAPTURES / capture, "--json"], env)
    assert rc == 0, err
    assert result_of(out)["source"].startswith("replay")
    for stack in ("ggml", "torch"):
        rc, out, err = run_cli(["plan", "--stack", stack, "--replay", CAPTURES / capture, "--json"], env)
        final = json_lines(out)[-1]
        assert final["event"] == "result", final
        assert rc == (0 if final["ok"] else 3), (rc, final["result"]["status"], err[-500:])


def test_json_flag_before_or_after_the_command_and_one_line(env):
    rc1, out1, _ = run_cli(["--json", "completion", "bash"], env)
    rc2, out2, _ = run_cli(["completion", "bash", "--json"], env)
    assert rc1 == rc2 == 0
    assert len(out1.splitlines()) == 1 and json.loads(out1) == json.loads(out2)
    assert result_of(out1)["script"].startswith("# bash completion for accelstack")


def test_home_commands_on_an_empty_home(env, tmp_path):
    rc, out, err = run_cli(["status", "--json"], env)
    assert rc == 0, err
    assert result_of(out)["home"] == str(tmp_path / "home")
    rc, out, err = run_cli(["gc", "--json"], env)
    assert rc == 0, err
    result_of(out)
    rc, out, err = run_cli(["channel", "list", "--json"], env)
    assert rc == 0 and isinstance(result_of(out)["channels"], list), err
    rc, out, _ = run_cli(["rollback", "--json"], env)
    assert rc == 1 and error_of(out)["code"] and error_of(out)["message"]


@pytest.mark.parametrize("args, code", [
    (["detect", "--no-such-option"], 2),
    (["generate", "-m", "x.safetensors", "-p", "cat", "-W", "500"], 2),
    (["generate", "-m", "x.safetensors", "-p", "cat", "--steps", "0"], 2),
    (["generate", "-m", "x.safetensors", "-p", "cat", "--sampler", "magic"], 2),
    (["channel"], 2),
    (["manifest"], 2),
    (["no-such-command"], 2),
    ([], 2),
    (["verify", "--threads", "many"], 2),
    (["install", "--stack", "torch", "--backend", "cuda", "--dry-run", "--replay", str(CAPTURES / "macos-apple-m3")], 3),
    (["detect", "--replay", "/nonexistent/capture"], 2),  # a missing input is a usage error (issue 25)
])
def test_exit_codes_are_the_same_across_commands(args, code, env):
    rc, out, err = run_cli(args + ["--json"], env)
    assert rc == code, (out, err)
    final = error_of(out)
    assert final["ok"] is False and final["format_version"] == FORMAT_VERSION and final["message"]
    rc_text, out_text, err_text = run_cli(args, env)  # the same without --json: words on stderr, same code
    assert rc_text == code and "Traceback" not in err_text
    assert not out_text.strip() or code == 2  # only a bare `accelstack` prints its help on stdout


def test_version_and_quiet_flags(env):
    from accelstack import __version__

    rc, out, _ = run_cli(["-V"], env)
    assert rc == 0 and out.strip() == f"accelstack {__version__}"
    rc, out, err = run_cli(["plan", "-q", "--json"], env)
    assert rc in (0, 3) and not events_of(out) and "Traceback" not in err
    rc, out, err = run_cli(["--debug", "detect", "--replay", "/nonexistent/capture"], env)
    assert rc != 0 and "Traceback" in err  # --debug shows where an error came from
