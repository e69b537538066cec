"""SIGKILL the installer at each step of the transaction; the next run must recover to a working runtime.

The kill points are found black-box, from the installer's own --json progress events:
during the download (the loopback server drips the file), during the staging install, during the
check before the pointer switch, and right after the switch.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from accelstack.installer.home import Home
from accelstack.installer.repair import audit

from installer_helpers import cli_env, result_of, run_cli

KILL_POINTS = {
    "fetch": lambda e: e.get("stage") == "fetch" and e.get("kind") == "advance" and e.get("task") and 0 < e.get("done", 0),
    "unpack": lambda e: e.get("stage") == "install" and e.get("kind") == "start",
    "check": lambda e: e.get("stage") == "install" and "checking" in e.get("message", ""),
    "verify": lambda e: e.get("stage") == "verify" and e.get("kind") == "start",
    "after-switch": lambda e: e.get("stage") == "install" and e.get("kind") == "end",
}


def _kill_when(argv, env, predicate) -> bool:
    proc = subprocess.Popen([sys.executable, "-m", "accelstack", *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    killed = False
    for line in proc.stdout:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "progress" and predicate(event):
            proc.send_signal(signal.SIGKILL)
            killed = True
            break
    proc.wait(timeout=60)
    return killed


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_sigkill_during_upgrade_leaves_a_working_runtime(site, tmp_path, point):
    home_dir, cache = tmp_path / "home", tmp_path / "cache"
    env = cli_env(home_dir, cache)
    key = site["public_key"]
    v1 = result_of(run_cli(["install", "--json", "--no-build", "--manifest", site["v1"], "--trusted-key", key], env))["runtime"]

    site["server"].set_delay(0.01 if point == "fetch" else 0.0)
    argv = ["install", "--json", "--no-build", "--manifest", site["v2"], "--trusted-key", key]
    assert _kill_when(argv, env, KILL_POINTS[point]), f"never reached {point}"
    site["server"].set_delay(0.0)

    home = Home(home_dir)
    active = home.read_active().active["ggml"]
    assert active == v1 or point == "after-switch"
    # whatever is active is complete and intact, even before any recovery runs
    assert audit(home, active).healthy

    proc = run_cli(argv, env)
    assert proc.returncode == 0, proc.stderr
    done = result_of(proc)
    assert home.read_active().active["ggml"] == done["runtime"] != v1
    assert audit(home, done["runtime"]).healthy
    assert not any(home.staging.iterdir())
