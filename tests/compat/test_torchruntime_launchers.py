"""Real launchers' torchruntime calls (tests/compat/launchers.py), run against accelstack's package.

The GPUs are those of replayed captures (a remote machine's list, as a device picker may show): the
test makes ``get_gpus()`` answer with them, as the app's own ``get_gpus()`` would on that machine.
- Easy Diffusion's device picker and the FooocusPlus resolver get torchruntime's words ("cu128", an
  architecture such as 8.9) where accelstack's plan accepts them, and accelstack's reason-backed answer
  where it does not (a driver too old for any CUDA build: "cpu").
- FooocusPlus's installer builders return torchruntime's command lists, with its options and spacing;
  ``run_commands`` refuses, before installing anything, a CUDA build this CPU machine cannot run
  (``NotImplementedError``, which its launcher's callers catch), and runs other commands as given.
- ``install(['--no-deps', 'xformers==...'])`` installs no torch: it becomes pip's command for that package.
"""
from __future__ import annotations

import importlib
import sys

import pytest
from manifests._factory import CAPTURES

import accelstack.compat.torchruntime as compat
from accelstack.hardware.system import ReplaySystem


@pytest.fixture()
def launchers(monkeypatch):
    saved = {k: v for k, v in sys.modules.items() if k == "torchruntime" or k.startswith("torchruntime.")}
    for k in saved:  # the app's process: register() before its first import of torchruntime
        del sys.modules[k]
    compat.register()
    sys.modules.pop("compat.launchers", None)
    module = importlib.import_module("compat.launchers")
    yield module
    for k in [k for k in sys.modules if k == "torchruntime" or k.startswith("torchruntime.")]:
        del sys.modules[k]
    sys.modules.update(saved)
    sys.modules.pop("compat.launchers", None)


def _on(monkeypatch, capture: str) -> None:
    gpus = compat.get_gpus(system=ReplaySystem(str(CAPTURES / capture)))
    monkeypatch.setattr(compat.device_db, "get_gpus", lambda: list(gpus))


def test_easy_diffusions_device_picker_on_an_rtx4070(launchers, monkeypatch):
    _on(monkeypatch, "linux-nvidia-rtx4070-550")
    seen = launchers.ed_device_picker()
    assert seen == {"platform": "cu128", "family": "cuda", "arch": 89, "gpus": ["NVIDIA GeForce RTX 4070"]}


def test_easy_diffusions_device_picker_where_the_driver_runs_no_cuda(launchers, monkeypatch, capsys):
    """Driver 418 (CUDA 10.1): torchruntime says cu124; no CUDA build of the matrix runs there."""
    _on(monkeypatch, "linux-nvidia-4x-titanx-pascal-418")
    seen = launchers.ed_device_picker()
    assert seen["platform"] == "cpu" and seen["family"] == "cpu" and seen["arch"] == 61


def test_fooocus_resolver_imports_its_names_and_reads_the_architecture(launchers, monkeypatch):
    _on(monkeypatch, "linux-nvidia-rtx5090-rtx4090-580")
    seen = launchers.fooocus_dependency_resolver()
    assert seen["torchruntime_platform"] == "cu128"  # torchruntime's word: the plan runs it on both cards
    assert seen["arch"] == 8.9  # the lowest of the two (RTX 4090 8.9, RTX 5090 12.0): the one every kernel must serve
    assert seen["torch_platform_ver"] == "cu128"


def test_fooocus_resolver_on_apple_silicon_gets_mps(launchers, monkeypatch):
    _on(monkeypatch, "macos-apple-m3")
    seen = launchers.fooocus_dependency_resolver()
    assert seen["torchruntime_platform"] == "mps" and seen["torch_platform_ver"] == "mps" and seen["arch"] == 0


def test_fooocus_installer_builders_and_a_cuda_install_this_machine_cannot_run(launchers, monkeypatch):
    monkeypatch.setattr(compat.installer, "os_name", "Linux")
    with pytest.raises(NotImplementedError) as info:  # refused by accelstack's plan: nothing was installed
        launchers.fooocus_install_torch("cu128", "2.7.1", "0.22.1", "2.7.1")
    assert "no torch build runs on this machine as asked" in str(info.value)
    cmds = compat.installer.get_pip_commands(compat.installer.get_install_commands(
        "cu128", ["--no-warn-script-location", "torch==2.7.1", " torchvision==0.22.1"]))
    assert cmds == [[sys.executable, "-m", "pip", "install", "--no-warn-script-location", "torch==2.7.1", " torchvision==0.22.1",
                     "--index-url", "https://download.pytorch.org/whl/cu128"]]


def test_fooocus_xformers_install_is_pips_command_for_it(launchers, monkeypatch):
    ran = []
    monkeypatch.setattr(compat.installer, "run_plain", ran.append)
    monkeypatch.setattr(compat.installer, "os_name", "Linux")
    launchers.fooocus_install_xformers("0.0.30")
    assert ran == [[sys.executable, "-m", "pip", "install", "--no-deps", "xformers==0.0.30"]]  # this CPU machine: torchruntime's "cpu"
