"""The torch destination's pip step: a pip that hangs without printing is stopped at its time limit,
with the whole process tree, and the environment is left as it was."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import accelstack
from accelstack.errors import AccelstackError, SubprocessTimeout
from accelstack.installer.home import Home
from accelstack.installer.torch_destination import PipCommands, TorchEnvironment
from accelstack.manifests.plan import Command
from accelstack.settings import Settings

from installer_helpers import fake_torch


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


def test_a_torch_on_another_file_system_than_the_prefix_is_kept(tmp_path):
    """The torch being replaced lives on another file system than the environment's prefix (a user
    site on a separate /home): moving it aside died with 'Invalid cross-device link' (issue 47). It
    is moved aside where it lies, and back when pip fails; nothing is lost, nothing left behind."""
    other = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        if os.stat(other).st_dev == os.stat(tmp_path).st_dev:
            pytest.skip("/dev/shm is not another file system here")
        venv = tmp_path / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
        python = str(venv / "bin" / "python")
        site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   capture_output=True, text=True, check=True).stdout.strip())
        user_site = other / "site"
        fake_torch(user_site, "1.0")
        (site / "user-site.pth").write_text(f"{user_site}\n")
        s = Settings.resolve(home=tmp_path / "home", cache=tmp_path / "cache", torch_python=python)
        plan = accelstack.plan(stack="torch", settings=s, python="3.11")
        home = Home(s.home)
        home.ensure()
        dest = TorchEnvironment(home, python, pip_timeout=60, probe_timeout=60)
        failing = [python, "-c", "import sys; sys.exit(1)"]
        with pytest.raises(AccelstackError) as info:
            dest.stage(plan, PipCommands([Command("pip", failing)]), lambda e: None)
        assert "cross-device" not in info.value.message
        assert (user_site / "torch" / "__init__.py").read_text() == "__version__ = '1.0'\n"
        assert sorted(p.name for p in user_site.iterdir()) == ["torch", "torch-1.0.dist-info"]
        staged = dest.stage(plan, PipCommands([Command("pip", [python, "-c", "pass"])]), lambda e: None)
        assert not (user_site / "torch").exists()  # moved aside while the new one is checked
        dest.abort(staged)
        assert sorted(p.name for p in user_site.iterdir()) == ["torch", "torch-1.0.dist-info"]
    finally:
        shutil.rmtree(other, ignore_errors=True)
