"""The engine's progress is real: verify advances check by check, the model's loading ticks,
each generation's sampling steps advance, and a command piped to a log prints timestamped
lines. Real worker processes on the real CPU runtime; JSON through the CLI renderer."""
from __future__ import annotations

import io
import json
import re
import sys
import textwrap
from pathlib import Path

from accelstack.commands.progress import ProgressRenderer
from accelstack.engine.runtime import Runtime
from accelstack.engine.supervision.supervisor import Supervisor
from accelstack.engine.verification import torch_check
from accelstack.engine.verification.probe_verify import verify
from accelstack.engine.verification.torch_verify import _run_check, verify_torch
from accelstack.engine.worker.protocol import GenerateRequest
from accelstack.settings import Settings

from cli_helpers import events_of, result_of
from engine_helpers import cli_env, run_cli

LINE = re.compile(r"^\d\d:\d\d:\d\d \[[a-z]+\] ")


def _json_events(buf: io.StringIO):
    lines = [json.loads(line) for line in buf.getvalue().splitlines()]
    for line in lines:
        assert line["event"] == "progress" and line["ts"].endswith("Z") and isinstance(line["stage_index"], int)
    return lines


def test_verify_advances_check_by_check_with_load_and_generations(cpu_runtime, probe_model, tmp_path):
    buf = io.StringIO()
    renderer = ProgressRenderer("json", json_stream=buf)
    report = verify(cpu_runtime, output=tmp_path / "v.png", probe_cache=Path(probe_model.path).parent,
                    records=Settings.resolve().verify_dir, progress=renderer)
    assert report.ok, report.reason
    events = _json_events(buf)
    whole = [e for e in events if e["task"] == "cpu runtime"]
    assert whole[0]["kind"] == "start" and whole[0]["total"] == 4 and whole[0]["extra"]["unit"] == "check"
    assert [e["done"] for e in whole if e["kind"] == "advance"] == [1, 2, 3, 4]
    assert [e["extra"]["check"] for e in whole if e["kind"] == "advance"] == ["load", "size", "pixels", "deterministic"]
    assert whole[-1]["kind"] == "end" and whole[-1]["ok"] and whole[-1]["done"] == 4
    load = [e for e in events if e["task"] == "loading the probe model"]
    assert load[0]["kind"] == "start" and load[-1]["kind"] == "end" and load[-1]["ok"]
    assert "on CPU" in load[-1]["message"]
    for n in ("1 of 2", "2 of 2 (same seed)"):
        gen = [e for e in events if e["task"] == f"probe generation {n}"]
        assert gen[0]["kind"] == "start" and gen[0]["total"] == 1 and gen[-1]["kind"] == "end" and gen[-1]["done"] == 1
    assert {e["stage"] for e in load + gen} == {"generate"}  # the worker's part, as in any generation
    index = {e["stage"]: e["stage_index"] for e in events}
    assert index["verify"] == 0 and index["generate"] > index["verify"]  # in the order this run met them
    # the order a person sees: loading, then the first check, the generations, then the rest
    order = [(e["task"], e["kind"]) for e in events if e["kind"] != "advance" or e["task"] == "cpu runtime"]
    assert order.index(("loading the probe model", "end")) < order.index(("probe generation 1 of 2", "start"))


def test_verify_that_fails_to_load_ends_every_task_failed(probe_model, tmp_path):
    pkg = tmp_path / "rt" / "stable_diffusion_cpp"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('GLIBC_2.38 not found')\n")
    events = []
    report = verify(Runtime(tmp_path / "rt"), output=tmp_path / "x.png", probe_cache=Path(probe_model.path).parent,
                    records=Settings.resolve().verify_dir, progress=events.append)
    assert not report.ok
    ends = {e.task: e for e in events if e.kind == "end"}
    assert not ends["loading the probe model"].ok and "GLIBC_2.38" in ends["loading the probe model"].message
    assert not ends["cpu runtime"].ok and ends["cpu runtime"].done == 1  # the load check, failed
    assert [e.kind for e in events if e.task == "cpu runtime"] == ["start", "advance", "end"]


def test_generation_steps_advance_and_the_load_ticks(cpu_runtime, probe_model):
    events = []
    request = GenerateRequest(prompt="progress", width=64, height=64, steps=4, seed=7, sampler="euler")
    with Supervisor(cpu_runtime, model=probe_model.path, progress=events.append, model_label="the probe model") as sup:
        sup.generate(request, label="4 steps")
    load = [e for e in events if e.task == "loading the probe model"]
    assert load[0].kind == "start" and load[-1].kind == "end" and load[-1].ok
    steps = [e for e in events if e.task == "4 steps"]
    assert steps[0].kind == "start" and steps[0].total == 4 and steps[0].extra == {"unit": "step"}
    done = [e.done for e in steps if e.kind == "advance"]
    assert done == sorted(done) and {1, 2, 3} <= set(done) or {2, 3, 4} <= set(done), done  # each step is seen
    assert steps[-1].kind == "end" and steps[-1].ok and steps[-1].done == 4
    assert all(e.stage == "generate" for e in events)


def test_torch_check_shows_signs_of_life_while_it_runs(tmp_path):
    script = tmp_path / "slow_check.py"
    script.write_text(textwrap.dedent(f"""
        import json, time
        time.sleep(2.3)
        print({torch_check.RESULT_MARK!r} + json.dumps({{"ok": True, "reason": ""}}))
    """))
    seen = []
    data, seconds = _run_check(sys.executable, [sys.executable, str(script)], {}, timeout=30, alive=seen.append)
    assert data["ok"] and seconds >= 2.3
    assert len(seen) >= 2 and seen == sorted(seen)


def test_torch_check_past_its_time_is_killed_with_a_reason(tmp_path):
    script = tmp_path / "hung_check.py"
    script.write_text("import time\ntime.sleep(60)\n")
    data, seconds = _run_check(sys.executable, [sys.executable, str(script)], {}, timeout=1.5)
    assert not data["ok"] and "did not finish within 2 s" in data["reason"] and seconds < 10


def test_verify_torch_events_name_the_task(tmp_path):
    events = []
    report = verify_torch(python=str(tmp_path / "no-python"), progress=events.append)
    assert not report.ok
    assert [(e.kind, e.task) for e in events] == [("start", "torch runtime"), ("end", "torch runtime")]
    assert events[-1].ok is False and "cannot run" in events[-1].message


def test_verify_piped_prints_timestamped_lines(cpu_runtime, cache_with_probe, tmp_path):
    """`accelstack verify 2>&1 | tee log`: stderr is a pipe, so progress is plain lines, never bars."""
    res = run_cli(["verify", "--runtime", cpu_runtime.path, "--output", tmp_path / "v.png"], cli_env(cache_with_probe, tmp_path))
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    assert lines and all(LINE.match(line) for line in lines), res.stderr
    assert "\r" not in res.stderr and "0it" not in res.stderr
    text = "\n".join(line[9:] for line in lines)
    for want in ("[verify] cpu runtime: started (4 checks)", "[generate] loading the probe model: started",
                 "[generate] loading the probe model: done in", "[generate] probe generation 1 of 2: done in",
                 "[verify] cpu runtime: done in"):
        assert want in text, res.stderr
    assert "PASS" in res.stdout


def test_generate_piped_shows_the_load_and_the_steps(cpu_runtime, probe_model, tmp_path):
    """`accelstack generate ... | tee log`: the model's loading and the sampling are in the log."""
    res = run_cli(["generate", "--runtime", cpu_runtime.path, "-m", probe_model.path, "-p", "a red cube", "-W", "64",
                   "-H", "64", "--steps", "2", "--seed", "5", "-o", tmp_path / "img.png"], cli_env(tmp_path / "cache", tmp_path))
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    assert lines and all(LINE.match(line) for line in lines), res.stderr
    text = "\n".join(line[9:] for line in lines)
    name = Path(probe_model.path).name
    for want in (f"[generate] loading {name}: started", f"[generate] loading {name}: done in",
                 "[generate] generating 64x64, 2 steps: started (2 steps)", "[generate] generating 64x64, 2 steps: done in"):
        assert want in text, res.stderr
    assert "wrote 1 image" in res.stdout


def test_a_relative_model_path_is_made_absolute_for_the_worker(cpu_runtime, tmp_path, monkeypatch):
    """The worker runs in its own folder: `generate -m models/x.gguf` must still name the file."""
    monkeypatch.chdir(tmp_path)
    sup = Supervisor(cpu_runtime, model="models/x.gguf")
    assert sup.model == str(tmp_path / "models" / "x.gguf") and sup.model_label == "x.gguf"


def test_verify_json_progress_lines_then_one_result(cpu_runtime, cache_with_probe, tmp_path):
    """`accelstack verify --json`: progress lines with a timestamp and a stage index, the checks
    advancing one by one, then the one result line (the contract of docs/json.md)."""
    res = run_cli(["verify", "--runtime", cpu_runtime.path, "--output", tmp_path / "v.png", "--json"],
                  cli_env(cache_with_probe, tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert result_of(res.stdout)["verdict"] == "PASS"
    events = events_of(res.stdout)
    assert events and all(e["event"] == "progress" and e["ts"].endswith("Z") and isinstance(e["stage_index"], int)
                          for e in events)
    checks = [e["done"] for e in events if e["task"] == "cpu runtime" and e["kind"] == "advance"]
    assert checks == [1, 2, 3, 4]
    assert any(e["stage"] == "generate" and e["task"] == "loading the probe model" and e["kind"] == "end" for e in events)
    assert res.stderr == ""  # with --json, progress goes to stdout only
