"""Full disk, read-only home, corrupt receipt, held lock: clear errors, nothing lost."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from accelstack.installer.home import Home
from accelstack.installer.repair import audit

from installer_helpers import cli_env, error_of, result_of, run_cli


def _mount_tmpfs(path: Path, size: str, readonly: bool = False) -> None:
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (",ro" if readonly else "")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stdout.decode().strip()}")


@pytest.fixture
def tmpfs(tmp_path):
    mounts = []

    def make(name: str, size: str, readonly: bool = False) -> Path:
        p = tmp_path / name
        _mount_tmpfs(p, size, readonly)
        mounts.append(p)
        return p

    yield make
    for p in reversed(mounts):
        subprocess.run(["umount", "-l", str(p)])


def test_full_disk_keeps_the_previous_runtime(site, tmp_path, tmpfs, ggml_cpu_build):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    # room for one runtime but not for a second beside it (sized from the build: lean packaging
    # shrank the CPU runtime from ~50 MB to ~25 MB installed)
    installed = ggml_cpu_build.installed_size or 50 * 2**20
    home = tmpfs("home", f"{int(installed * 1.5) // 2**20 + 2}m")
    env = cli_env(home, tmp_path / "cache")
    key = site["public_key"]
    v1 = result_of(run_cli(["install", "--json", "--no-build", "--manifest", site["v1"], "--trusted-key", key], env))["runtime"]
    proc = run_cli(["install", "--json", "--no-build", "--manifest", site["v2"], "--trusted-key", key], env)
    assert proc.returncode != 0
    err = error_of(proc)
    assert "disk is full" in err["message"] or "space" in err["message"].lower()
    h = Home(home)
    assert h.read_active().active["ggml"] == v1
    assert audit(h, v1).healthy
    assert not any(h.staging.iterdir())


def test_read_only_home_is_a_clear_error(site, tmp_path, tmpfs):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    home = tmpfs("ro-home", "1m", readonly=True)
    env = cli_env(home, tmp_path / "cache")
    proc = run_cli(["install", "--json", "--no-build", "--manifest", site["v1"], "--trusted-key", site["public_key"]], env)
    assert proc.returncode != 0
    err = error_of(proc)
    assert "not writable" in err["message"] and err["action"] == "choose-home" and "--home" in err["run"]


def test_corrupt_receipt_is_reported_and_repaired_by_reinstall(site, tmp_path):
    env = cli_env(tmp_path / "home", tmp_path / "cache")
    key = site["public_key"]
    rid = result_of(run_cli(["install", "--json", "--no-build", "--manifest", site["v1"], "--trusted-key", key], env))["runtime"]
    h = Home(tmp_path / "home")
    runtime_dir = h.runtime_path(h.read_receipt(rid))
    runtime_files = sorted(p.name for p in runtime_dir.iterdir())
    h.receipt_path(rid).write_text('{"id": 12, "stack": ')
    proc = run_cli(["repair", "--json"], env)
    assert proc.returncode != 0
    err = error_of(proc)
    assert "corrupt" in err["message"] and err["action"] == "reinstall" and "--force" in err["run"]
    status = result_of(run_cli(["status", "--json"], env))["stacks"]
    assert any("corrupt" in p["message"] for s in status for p in s["problems"])
    assert sorted(p.name for p in runtime_dir.iterdir()) == runtime_files  # nothing lost
    proc = run_cli(["install", "--json", "--no-build", "--force", "--manifest", site["v1"], "--trusted-key", key], env)
    assert proc.returncode == 0, proc.stderr
    assert h.read_receipt(rid).id == rid


def test_a_second_install_says_who_holds_the_lock(tmp_path, site):
    home = Home(tmp_path / "home")
    home.ensure()
    env = cli_env(tmp_path / "home", tmp_path / "cache")
    with home.lock("install (test holder)"):
        proc = run_cli(["install", "--json", "--no-build", "--manifest", site["v1"], "--trusted-key", site["public_key"]], env)
    assert proc.returncode != 0
    err = error_of(proc)
    assert str(os.getpid()) in err["message"] and "install (test holder)" in err["message"]
    assert err["action"] == "wait" and "--wait" in err["run"]


def test_a_lock_left_by_a_killed_process_is_recovered(tmp_path, site):
    home_dir = tmp_path / "home"
    code = (
        "import sys, time; from accelstack.installer.home import Home; "
        f"h = Home({str(home_dir)!r}); h.ensure(); l = h.lock('install'); l.__enter__(); print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    env = cli_env(home_dir, tmp_path / "cache")
    proc = run_cli(["install", "--json", "--no-build", "--manifest", site["v1"], "--trusted-key", site["public_key"]], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
