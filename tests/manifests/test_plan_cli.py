"""`accelstack plan`: the decision first, then the rejected candidates; JSON that loads back as a Plan."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from accelstack.cli import main
from accelstack.manifests import Plan
from accelstack.serde import from_dict, to_dict

from ._factory import CAPTURES, EXAMPLE_GGML, fixture_names, machine, nvidia
from cli_helpers import result_of

NEEDS_CAPTURES = pytest.mark.skipif("linux-nvidia-rtx4070-550" not in fixture_names(), reason="replay captures not present")


@pytest.fixture
def report_file(tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(to_dict(machine(nvidia(name="NVIDIA GeForce RTX 5090", cc="12.0", vram=32), python="3.11"))))
    return path


def test_human_output_decision_then_rejections(report_file, capsys):
    assert main(["plan", "--stack", "torch", "--hardware", str(report_file)]) == 0
    out = capsys.readouterr().out
    assert out.index("decision: torch 2.15 (cu132)") < out.index("install:") < out.index("rejected:")
    assert "$ python -m pip install 'torch==2.15.*'\n" in out  # PyPI's own Linux wheel is the cu132 build
    assert "cu126 rejected: torch 2.6\u20132.14 cu126 builds have no kernels for sm_120" in out


def test_impossible_request_exits_3_and_says_what_works(report_file, capsys):
    assert main(["plan", "--stack", "torch", "--hardware", str(report_file), "torch<2.7"]) == 3
    out = capsys.readouterr().out
    assert "cannot be met as asked:" in out and "What would work: torch 2.15 cu132, torch 2.15 cu130" in out


def test_json_round_trips(report_file, capsys):
    assert main(["plan", "--stack", "torch", "--hardware", str(report_file), "--python", "3.9", "--json"]) == 0
    doc = result_of(capsys.readouterr().out)
    plan = from_dict(Plan, doc)
    assert plan.variant == "cu129" and plan.torch_version == "2.8" and plan.request.python == "3.9"


def test_backend_from_environment_and_option(report_file, capsys, monkeypatch):
    monkeypatch.setenv("ACCELSTACK_BACKEND", "cpu")
    assert main(["plan", "--stack", "torch", "--hardware", str(report_file), "--json"]) == 0
    assert result_of(capsys.readouterr().out)["backend"] == "cpu"
    assert main(["plan", "--stack", "torch", "--hardware", str(report_file), "--backend", "cu128", "--json"]) == 0
    assert result_of(capsys.readouterr().out)["variant"] == "cu128"  # the option wins over the environment


def test_unknown_backend_is_a_usage_error(report_file, capsys, monkeypatch):
    assert main(["plan", "--stack", "torch", "--hardware", str(report_file), "--backend", "cuad"]) == 2
    assert "'cuad' is not a torch backend or variant" in capsys.readouterr().err
    monkeypatch.setenv("ACCELSTACK_BACKEND", "vulkan")  # a ggml backend: torch has no such build, said in the plan
    assert main(["plan", "--stack", "torch", "--hardware", str(report_file)]) == 3
    assert "no torch build for backend 'vulkan'" in capsys.readouterr().out


def test_ggml_with_a_manifest_file(report_file, capsys):
    assert main(["plan", "--hardware", str(report_file), "--manifest", str(EXAMPLE_GGML)]) == 0
    out = capsys.readouterr().out
    assert "decision: ggml linux-x64-cuda12 (CUDA)" in out and "fetch:" in out and "sd-linux-x64-cuda12.tar.gz" in out


def test_ggml_without_manifest_says_what_to_build(report_file, capsys):
    assert main(["plan", "--hardware", str(report_file)]) == 0
    out = capsys.readouterr().out
    decision = next(line for line in out.splitlines() if line.startswith("decision:"))
    assert "[needs-build]" in decision and "local build needed:" in out and "sm 12.0" in decision
    assert out.count("sm 12.0") == 1 and "sm=12.0" not in out  # the build's features are said once, in the decision


def test_bad_inputs_are_clear_errors(tmp_path, report_file, capsys):
    assert main(["plan", "--stack", "torch", "--hardware", str(report_file), "torch>>2"]) == 2
    assert "is not valid" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"os": 3}')
    assert main(["plan", "--hardware", str(bad)]) == 1
    assert "os" in capsys.readouterr().err
    assert main(["plan", "--hardware", str(tmp_path / "missing.json")]) == 2
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"format": "accelstack-manifest", "format_version": 9}))
    assert main(["plan", "--hardware", str(report_file), "--manifest", str(manifest)]) == 1
    assert "format_version" in capsys.readouterr().err


@NEEDS_CAPTURES
def test_replay_directory(capsys):
    assert main(["plan", "--stack", "torch", "--python", "3.11", "--replay", str(CAPTURES / "linux-nvidia-rtx4070-550")]) == 0
    out = capsys.readouterr().out
    assert "decision: torch 2.14 (cu126) for GPU 0 NVIDIA GeForce RTX 4070" in out  # CUDA 12.x minor-version compatibility
    assert "cu130 rejected: NVIDIA driver 550.40.07 supports CUDA up to 12.4; cu130 needs a CUDA 13.x driver" in out


def test_live_detection_runs_in_a_subprocess():
    """Without --hardware/--replay the plan is for this machine (whatever it has, it must not fail)."""
    proc = subprocess.run([sys.executable, "-m", "accelstack", "plan", "--stack", "torch", "--json"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode in (0, 3), proc.stderr
    plan = from_dict(Plan, result_of(proc.stdout))
    assert plan.candidates and plan.summary


def test_torch_plan_carries_the_engine_packages_unless_told_not_to(report_file, capsys):
    assert main(["plan", "--stack", "torch", "--hardware", str(report_file), "--json"]) == 0
    with_engine = result_of(capsys.readouterr().out)
    assert any("diffusers" in " ".join(c["argv"]) for c in with_engine["commands"])
    assert main(["plan", "--stack", "torch", "--hardware", str(report_file), "--json", "--no-engine"]) == 0
    alone = result_of(capsys.readouterr().out)
    assert not any("diffusers" in " ".join(c["argv"]) for c in alone["commands"]) and alone["request"]["engine"] is False


@NEEDS_CAPTURES
def test_the_documented_round_trip_detect_json_then_plan_hardware(tmp_path):
    """`accelstack detect --json > report.json; accelstack plan --hardware report.json` (README,
    docs/resolve.md): the file holds detect's JSON Lines result, which --hardware reads as well as
    a bare report (issue 25)."""
    from cli_helpers import error_of, run_cli

    capture = CAPTURES / "linux-nvidia-rtx4070-550"
    rc, out, err = run_cli(["detect", "--replay", capture, "--json"])
    assert rc == 0, err
    report = tmp_path / "report.json"
    report.write_text(out)
    rc, out, err = run_cli(["plan", "--hardware", report, "--json"])
    assert rc == 0, err
    assert result_of(out)["stack"] == "ggml"
    events = tmp_path / "with-events.jsonl"  # progress lines before the result, as a GUI might keep them
    events.write_text(json.dumps({"event": "progress", "stage": "detect"}) + "\n" + report.read_text())
    rc, out, err = run_cli(["plan", "--hardware", events, "--json"])
    assert rc == 0, err
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(json.loads(report.read_text())["result"], indent=2))
    rc, _, err = run_cli(["plan", "--hardware", bare])
    assert rc == 0, err
    # another command's result, or detect's error line, is a usage error that says what the file is
    other = tmp_path / "plan.json"
    other.write_text(json.dumps({"event": "result", "command": "plan", "ok": True, "result": {}}) + "\n")
    rc, out, _ = run_cli(["plan", "--hardware", other, "--json"])
    assert rc == 2 and "plan" in error_of(out)["message"] and "detect" in error_of(out)["message"]
    failed = tmp_path / "failed.json"
    failed.write_text(json.dumps({"event": "error", "command": "detect", "ok": False, "message": "boom"}) + "\n")
    rc, out, _ = run_cli(["plan", "--hardware", failed, "--json"])
    assert rc == 2 and "error" in error_of(out)["message"]


@NEEDS_CAPTURES
def test_the_default_torch_plan_is_the_newest_confirmed_release_through_the_cli(tmp_path):
    """Issue 42, item 6: `plan --stack torch` on a CPU-only machine chose torch 2.15, whose CPU wheels
    the plan itself marked "publication unverified"; the default is the newest confirmed release."""
    capture = str(CAPTURES / "linux-cpu-pentium-e5700-no-avx")
    res = subprocess.run([sys.executable, "-m", "accelstack", "plan", "--stack", "torch", "--replay", capture, "--json"],
                         capture_output=True, text=True, timeout=300)
    plan = result_of(res.stdout)
    assert res.returncode == 0 and plan["torch_version"] == "2.14", (plan["summary"], res.stderr[-500:])
    assert not any(n.startswith("unverified:") for n in plan["notes"])
    res = subprocess.run([sys.executable, "-m", "accelstack", "plan", "--stack", "torch", "--replay", capture, "torch==2.15.*"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "decision: torch 2.15 (cpu)" in res.stdout, res.stdout + res.stderr
    assert "chosen because your requirement excludes every release whose publication is confirmed" in res.stdout
