"""SIGKILL at every step of a torch install's transaction; the next command that changes the home
finishes or undoes it, and `status` says what happened (issue 47: a kill while pip ran left the
environment without torch, the previous one hidden in a backup folder nothing restored).

The install runs in a child process against a venv holding a distribution named torch (1.0), with a
"pip" that writes torch 2.0 in its place; the child stops at each step (a test hook in this file:
it prints the step and sleeps) and is killed there. Then the real CLI (`gc`, then `status`) runs.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from installer_helpers import cli_env, fake_torch, result_of, run_cli

CHILD = r"""
import os, sys, time
from pathlib import Path
import accelstack
from accelstack.installer import torch_destination as td
from accelstack.installer.home import Home
from accelstack.installer.records import Receipt
from accelstack.manifests.plan import Command
from accelstack.settings import Settings

point, python, home_dir, new_torch = sys.argv[1:5]

def stop(where):
    if where == point:
        print(where, flush=True)
        time.sleep(600)

real_replace = os.replace
moves = []
def replace(src, dst):
    real_replace(src, dst)
    if Path(src).name.startswith("torch"):  # the torch destination's moves (state files have dotted temporary names)
        moves.append(src)
        if len(moves) == 1:
            stop("moving")  # the dist-info moved aside, the package not yet
os.replace = replace

s = Settings.resolve(home=Path(home_dir), cache=Path(home_dir) / "cache", torch_python=python)
plan = accelstack.plan(stack="torch", settings=s, python="3.11")
home = Home(s.home)
home.ensure()
real_write = home.write_receipt
def write_receipt(receipt):
    stop("committing")  # the check passed and the journal says so; the receipt not yet written
    real_write(receipt)
home.write_receipt = write_receipt
dest = td.TorchEnvironment(home, python, pip_timeout=600, probe_timeout=60)
marker = home_dir + ".pip"  # the fake pip's pid, once it has written the new torch (its output is run_pip's)
pip = [python, "-c", f"import os, shutil, sys, time; shutil.copytree({new_torch!r} + '/torch', sys.argv[1] + '/torch');"
       f"open({marker!r}, 'w').write(str(os.getpid())); time.sleep(600 if sys.argv[2] == 'pip' else 0)", "SITE", point]
site = [l for l in os.popen(f"{python} -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'")][0].strip()
pip = [a.replace("SITE", site) for a in pip]
staged = dest.stage(plan, td.PipCommands([Command("pip", pip)]), lambda e: None)
stop("checked")
receipt = Receipt(id="torch-test", stack="torch", backend="cpu", path=python, plan=plan)
dest.commit(staged, receipt)
stop("committed")
print("done", flush=True)
"""

POINTS = {"moving": "1.0", "pip": "1.0", "checked": "1.0", "committing": "2.0", "committed": "2.0"}


def _version(python: str) -> str:
    return subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True,
                          timeout=60).stdout.strip()


@pytest.mark.parametrize("point", list(POINTS))
def test_a_kill_at_any_step_of_a_torch_install_never_loses_torch(tmp_path, point):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    fake_torch(site, "1.0")
    fake_torch(tmp_path / "new", "2.0")
    home = tmp_path / "home"
    env = cli_env(home, tmp_path / "cache")
    child = subprocess.Popen([sys.executable, "-c", CHILD, point, python, str(home), str(tmp_path / "new")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env})
    assert child.stdout is not None
    marker = Path(str(home) + ".pip")
    if point == "pip":  # killed while pip runs: the new torch written, pip not done
        for _ in range(600):
            if marker.is_file() and marker.read_text():
                break
            time.sleep(0.1)
        else:
            pytest.fail("pip never ran")
    else:
        for line in child.stdout:
            if line.strip() == point:
                break
        else:
            pytest.fail(f"never reached {point}: {child.stderr.read() if child.stderr else ''}")
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    if point == "pip":
        os.kill(int(marker.read_text()), signal.SIGKILL)  # pip goes with the process that ran it, as a kill -9 of a group does

    journal = list((home / "state" / "torch-journal").glob("*.json")) if (home / "state" / "torch-journal").is_dir() else []
    if point != "committed":
        assert journal, "the interrupted install left no journal"
        status = result_of(run_cli(["status", "--json", "--offline"], env))
        torch = next(s for s in status["stacks"] if s["stack"] == "torch")
        assert any("was interrupted" in p["message"] for p in torch["problems"]), torch
    proc = run_cli(["gc", "--json"], env)  # the next command that changes the home
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert _version(python) == POINTS[point]
    assert not list(site.glob(".accelstack-backup-*")), "a backup folder was left behind"
    kept = ["torch", "torch-1.0.dist-info"] if POINTS[point] == "1.0" else ["torch"]  # the fake pip writes no dist-info
    assert sorted(p.name for p in site.iterdir() if p.name.startswith("torch")) == kept
    assert not (home / "state" / "torch-journal").is_dir() or not list((home / "state" / "torch-journal").iterdir())
    if point != "committed":
        status = result_of(run_cli(["status", "--json", "--offline"], env))
        torch = next(s for s in status["stacks"] if s["stack"] == "torch")
        words = "was undone" if POINTS[point] == "1.0" else "finished"
        assert any(words in p["message"] for p in torch["problems"]), torch
        assert not any("was interrupted" in p["message"] for p in torch["problems"]), torch
