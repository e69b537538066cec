"""Issue 29, integrity and data: gc never deletes what could still be named, and a removal killed at
any point is finished by the next command.

Real installs of the CPU build from a loopback server, real CLI processes, real SIGKILLs.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import accelstack
from accelstack.core.verifiers import import_verifier
from accelstack.installer.home import OWNER_MARK, Home
from accelstack.settings import Settings

from installer_helpers import cli_env, result_of, run_cli


def _settings(tmp_path: Path, site, manifest: str = "v1") -> Settings:
    return Settings.resolve(home=tmp_path / "home", cache=tmp_path / "cache", manifests=[site[manifest]],
                            trusted_keys=[site["public_key"]], allow_build=False)


def _install(s: Settings):
    plan = accelstack.plan(stack="ggml", settings=s)
    return accelstack.install(plan, settings=s, verifier=import_verifier()).receipt


# -- gc keeps what could still be named -----------------------------------------------------------
def test_gc_keeps_the_active_runtime_whose_receipt_is_unreadable_and_says_why(site, tmp_path):
    s = _settings(tmp_path, site)
    r = _install(s)
    home = Home(s.home)
    where = home.runtime_path(r)
    home.receipt_path(r.id).write_text(json.dumps({"format": 99}))
    proc = run_cli(["gc", "--json"], cli_env(s.home, s.cache))
    assert proc.returncode == 0, proc.stderr
    assert where.is_dir() and (where / OWNER_MARK).is_file()
    rep = result_of(proc)
    assert r.id not in rep["runtimes_removed"]
    kept = {k["name"]: k["reason"] for k in rep["runtimes_kept"]}
    assert "active ggml runtime" in kept[r.id]
    proc = run_cli(["gc"], cli_env(s.home, s.cache))
    assert proc.returncode == 0 and f"kept {r.id}: " in proc.stdout, proc.stdout


def test_gc_keeps_a_runtime_active_json_names_without_a_receipt_or_previous(site, tmp_path):
    s = _settings(tmp_path, site)
    r = _install(s)
    home = Home(s.home)
    where = home.runtime_path(r)
    home.receipt_path(r.id).unlink()
    home.last_good_active_path.unlink()
    proc = run_cli(["gc", "--json"], cli_env(s.home, s.cache))
    assert proc.returncode == 0, proc.stderr
    assert where.is_dir() and (where / OWNER_MARK).is_file()
    kept = {k["name"]: k["reason"] for k in result_of(proc)["runtimes_kept"]}
    assert where.name in kept and "active.json" in kept[where.name]


def test_gc_keeps_a_runtime_only_the_last_good_copy_names(site, tmp_path):
    s = _settings(tmp_path, site)
    r = _install(s)
    home = Home(s.home)
    home.receipt_path(r.id).unlink()
    home.active_path.write_text(json.dumps({"active": {}, "previous": {}}))  # a torn pointer, rewritten empty
    proc = run_cli(["gc", "--json"], cli_env(s.home, s.cache))
    assert proc.returncode == 0, proc.stderr
    assert home.runtime_path(r).is_dir()
    assert "last good copy" in {k["name"]: k["reason"] for k in result_of(proc)["runtimes_kept"]}[r.id]


# -- a kill during removal: the next command finishes it -------------------------------------------
# A child process that removes the runtime (uninstall, through the CLI's own entry point) and
# SIGKILLs itself at a chosen step: after the N-th unlink/rmdir, or right after the owner mark goes.
_KILLER = r"""
import os, signal, sys
when = sys.argv[1]
count = [0]
def counted(real):
    def call(path, *a, **kw):
        out = real(path, *a, **kw)
        count[0] += 1
        name = os.path.basename(os.fspath(path))
        if (when == "mark" and name == ".accelstack-owned") or (when.isdecimal() and count[0] == int(when)):
            os.kill(os.getpid(), signal.SIGKILL)
        return out
    return call
os.unlink = counted(os.unlink)
os.remove = os.unlink
os.rmdir = counted(os.rmdir)
from accelstack.cli import main
sys.exit(main(["uninstall", "--yes"]))
"""


def _removal_steps(home: Path) -> int:
    return sum(1 for _ in home.joinpath("runtimes", "ggml").rglob("*")) + 1


@pytest.mark.parametrize("when", ["mark", "1", "3", "half", "last"])
def test_a_removal_killed_at_any_point_is_finished_by_the_next_gc(site, tmp_path, when):
    s = _settings(tmp_path, site)
    r = _install(s)
    home = Home(s.home)
    where = home.runtime_path(r)
    steps = _removal_steps(s.home)
    at = {"half": str(steps // 2), "last": str(steps - 1)}.get(when, when)
    env = cli_env(s.home, s.cache)
    proc = subprocess.run([sys.executable, "-c", _KILLER, at], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr)
    # never half a runtime under its own name: whole (the kill came before its removal) or gone
    assert not where.exists() or all((where / f.path).is_file() for f in r.files)
    proc = run_cli(["gc", "--json"], env)
    assert proc.returncode == 0, proc.stderr
    named = set(home.read_active().active.values())
    left = sorted(p.name for p in home.runtimes("ggml").iterdir())
    assert all(name in named and home.owns(home.runtimes("ggml") / name) for name in left), left  # nothing half-deleted
    assert not any(home.staging.iterdir())
    proc = run_cli(["uninstall", "--yes", "--json"], env)
    assert proc.returncode == 0, proc.stderr
    assert list(home.runtimes("ggml").iterdir()) == []


# -- bundle create -o: checked before the work ------------------------------------------------------
def _special(tmp_path: Path, kind: str) -> Path:
    p = tmp_path / f"out-{kind}"
    if kind == "dir":
        p.mkdir()
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "device":
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        os.mknod(p, 0o600 | __import__("stat").S_IFCHR, os.makedev(1, 3))  # what /dev/null is
    else:
        p.symlink_to(tmp_path / "elsewhere.tar")
    return p


@pytest.mark.parametrize("kind", ["dir", "fifo", "device", "link"])
def test_bundle_create_refuses_an_output_that_is_not_a_regular_file_before_the_work(site, tmp_path, kind):
    import stat

    out = _special(tmp_path, kind)
    before = os.lstat(out)
    env = cli_env(tmp_path / "home", tmp_path / "cache")
    proc = run_cli(["bundle", "create", "--all", "--manifest", site["v1"], "--trusted-key", site["public_key"],
                    "-o", str(out), "--json"], env)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    after = os.lstat(out)
    assert stat.S_IFMT(after.st_mode) == stat.S_IFMT(before.st_mode) and after.st_ino == before.st_ino
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.whl"))  # nothing fetched
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
    if kind == "dir":
        assert list(out.iterdir()) == []
    if kind == "link":
        assert not (tmp_path / "elsewhere.tar").exists()
