"""The engine's library surface: exported names, the one VerifyReport (ggml and torch), paths
from Settings, hints without CLI syntax, and torch check failures as reports (real subprocesses)."""
from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
import pkgutil
import re
import sys
from pathlib import Path

import accelstack.engine as engine
from accelstack.engine.config import load_config
from accelstack.engine.probes.model import ensure_probe_model
from accelstack.engine.verification.probe_verify import default_output
from accelstack.engine.verification.torch_verify import TorchCheckDetails, TorchOp, to_verify_report, torch_details, verify_torch
from accelstack.engine.worker.protocol import DeviceInfo
from accelstack.serde import dumps, from_dict, loads, to_dict
from accelstack.settings import Settings
from accelstack.verdict import PixelStats, VerifyCheck, VerifyReport

ENGINE_DIR = Path(engine.__file__).parent
TINY = {
    "text_encoder": {"text_model.final_layer_norm.weight": (8,), "text_model.embeddings.token_embedding.weight": (50, 8)},
    "unet": {"conv_in.weight": (4, 4, 3, 3), "conv_in.bias": (4,)},
    "vae": {"post_quant_conv.weight": (4, 4, 1, 1)},
}


def test_submodules_never_shadow_the_exported_functions():
    for info in pkgutil.iter_modules([str(ENGINE_DIR)]):  # every submodule first, as an app might
        importlib.import_module(f"accelstack.engine.{info.name}")
    from accelstack.engine import generate, verify, verify_torch

    for fn in (verify, generate, verify_torch):
        assert inspect.isfunction(fn), fn
    assert inspect.signature(verify).return_annotation in ("VerifyReport", VerifyReport)
    for name in engine.__all__:  # every export resolves, and none is a module
        assert not inspect.ismodule(getattr(engine, name)), name


def test_modules_stay_small():
    for path in ENGINE_DIR.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 420, path.name


def _ggml_report() -> VerifyReport:
    return VerifyReport(
        ok=False, reason="pixels: 1 distinct values", runtime="/rt/cuda", backend="cuda",
        device=DeviceInfo(name="CUDA0", description="NVIDIA GeForce RTX 3060", kind="gpu", memory_total=12 << 30),
        checks=[VerifyCheck("load", True, "1.20 s"), VerifyCheck("pixels", False, "1 distinct values")],
        load_seconds=1.2, step_seconds=0.25, its_per_second=4.0, generate_seconds=0.3, total_seconds=3.5,
        probe_path="/cache/probe/sd1-f1-s1234", image="/cache/verify/verify-cuda.png",
        pixels=PixelStats(distinct=1, mean=0.0, saturated=1.0), cpu_mean_diff=0.5, cpu_max_diff=3,
        log_tail=["[ERROR] out of memory"], details={"note": [1, 2]})


def test_verify_report_round_trips_through_serde():
    import accelstack.verdict

    assert engine.VerifyReport is VerifyReport is accelstack.verdict.VerifyReport  # one type, stored in receipts
    assert engine.DeviceInfo is accelstack.verdict.DeviceInfo
    report = _ggml_report()
    data = to_dict(report)
    assert data["verdict"] == "FAIL" and data["check"] == "verify" and data["backend"] == "cuda"
    assert from_dict(VerifyReport, data) == report
    assert loads(VerifyReport, dumps(report)) == report
    passed = VerifyReport(ok=True, reason="", runtime="/rt/cpu", backend="cpu")
    assert to_dict(passed)["verdict"] == "PASS" and from_dict(VerifyReport, to_dict(passed)) == passed


def test_a_torch_check_is_a_verify_report():
    found = TorchCheckDetails(
        torch_version="2.13.0", device_kind="cuda", device_name="NVIDIA GeForce RTX 3060", rejected={"directml": "not installed"},
        ops=[TorchOp("conv2d", True, 1e-2, error=1e-4, seconds=0.001), TorchOp("sdpa", False, 1e-2, detail="non-finite output")],
        diffusers={"ran": True, "ok": True, "load_seconds": 2.0, "step_seconds": 0.5, "detail": ""})
    script_output = {"ok": False, "reason": "sdpa: non-finite output", "seconds": 8.5, **to_dict(found)}
    report = to_verify_report(script_output, python="/venv/bin/python", seconds=9.0, probe="/probe")
    assert (report.check, report.backend, report.verdict) == ("torch", "cuda", "FAIL")
    assert (report.runtime, report.reason, report.probe_path) == ("/venv/bin/python", "sdpa: non-finite output", "/probe")
    assert report.device == DeviceInfo(name="cuda", description="NVIDIA GeForce RTX 3060", kind="gpu")
    assert [(c.name, c.ok) for c in report.checks] == [("import", True), ("device", True), ("conv2d", True),
                                                      ("sdpa", False), ("diffusers", True)]
    assert report.details["torch_version"] == "2.13.0" and report.details["ops"][1]["detail"] == "non-finite output"
    assert not set(report.details) & {"ok", "reason", "python", "seconds", "verdict"}  # the report's own fields, once
    assert torch_details(report) == found
    assert report.load_seconds == 2.0 and report.step_seconds == 0.5 and report.total_seconds == 9.0
    assert from_dict(VerifyReport, json.loads(json.dumps(to_dict(report)))) == report


def _fake_torch(root: Path, body: str) -> dict:
    pkg = root / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(body)
    return {"PYTHONPATH": str(root)}


def test_torch_failures_are_reports_not_exceptions(tmp_path):
    missing = verify_torch(python=str(tmp_path / "no-python"))
    assert isinstance(missing, VerifyReport) and not missing.ok and "cannot run" in missing.reason
    broken = verify_torch(env=_fake_torch(tmp_path / "a", "raise ImportError('libtorch_cuda.so: cannot open')\n"))
    assert not broken.ok and "torch cannot be imported" in broken.reason and "libtorch_cuda.so" in broken.reason
    assert broken.backend == "" and broken.checks[0].name == "import" and not broken.checks[0].ok


def test_a_hanging_torch_check_is_killed_at_its_timeout(tmp_path):
    env = _fake_torch(tmp_path / "b", "import time\ntime.sleep(60)\n")
    report = verify_torch(env=env, timeout=2)
    assert not report.ok and "did not finish within 2 s" in report.reason
    assert report.total_seconds < 30


def test_default_paths_come_from_settings(tmp_path, monkeypatch):
    # The engine resolves nothing itself: its callers pass their Settings' paths (the core and the
    # commands do), so the defaults are the settings' own.
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("engine:\n  threads: 3\n")
    monkeypatch.setenv("ACCELSTACK_CONFIG", str(cfg))
    assert load_config(Settings.resolve().config_file, missing_ok=True).threads == 3
    monkeypatch.setenv("ACCELSTACK_CACHE", str(tmp_path / "c"))
    assert default_output("cpu", Settings.resolve().verify_dir) == tmp_path / "c" / "verify" / "verify-cpu.png"
    assert default_output("cpu", Settings.resolve(cache=tmp_path / "x").verify_dir) == tmp_path / "x" / "verify" / "verify-cpu.png"
    monkeypatch.setenv("ACCELSTACK_PROBE_CACHE", str(tmp_path / "probes"))
    probe = ensure_probe_model(7, Settings.resolve().probe_cache, architecture=TINY)
    assert Path(probe.path).parent == tmp_path / "probes" and not probe.cached


def test_engine_sources_use_settings_and_no_cli_syntax():
    for path in ENGINE_DIR.glob("*.py"):
        text = path.read_text()
        assert "platformdirs" not in text and "os.environ.get(\"ACCELSTACK" not in text, path.name
        assert not re.search(r"`accelstack (install|verify|plan|generate)|--runtime|--config", text), path.name


def test_the_worker_runs_as_a_module_and_through_the_bootstrap(tmp_path):
    import subprocess

    from accelstack.engine.runtime import Runtime

    env = {"PATH": "", "PYTHONPATH": str(ENGINE_DIR.parents[1])}
    args = ["--ready-file", str(tmp_path / "r"), "--parent-pid", "1"]
    for cmd in ([sys.executable, "-m", "accelstack.engine.worker.main"], Runtime(tmp_path).worker_command(),
                Runtime(tmp_path, backend="torch", python=sys.executable).worker_command()):
        res = subprocess.run(cmd + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60, env=env)
        assert res.returncode == 2 and "no token" in res.stderr, res.stderr  # it refuses to serve without its token
    # the bootstrap loads only the worker's own, standard-library-only modules
    probe = ("import runpy, sys; sys.argv[1:] = %r; "
             "exec(%r.split('runpy.run_module')[0]); import accelstack.engine.worker.main; "
             "print(sorted(m for m in sys.modules if m.startswith('accelstack')))"
             % (args, Runtime(tmp_path).worker_command()[2]))
    out = subprocess.run([sys.executable, "-c", probe], stdout=subprocess.PIPE, text=True, timeout=60, env=env).stdout
    loaded = set(eval(out))  # noqa: S307 - our own output
    assert not loaded & {"accelstack.core", "accelstack.installer", "accelstack.artifacts", "accelstack.hardware"}, loaded
    # a runtime's own interpreter (a torch venv) lacks accelstack's dependencies: the worker starts
    # there, through the bootstrap and (since accelstack/__init__ imports its names only on first use,
    # detect included) as a plain module too
    bare = tmp_path / "bare-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    bare_python = str(bare / ("Scripts/python.exe" if os.name == "nt" else "bin/python"))
    cmd = Runtime(tmp_path, backend="torch", python=bare_python).worker_command()
    res = subprocess.run(cmd + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60, env=env)
    assert res.returncode == 2 and "no token" in res.stderr, res.stderr
    res = subprocess.run([bare_python, "-m", "accelstack.engine.worker.main"] + args, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, timeout=60, env=env)
    assert res.returncode == 2 and "no token" in res.stderr, res.stderr


def test_logging_names_the_module(caplog):
    with caplog.at_level(logging.INFO, logger="accelstack.engine"):
        verify_torch(python="/nonexistent/python")
    assert any(r.name == "accelstack.engine.verification.torch_verify" for r in caplog.records)
