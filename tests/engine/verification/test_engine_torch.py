"""torch verify, with a real torch.

torch is not a dependency of accelstack. These tests use the directories in
``ACCELSTACK_TEST_TORCH_PATH`` (``pip install --target DIR torch==2.13.0``; add
diffusers/transformers there to also run the pipeline step), else the test interpreter's torch,
else the site-packages of conftest's ``torch_venv`` (torch + diffusers, built once for the engine
tests); they skip only where none of these has torch. The device-order logic is tested without torch
in test_engine_units.py.
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Dict, List, Tuple

import pytest

from accelstack.engine import VerifyReport
from accelstack.engine.verification.torch_verify import verify_torch
from accelstack.installer.pip_runner import venv_python

from cli_helpers import result_of
from engine_helpers import cli_env, run_cli

TORCH_PATH_ENV = "ACCELSTACK_TEST_TORCH_PATH"


def _importable(module: str, env: dict) -> bool:
    res = subprocess.run([sys.executable, "-c", f"import {module}"], env={**os.environ, **env},
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return res.returncode == 0


@pytest.fixture(scope="module")
def torch_env(request) -> Tuple[Dict[str, str], List[str]]:
    """The environment that makes torch importable, and the directories it adds to the path."""
    paths = [p for p in os.environ.get(TORCH_PATH_ENV, "").split(os.pathsep) if p]
    if not paths and not _importable("torch", {}):
        venv = request.getfixturevalue("torch_venv")
        paths = [subprocess.run([str(venv_python(venv)), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                stdout=subprocess.PIPE, text=True, check=True).stdout.strip()]
    env = {"PYTHONPATH": os.pathsep.join([*paths, *filter(None, [os.environ.get("PYTHONPATH", "")])])} if paths else {}
    if not _importable("torch", env):
        pytest.skip(f"no torch importable (set {TORCH_PATH_ENV} to a directory with torch installed)")
    return env, paths


def test_torch_verify_cli_passes_on_cpu(torch_env, tmp_path):
    env_extra, paths = torch_env
    args = ["verify", "--backend", "torch", "--no-diffusers", "--json"]
    if paths:
        args += ["--runtime", paths[0]]
    env = cli_env(tmp_path / "cache", tmp_path)
    if len(paths) > 1:
        env["PYTHONPATH"] = env_extra["PYTHONPATH"]
    res = run_cli(args, env)
    assert res.returncode == 0, res.stdout + res.stderr
    report = result_of(res.stdout)
    assert report["verdict"] == "PASS" and report["torch_version"]
    assert report["device_kind"] in ("cuda", "xpu", "mps", "directml", "cpu")
    ops = {o["name"]: o for o in report["ops"]}
    assert set(ops) == {"conv2d", "sdpa", "group_norm", "matmul_fp16"}
    assert all(o["ok"] and o["seconds"] > 0 and o["error"] <= o["tolerance"] for o in ops.values())


def test_diffusers_step_on_the_probe_model(torch_env, probe_model):
    env, _ = torch_env
    if not _importable("diffusers, transformers, safetensors", env):
        pytest.skip("diffusers/transformers/safetensors not importable next to torch")
    report = verify_torch(env=env, probe=probe_model.path)
    assert isinstance(report, VerifyReport) and report.ok, report.reason
    assert report.check == "torch" and report.backend in ("cuda", "xpu", "mps", "directml", "cpu")
    step = report.details["diffusers"]
    assert step["ran"] and step["finite"] and step["shape"] == [64, 64, 3]
    assert {c.name for c in report.checks} >= {"import", "device", "conv2d", "diffusers"}
    assert report.step_seconds and report.probe_path == probe_model.path


def test_torch_verify_failures_are_reports(tmp_path):
    missing = verify_torch(python=str(tmp_path / "no-python"))
    assert isinstance(missing, VerifyReport) and not missing.ok and "cannot run" in missing.reason
    assert missing.verdict == "FAIL" and missing.checks and not missing.checks[0].ok
    if not _importable("torch", {"PYTHONPATH": ""}):
        no_torch = verify_torch(env={"PYTHONPATH": str(tmp_path)})
        assert not no_torch.ok and "torch cannot be imported" in no_torch.reason


def test_torch_verify_cli_reports_a_broken_torch(tmp_path):
    """Runs without torch: a pip --target runtime whose torch cannot load is a FAIL with the reason,
    in JSON and in words (the CLI renders verify_torch's report and its torch details)."""
    target = tmp_path / "target"
    (target / "torch").mkdir(parents=True)
    (target / "torch" / "__init__.py").write_text("raise ImportError('libtorch_cuda.so: cannot open shared object file')\n")
    env = cli_env(tmp_path / "cache", tmp_path)
    args = ["verify", "--backend", "torch", "--runtime", target, "--no-diffusers"]
    res = run_cli(args + ["--json"], env)
    assert res.returncode == 1, res.stdout + res.stderr
    report = result_of(res.stdout)
    assert report["verdict"] == "FAIL" and not report["ok"] and "libtorch_cuda.so" in report["reason"]
    assert report["python"] == sys.executable and report["ops"] == [] and report["seconds"] > 0
    res = run_cli(args, env)
    assert res.returncode == 1 and res.stdout.startswith("FAIL  torch ?") and "torch cannot be imported" in res.stdout
