"""accelstack.compat.torchruntime: torchruntime's calls, answered by accelstack.

- A script written only against torchruntime's API, as Easy Diffusion calls it, runs unchanged in a
  fresh venv with its import line swapped, and installs a working CPU torch 2.13 there (real pip,
  from the wheel folder the tests fill once: tests/wheelhouse.py; skipped with pip's reason where
  that wheel cannot be downloaded).
- The command line mirrors torchruntime's (install, test, info, --help).
- On every replayed capture, the compat ``get_torch_platform`` is the platform of accelstack's plan,
  and differs from torchruntime's own exactly where tests/manifests/test_torchruntime_diff.py's
  DISAGREEMENTS explains why.
- Where no build runs, the call raises what torchruntime's callers catch (NotImplementedError).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from manifests._factory import CAPTURES, fixture_names, plan_of, replay
from manifests.test_torchruntime_diff import DISAGREEMENTS, PYTHON, torchruntime_says

import accelstack.compat.torchruntime as compat
from accelstack.errors import AccelstackError
from accelstack.hardware.system import ReplaySystem

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("ed_script.py")
SWAP = ("import torchruntime  #", "import accelstack.compat.torchruntime as torchruntime; torchruntime.register()  #")
PINS = ["torch==2.13.*", "torchvision==0.28.*"]  # Easy Diffusion's ["torch", "torchvision"], pinned to the offline wheels


def _run(python: str, *args: str, env=None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([python, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          timeout=timeout, cwd=REPO)


def _active_torch(status: dict) -> str:
    """The active torch runtime's id in ``accelstack status --json``'s result line ("" when none)."""
    return next((s["active"] for s in status["result"]["stacks"] if s["stack"] == "torch"), "")


# -- the Easy Diffusion script in a fresh venv -----------------------------------------------------
@pytest.fixture(scope="module")
def ed_run(torch_cpu_wheels, module_tmp):
    """A fresh venv that sees accelstack (and its dependencies) through a .pth file, but no torch;
    the Easy Diffusion script, with its import line swapped, run by that venv's python."""
    root = module_tmp / "ed"
    root.mkdir()
    env_dir = root / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    site = _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    ours = _run(sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    Path(site, "accelstack-dev.pth").write_text(f"{REPO}\n{ours}\n", encoding="utf-8")
    text = SCRIPT.read_text(encoding="utf-8")
    assert text.count(SWAP[0]) == 1
    script = root / "app.py"
    script.write_text(text.replace(SWAP[0], SWAP[1]), encoding="utf-8")
    env = {**os.environ, "ACCELSTACK_HOME": str(root / "home"), "ACCELSTACK_CACHE": str(root / "cache"), **torch_cpu_wheels}
    proc = _run(python, str(script), *PINS, env=env, timeout=1800)
    return env_dir, python, env, proc


def test_easy_diffusions_calls_install_a_working_cpu_torch_into_a_fresh_venv(ed_run):
    env_dir, python, env, proc = ed_run
    assert proc.returncode == 0, proc.stderr[-4000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["torch"].startswith("2.13") and seen["torch_file"].startswith(str(env_dir))
    assert seen["platform"] == "cpu" and seen["installed_platform"] == "cpu"
    assert seen["device"] == "cpu:0" and seen["device_name"] == "cpu:0" and seen["ones"] == 3.0
    assert seen["env_set"] == []  # the CPU plan carries no variables
    assert not seen["real_torchruntime_loaded"]
    assert "--- RECOMMENDED TORCH PLATFORM ---\ncpu" in proc.stdout  # info() printed, as torchruntime's does
    # the install is accelstack's: recorded in the home as the active torch runtime
    status = _run(python, "-m", "accelstack", "status", "--json", env=env)
    assert status.returncode == 0, status.stderr
    assert _active_torch(json.loads(status.stdout.strip().splitlines()[-1])).startswith("torch-cpu-")


def test_the_command_line_checks_the_torch_it_installed(ed_run):
    _, python, env, _ = ed_run
    proc = _run(python, "-m", "accelstack.compat.torchruntime", "test", env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[OK] import" in proc.stdout and "[OK] math" in proc.stdout and "[SKIP] compile" in proc.stdout
    assert "checked against the CPU" in proc.stdout


def test_the_command_line_install_of_the_same_pins_keeps_the_same_runtime(ed_run):
    """pip runs again (it finds everything satisfied) and the check passes: the same receipt, torch unchanged."""
    _, python, env, _ = ed_run
    before = json.loads(_run(python, "-m", "accelstack", "status", "--json", env=env).stdout.strip().splitlines()[-1])
    proc = _run(python, "-m", "accelstack.compat.torchruntime", "install", "--upgrade", *PINS, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "installed: torch 2.13 (cpu)" in proc.stdout and "PASS" in proc.stdout  # its log lines, shown
    after = json.loads(_run(python, "-m", "accelstack", "status", "--json", env=env).stdout.strip().splitlines()[-1])
    assert _active_torch(after) == _active_torch(before) != ""
    assert _run(python, "-c", "import torch; print(torch.__version__)").stdout.startswith("2.13")


def test_fooocus_installer_builders_run_through_accelstacks_transaction(ed_run):
    """FooocusPlus's calls (get_install_commands, get_pip_commands, run_commands, its options and spacing) in the
    same venv: the torch command becomes accelstack's plan for the cpu platform, installed and checked as one
    transaction; the active runtime is the same one (the same pins), torch unchanged."""
    _, python, env, _ = ed_run
    before = json.loads(_run(python, "-m", "accelstack", "status", "--json", env=env).stdout.strip().splitlines()[-1])
    script = ("import accelstack.compat.torchruntime as t; t.register()\n"
              "from torchruntime.installer import get_install_commands, get_pip_commands, run_commands\n"
              "cmds = get_pip_commands(get_install_commands('cpu', ['--no-warn-script-location', 'torch==2.13.*', ' torchvision==0.28.*']))\n"
              "done = run_commands(cmds)\n"
              "print('RAN', [s.plan.variant for s in done])\n")
    proc = _run(python, "-c", script, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "RAN ['cpu']" in proc.stdout
    after = json.loads(_run(python, "-m", "accelstack", "status", "--json", env=env).stdout.strip().splitlines()[-1])
    assert _active_torch(after) == _active_torch(before) != ""
    assert _run(python, "-c", "import torch; print(torch.__version__)").stdout.startswith("2.13")


# -- the command line ------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["info", "test", "install"])
def test_each_command_has_help_that_teaches(command):
    proc = _run(sys.executable, "-m", "accelstack.compat.torchruntime", command, "--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage: python -m accelstack.compat.torchruntime " + command)
    assert proc.stderr == ""


def test_info_shows_the_gpus_the_platform_and_the_variables():
    proc = _run(sys.executable, "-m", "accelstack.compat.torchruntime", "info")
    assert proc.returncode == 0, proc.stderr
    for heading in ("--- GPUs ---", "--- RECOMMENDED TORCH PLATFORM ---", "--- CONFIGURATION ---"):
        assert heading in proc.stdout


def test_no_command_and_a_wrong_one_are_usage_errors():
    assert _run(sys.executable, "-m", "accelstack.compat.torchruntime").returncode == 2
    proc = _run(sys.executable, "-m", "accelstack.compat.torchruntime", "test", "nonsense")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


def test_an_unsatisfiable_pin_on_the_command_line_exits_3_and_says_why():
    proc = _run(sys.executable, "-m", "accelstack.compat.torchruntime", "install", "torch<1.0")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "no torch build runs on this machine as asked" in proc.stderr and "torch<1.0" in proc.stderr


# -- refusals --------------------------------------------------------------------------------------
def test_a_pin_no_build_meets_raises_what_torchruntime_callers_catch():
    with pytest.raises(NotImplementedError) as info:
        compat.install(["torch<1.0", "torchvision"])
    assert isinstance(info.value, AccelstackError) and info.value.code == "no-torch-runs-here"
    assert "torch<1.0" in str(info.value)
    with pytest.raises(NotImplementedError):
        compat.get_torch_platform(compat.get_gpus(), packages=["torch<1.0"])


def test_a_pip_option_it_cannot_honour_is_a_value_error():
    with pytest.raises(ValueError, match="--pre"):
        compat.install(["--pre", "torch"])


def test_easy_diffusions_pip_options_are_understood():
    assert compat.installer.split_packages(["--force", "--upgrade", "torch", "torchvision"]) == (["torch", "torchvision"], True)
    assert compat.installer.split_packages(None) == (["torch", "torchaudio", "torchvision"], False)


def test_register_answers_torchruntimes_module_names():
    saved = {k: v for k, v in sys.modules.items() if k == "torchruntime" or k.startswith("torchruntime.")}
    try:
        compat.register("torchruntime_compat_probe")
        from torchruntime_compat_probe.device_db import get_gpus  # type: ignore[import-not-found]
        from torchruntime_compat_probe.utils import get_device  # type: ignore[import-not-found]
        assert get_gpus is compat.get_gpus and get_device is compat.get_device
    finally:
        for k in [k for k in sys.modules if k.startswith("torchruntime_compat_probe")]:
            del sys.modules[k]
        sys.modules.update(saved)


# -- the GPUs --------------------------------------------------------------------------------------
def test_gpus_have_torchruntimes_fields_and_easy_diffusions_arch_lookup_works():
    """sdkit3.get_variant_name: the first discrete NVIDIA GPU's name, its arch as int(arch * 10)."""
    system = ReplaySystem(str(CAPTURES / "linux-nvidia-rtx4070-550"))
    gpus = compat.get_gpus(system=system)
    nvidia = [g for g in gpus if g.vendor_id == compat.consts.NVIDIA and g.is_discrete]
    assert nvidia and "4070" in nvidia[0].device_name
    assert int(compat.gpu_db.get_nvidia_arch([nvidia[0].device_name], system=system) * 10) == 89
    assert compat.GPU("10de", "NVIDIA Corporation", "2786", nvidia[0].device_name, True) == nvidia[0]  # torchruntime's positional form
    apu = compat.get_gpus(system=ReplaySystem(str(CAPTURES / "linux-amd-680m-apu-proxmox")))
    assert [(g.vendor_id, g.is_discrete) for g in apu] == [("1002", False)]


# -- configure ---------------------------------------------------------------------------------------
def test_configure_sets_the_plans_variables_and_keeps_the_users(monkeypatch):
    m3 = ReplaySystem(str(CAPTURES / "macos-apple-m3"))
    monkeypatch.delenv("PYTORCH_ENABLE_MPS_FALLBACK", raising=False)
    assert compat.configure(system=m3) == {"PYTORCH_ENABLE_MPS_FALLBACK": "1"}
    assert os.environ["PYTORCH_ENABLE_MPS_FALLBACK"] == "1"
    monkeypatch.setenv("PYTORCH_ENABLE_MPS_FALLBACK", "0")  # the user's own choice
    assert compat.configure(system=m3) == {} and os.environ["PYTORCH_ENABLE_MPS_FALLBACK"] == "0"


def test_configure_sets_no_gfx_override_where_accelstacks_data_refuses_it(monkeypatch):
    """The Radeon 680M (gfx1035, integrated): torchruntime sets HSA_OVERRIDE_GFX_VERSION=10.3.5 (its own gfx); accelstack's
    plan is the CPU build (/dev/kfd is closed; with it open the plan is AMD's own gfx1035 build, never the override)."""
    from manifests.test_torchruntime_diff import torchruntime_gpus
    from torchruntime import configuration as theirs

    name = "linux-amd-680m-apu-proxmox"
    monkeypatch.delenv("HSA_OVERRIDE_GFX_VERSION", raising=False)
    assert compat.configure(system=ReplaySystem(str(CAPTURES / name))) == {}
    assert "HSA_OVERRIDE_GFX_VERSION" not in os.environ
    set_by_torchruntime = {}
    monkeypatch.setattr(theirs, "_set_env_vars", set_by_torchruntime.update)
    theirs.set_rocm_env_vars(torchruntime_gpus(replay(name)), "rocm6.2")
    assert set_by_torchruntime.get("HSA_OVERRIDE_GFX_VERSION") == "10.3.5"


# -- the differential, on every replayed capture ----------------------------------------------------
def _theirs_runs(report, theirs: str) -> bool:
    """Whether accelstack's plan for the capture accepts torchruntime's answer (its fallback "cpu" aside)."""
    return theirs != "cpu" and not theirs.startswith("raises") and plan_of(report, "torch", backend=theirs, python=PYTHON).ok


# Captures where accelstack's get_gpus() states another fact than torchruntime's own detection, so that
# torchruntime's rules (policy="torchruntime") reach another answer than the real torchruntime does; each is
# in docs/torchruntime.md.
OTHER_FACTS = {
    "linux-nvidia-dgx-spark-gb10-580": "GB10 (DGX Spark) is integrated, with unified memory (is_discrete False); "
    "torchruntime's PCI database calls every NVIDIA GPU discrete, and its rules skip an integrated one",
}


@pytest.mark.parametrize("name", fixture_names())
def test_compat_platform_is_torchruntimes_unless_the_plan_refuses_it(name, monkeypatch, capsys):
    """torchruntime's answer where accelstack's plan for the machine accepts it; else the plan's choice,
    which differs from torchruntime's exactly where DISAGREEMENTS says why (never AMD's own index name)."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" != PYTHON:
        pytest.skip(f"the differential is written for Python {PYTHON} (the compat plan is for the running one)")
    report = replay(name)
    plan = plan_of(report, "torch", python=PYTHON)
    gpus = compat.get_gpus(system=ReplaySystem(str(CAPTURES / name)))
    assert [g.device_name for g in gpus] == [g.name for g in report.gpus if g.vendor in ("nvidia", "amd", "intel", "apple")]
    if not plan.ok:
        with pytest.raises(NotImplementedError):
            compat.get_torch_platform(gpus)
        return
    ours = compat.get_torch_platform(gpus)
    theirs = torchruntime_says(report, monkeypatch)
    capsys.readouterr()
    assert ours != "rocm-amd"
    if name not in OTHER_FACTS:  # torchruntime's own answer, on request (its rules on accelstack's GPU facts)
        assert compat.get_torch_platform(gpus, policy="torchruntime") == theirs
    if _theirs_runs(report, theirs):
        assert ours == theirs
    elif plan.variant != "rocm-amd":
        assert ours == plan.variant
        assert theirs == ours or DISAGREEMENTS[name][:2] == (theirs, ours), DISAGREEMENTS[name][2]


def test_compat_agrees_with_torchruntime_at_least_as_often_as_the_plan(monkeypatch, capsys):
    """The comparison on real captures keeps its agreement or improves it (14 of 45 plans agree; 30 compat answers)."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" != PYTHON:
        pytest.skip(f"the differential is written for Python {PYTHON}")
    plans = answers = 0
    for name in fixture_names():
        report = replay(name)
        theirs = torchruntime_says(report, monkeypatch)
        plan = plan_of(report, "torch", python=PYTHON)
        gpus = compat.get_gpus(system=ReplaySystem(str(CAPTURES / name)))
        plans += plan.ok and plan.variant == theirs
        answers += plan.ok and compat.get_torch_platform(gpus) == theirs
    capsys.readouterr()
    assert answers >= plans and answers >= 30
