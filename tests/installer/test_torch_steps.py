"""The torch destination's pip step: a pip that hangs without printing is stopped at its time limit,
with the whole process tree, and the environment is left as it was."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

import accelstack
from accelstack.errors import SubprocessTimeout
from accelstack.installer.home import Home
from accelstack.installer.torch_destination import PipCommands, TorchEnvironment
from accelstack.manifests.plan import Command
from accelstack.settings import Settings


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting to be reaped (checked for a few seconds)."""
    for _ in range(50):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return False
        if state == "Z":
            return False
        time.sleep(0.1)
    return True


def test_a_silent_hanging_pip_is_stopped_with_its_children(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    s = Settings.resolve(home=tmp_path / "home", cache=tmp_path / "cache", torch_python=python)
    plan = accelstack.plan(stack="torch", settings=s, python="3.11")
    marker = tmp_path / "child.pid"
    # a "pip" that starts a child and then sleeps without a word
    hang = [python, "-c", f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']);"
                          f" open({str(marker)!r}, 'w').write(str(p.pid)); time.sleep(120)"]
    home = Home(s.home)
    home.ensure()
    dest = TorchEnvironment(home, python, pip_timeout=2.0, probe_timeout=60)
    start = time.monotonic()
    with pytest.raises(SubprocessTimeout) as info:
        dest.stage(plan, PipCommands([Command("pip", hang)]), lambda e: None)
    assert time.monotonic() - start < 60 and "did not finish within 2 s" in info.value.message
    child = int(marker.read_text())
    assert not _running(child), "the hanging step's child process is still running"
    assert not list(venv.glob(".accelstack-backup*"))  # the undo log is gone
