"""A real torch install into a fresh venv through ``accelstack.install(plan)``, its check, and its undo.

pip installs the CPU build of torch 2.13 from a wheel folder the tests fill once (tests/wheelhouse.py:
no index, no pip configuration), so the result does not depend on how a machine configures pip; where
that wheel cannot be downloaded these tests skip with pip's reason. The plans install torch alone
(``without_engine``): the torch engine's packages are not in that folder.
"""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Iterator

import pytest

import accelstack
from accelstack.core.verifiers import import_verifier
from accelstack.installer.errors import TorchInstallError
from accelstack.manifests.torch_resolve import without_engine
from accelstack.settings import Settings
from accelstack.verdict import VerifyReport

PIN = "torch==2.13.*"


@pytest.fixture(scope="module")
def torch_wheel(torch_cpu_wheels) -> Iterator[None]:
    """Every pip of this module (accelstack's included) installs from the tests' wheel folder alone."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in torch_cpu_wheels.items():
            mp.setenv(name, value)
        yield


@pytest.fixture(scope="module")
def installed(torch_wheel, module_tmp):
    """The library path an app takes: detect -> plan -> install(plan) into a fresh venv."""
    venv = module_tmp / "torch" / "venv"
    s = Settings.resolve(home=module_tmp / "home", cache=module_tmp / "cache", torch_venv=venv)
    report = accelstack.detect(settings=s)
    plan = without_engine(accelstack.plan(report, stack="torch", requirements=[PIN], settings=s))
    events = []
    receipt = accelstack.install(plan, report=report, settings=s, on_progress=events.append).receipt
    return venv, s, receipt, events


def _torch_version(python: Path) -> str:
    return subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"], stdout=subprocess.PIPE, text=True,
                          check=True, timeout=300).stdout.strip()


def test_install_plan_puts_a_working_torch_into_a_fresh_venv(installed):
    venv, s, receipt, events = installed
    assert receipt.stack == "torch" and receipt.backend == "cpu"
    assert isinstance(receipt.verification, VerifyReport) and receipt.verification.ok, receipt.verification.reason
    assert _torch_version(venv / "bin" / "python").startswith("2.13")
    assert "torch==2.13.*" in receipt.plan.commands[0].argv
    assert any(e.stage == "install" for e in events)
    # the receipt is the home's, the active torch runtime; verify() takes it as it is
    assert accelstack.status(settings=s)[1].active == receipt.id
    result = accelstack.verify(receipt, settings=s)
    assert result.ok and result.verdict == "PASS"


def test_a_failed_check_restores_the_previous_torch(installed):
    venv, s, _, _ = installed
    before = _torch_version(venv / "bin" / "python")
    plan = without_engine(accelstack.plan(stack="torch", requirements=[PIN], settings=s))

    def failing(staged, progress):
        return VerifyReport(ok=False, reason="simulated: no kernel image for this GPU", runtime=str(staged.path), backend="cpu")

    with pytest.raises(accelstack.AccelstackError) as info:
        accelstack.install(plan, settings=s, verifier=failing)
    assert "no kernel image" in info.value.message and info.value.code == "verify-failed"
    assert _torch_version(venv / "bin" / "python") == before
    assert not (venv / ".accelstack-backup").exists()
    assert not list(venv.glob(".accelstack-backup*"))  # the undo log is gone after the restore


def test_pip_failure_names_pips_reason_and_keeps_torch(installed):
    venv, s, _, _ = installed
    plan = without_engine(accelstack.plan(stack="torch", requirements=[PIN], settings=s))
    plan.commands[0].argv = [a if a != PIN else "torch==0.0.0.nonexistent" for a in plan.commands[0].argv] + ["--no-index"]
    with pytest.raises(TorchInstallError) as info:
        accelstack.install(plan, settings=s, verifier=import_verifier())
    assert "pip failed" in info.value.message and "torch" in info.value.message.lower()
    assert _torch_version(venv / "bin" / "python").startswith("2.13")


def test_cli_dry_run_shows_the_commands_and_touches_nothing(torch_wheel, tmp_path):
    from installer_helpers import cli_env, result_of, run_cli

    venv = tmp_path / "venv"
    proc = run_cli(["install", "--stack", "torch", "--venv", str(venv), "--dry-run", "--json", PIN],
                   cli_env(tmp_path / "home", tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr
    out = result_of(proc)
    assert out["dry_run"] is True and out["plan"]["stack"] == "torch"
    assert not venv.exists() and not (tmp_path / "home").exists()


def test_the_import_check_fails_when_the_engines_packages_do_not_import(installed):
    """A torch that works, in an environment without the engine's packages the plan installs: the
    cheap check says which ones do not import, instead of passing until `generate` fails."""
    from types import SimpleNamespace

    from accelstack.installer.torch_check import import_check
    from accelstack.installer.transaction import StagedRuntime

    venv, s, _, _ = installed
    python = str(venv / "bin" / "python")
    plan = accelstack.plan(stack="torch", requirements=[PIN], settings=s)  # with the engine's packages
    staged = StagedRuntime(stack="torch", backend="cpu", path=Path(python), python=python, handle=SimpleNamespace(plan=plan))
    report = import_check(staged, lambda e: None)
    assert not report.ok and "the torch engine's packages do not import" in report.reason
    assert "diffusers (ModuleNotFoundError" in report.reason
    staged.handle = SimpleNamespace(plan=without_engine(plan))
    assert import_check(staged, lambda e: None).ok  # torch alone: nothing more is asked of it
