"""A real torch install into a fresh venv through the planned commands, its check, and its undo.

Uses the CPU build of torch 2.13 (on this machine's disk, so pip finds it without the network).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from accelstack.detect import detect
from accelstack.detect.system import LiveSystem
from accelstack.installer.torch import TorchCheck, TorchInstallError, install_torch
from accelstack.manifests.plan import Request
from accelstack.manifests.resolve import Manifests, resolve

from installer_helpers import cli_env, result_of, run_cli

PIN = "torch==2.13.*"


def _torch_available() -> bool:
    res = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-index", "-d", "/tmp/.accelstack-probe",
                          "--find-links", "/opt/wheels", "torch==2.13.0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return res.returncode == 0


pytestmark = pytest.mark.skipif(not _torch_available(), reason="the torch 2.13 CPU wheel is not on this machine's disk")


@pytest.fixture(autouse=True)
def _wheels_on_disk(monkeypatch):
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels")


@pytest.fixture(scope="module")
def venv_with_torch(tmp_path_factory):
    venv = tmp_path_factory.mktemp("torch") / "venv"
    # pip finds the wheel on this machine's disk when the index is unreachable; say where explicitly
    env = cli_env(tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("cache"), {"PIP_FIND_LINKS": "/opt/wheels"})
    proc = run_cli(["install", "--stack", "torch", "--venv", str(venv), "--json", PIN], env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return venv, result_of(proc)


def _torch_version(python: Path) -> str:
    return subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"], stdout=subprocess.PIPE, text=True, check=True).stdout.strip()


def test_planned_commands_install_a_working_torch(venv_with_torch):
    venv, receipt = venv_with_torch
    assert receipt["stack"] == "torch" and receipt["backend"] == "cpu"
    assert receipt["verification"]["ok"] is True
    assert receipt["verification"]["torch"].startswith("2.13")
    assert _torch_version(venv / "bin" / "python").startswith("2.13")
    cmd = receipt["plan"]["commands"][0]["argv"]
    assert "torch==2.13.*" in cmd and "--index-url" in cmd


def test_a_failed_check_restores_the_previous_torch(venv_with_torch):
    venv, _ = venv_with_torch
    python = str(venv / "bin" / "python")
    before = _torch_version(venv / "bin" / "python")
    report = detect(LiveSystem())
    plan = resolve(report, Request(stack="torch", requirements=[PIN]), Manifests.builtin())

    def failing_check(py, p):
        return TorchCheck(False, "simulated: no kernel image for this GPU")

    with pytest.raises(TorchInstallError) as info:
        install_torch(plan, python, checker=failing_check)
    assert "no kernel image" in info.value.message
    assert _torch_version(venv / "bin" / "python") == before
    assert not (venv / ".accelstack-backup").exists()


def test_pip_failure_names_pips_reason_and_keeps_torch(venv_with_torch):
    venv, _ = venv_with_torch
    python = str(venv / "bin" / "python")
    report = detect(LiveSystem())
    plan = resolve(report, Request(stack="torch", requirements=[PIN]), Manifests.builtin())
    plan.commands[0].argv = [a if a != PIN else "torch==0.0.0.nonexistent" for a in plan.commands[0].argv]
    plan.commands[0].argv += ["--no-index"]
    with pytest.raises(TorchInstallError) as info:
        install_torch(plan, python)
    assert "pip failed" in info.value.message and "torch" in info.value.message.lower()
    assert _torch_version(venv / "bin" / "python").startswith("2.13")
