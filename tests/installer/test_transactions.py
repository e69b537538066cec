"""Transactions that hold: each test damages, kills or misleads, then checks nothing was lost.

These go through the library core (the path an app takes), with the real CPU build published
on a loopback server. The cheap import check stands in for the generation check where the check
is not what is tested; the CLI tests (test_e2e, test_crash) run the real one.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import accelstack
from accelstack.core.verifiers import import_verifier
from accelstack.errors import Action
from accelstack.installer.home import OWNER_MARK, Home
from accelstack.installer.repair import audit
from accelstack.settings import Settings

from installer_helpers import cli_env, result_of, run_cli


def _settings(tmp_path: Path, site, manifest: str = "v1", **kw) -> Settings:
    return Settings.resolve(home=kw.pop("home", tmp_path / "home"), cache=kw.pop("cache", tmp_path / "cache"),
                            manifests=[site[manifest]], trusted_keys=[site["public_key"]], allow_build=False, **kw)


def _install(s: Settings, force: bool = False):
    plan = accelstack.plan(stack="ggml", settings=s)
    return accelstack.install(plan, settings=s, verifier=import_verifier(), force=force).receipt


# -- cleanup deletes only what accelstack made ----------------------------------------------------
def test_recover_leaves_foreign_staging_content_and_dry_run_touches_nothing(site, tmp_path):
    project = tmp_path / "project"  # a mistyped home: someone's project with a staging/ folder
    (project / "staging" / "my-work").mkdir(parents=True)
    (project / "staging" / "my-work" / "notes.txt").write_text("precious")
    env = cli_env(project, tmp_path / "cache")
    before = sorted(str(p.relative_to(project)) for p in project.rglob("*"))
    proc = run_cli(["install", "--dry-run", "--json", "--no-build", "--manifest", site["v1"], "--trusted-key", site["public_key"]], env)
    assert proc.returncode == 0, proc.stderr
    assert result_of(proc)["dry_run"] is True
    assert sorted(str(p.relative_to(project)) for p in project.rglob("*")) == before  # a dry run writes nothing at all

    s = _settings(tmp_path, site, home=project)
    _install(s)
    assert (project / "staging" / "my-work" / "notes.txt").read_text() == "precious"


def test_recover_never_follows_a_symlinked_staging_dir(site, tmp_path):
    outside = tmp_path / "outside"
    (outside / "victim").mkdir(parents=True)
    (outside / "victim" / OWNER_MARK).write_text("{}")  # even a marked directory, reached through a link
    (outside / "victim" / "data.bin").write_bytes(b"x" * 10)
    home = tmp_path / "home"
    home.mkdir()
    (home / "staging").symlink_to(outside, target_is_directory=True)
    s = _settings(tmp_path, site)
    with pytest.raises(accelstack.AccelstackError):
        _install(s)  # staging through a link to elsewhere: refused, not followed
    assert (outside / "victim" / "data.bin").read_bytes() == b"x" * 10


def test_a_killed_install_leaves_only_marked_leftovers_which_are_removed(site, tmp_path):
    s = _settings(tmp_path, site)
    home = Home(s.home)
    home.ensure()
    leftover = home.make_owned_dir(home.staging, "cpu-abc.123")
    (leftover / "half.so").write_bytes(b"\0" * 100)
    stranger = home.staging / "not-ours"
    stranger.mkdir()
    _install(s)
    assert not leftover.exists() and stranger.is_dir()


# -- forced reinstall and upgrade never leave the active runtime missing -------------------------
def test_forced_reinstall_builds_beside_the_old_one_and_switches(site, tmp_path):
    s = _settings(tmp_path, site)
    first = _install(s)
    home = Home(s.home)
    old_dir = home.runtime_path(first)
    second = _install(s, force=True)
    assert second.id == first.id
    new_dir = home.runtime_path(home.read_receipt(first.id))
    assert new_dir != old_dir and new_dir.is_dir() and not old_dir.exists()
    assert audit(home, first.id).healthy


@pytest.mark.parametrize("point", ["stage", "verify", "commit"])
def test_sigkill_during_forced_reinstall_keeps_a_complete_active_runtime(site, tmp_path, point):
    s = _settings(tmp_path, site)
    first = _install(s)
    home = Home(s.home)
    # a child process runs the forced reinstall and kills itself at the chosen point
    code = f"""
import os, signal, accelstack
from accelstack.settings import Settings
from accelstack.core.verifiers import import_verifier
from accelstack.installer import ggml, transaction
s = Settings.resolve(home={str(s.home)!r}, cache={str(s.cache)!r}, manifests={s.manifests!r}, trusted_keys={s.trusted_keys!r}, allow_build=False)
die = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
point = {point!r}
if point == "stage":
    real = ggml.install_wheel
    def half(wheel, target, name):
        real(wheel, target, name); die()
    ggml.install_wheel = half
verifier = import_verifier()
if point == "verify":
    verifier = lambda staged, progress: die()
if point == "commit":
    ggml.Home.write_receipt = lambda self, r: die()
accelstack.install(accelstack.plan(stack="ggml", settings=s), settings=s, verifier=verifier, force=True)
"""
    proc = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    state = home.read_active()
    assert state.active["ggml"] == first.id
    assert audit(home, first.id).healthy  # the receipt still names a complete directory
    assert [st for st in accelstack.status(settings=s) if st.stack == "ggml"][0].healthy
    _install(s)  # the next run cleans up and is a no-op
    assert not any(home.owned_children(home.staging))


# -- repair restores everything, keeps going, rebuilds the pointer --------------------------------
def test_repair_restores_package_metadata_and_keeps_going_past_an_unrepairable_file(site, tmp_path):
    s = _settings(tmp_path, site)
    r = _install(s)
    home = Home(s.home)
    root = home.runtime_path(r)
    record = next(f.path for f in r.files if f.path.endswith(".dist-info/RECORD"))
    installer = next(f.path for f in r.files if f.path.endswith(".dist-info/INSTALLER"))
    lib = next(f.path for f in r.files if f.path.endswith(".so"))
    (root / record).unlink()
    (root / installer).write_text("tampered\n")
    with open(root / lib, "r+b") as fh:
        fh.seek(4096)
        fh.write(b"\0garbage\0" * 10)
    # one file the wheel cannot produce: the receipt claims a file that is not in the wheel
    receipt = home.read_receipt(r.id)
    from accelstack.installer.records import InstalledFile

    receipt.files.append(InstalledFile(path="stable_diffusion_cpp/not-in-the-wheel.txt", sha256="0" * 64, size=1))
    home.write_receipt(receipt)
    with pytest.raises(accelstack.AccelstackError) as info:
        accelstack.repair(settings=s, verifier=import_verifier())
    assert "1 file of runtime" in info.value.message and info.value.action == Action.REINSTALL
    rep = audit(home, r.id)
    assert rep.missing == ["stable_diffusion_cpp/not-in-the-wheel.txt"] and rep.corrupt == []  # all the others restored


@pytest.mark.parametrize("damage", ["", "garbage{", '{"active": {"ggml": ', '{"active": ["x"], "previous": 7}', "\xff\xfe"])
def test_damaged_active_json_is_rebuilt_from_the_receipts_by_repair(site, tmp_path, damage):
    s = _settings(tmp_path, site)
    r1 = _install(s)
    r2 = _install(_settings(tmp_path, site, "v2"))
    home = Home(s.home)
    home.active_path.write_bytes(damage.encode("latin-1"))
    st = [x for x in accelstack.status(settings=s) if x.stack == "ggml"][0]
    assert st.problems and st.problems[0].action == "repair"
    rep = accelstack.repair(settings=s, verifier=import_verifier())
    assert rep.pointer_rebuilt and rep.healthy
    state = home.read_active()
    assert state.active["ggml"] == r2.id and state.previous["ggml"] == r1.id


# -- homes on several disks, copied homes, shared caches ------------------------------------------
def test_runtimes_on_another_filesystem_fail_clearly_before_any_work(site, tmp_path):
    other = Path("/dev/shm") / f"accelstack-test-{os.getpid()}"
    if not Path("/dev/shm").is_dir() or os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem here")
    other.mkdir()
    try:
        home = tmp_path / "home"
        home.mkdir()
        (home / "runtimes").symlink_to(other, target_is_directory=True)
        s = _settings(tmp_path, site)
        with pytest.raises(accelstack.AccelstackError) as info:
            _install(s)
        assert "different filesystems" in info.value.message and info.value.action == Action.CHOOSE_HOME
        assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.whl"))  # nothing fetched
        assert not any(Home(home).owned_children(Home(home).staging))
    finally:
        shutil.rmtree(other, ignore_errors=True)


def test_a_moved_home_keeps_working(site, tmp_path):
    s = _settings(tmp_path, site)
    r = _install(s)
    moved = tmp_path / "elsewhere" / "home"
    moved.parent.mkdir()
    shutil.move(str(s.home), str(moved))
    s2 = s.replace(home=moved)
    st = [x for x in accelstack.status(settings=s2) if x.stack == "ggml"][0]
    assert st.active == r.id and st.healthy and st.runtime_path.startswith(str(moved))
    assert _install(s2).id == r.id  # recognised as installed: a no-op
    assert accelstack.verify(settings=s2).ok


def test_gc_keeps_blobs_another_home_on_the_same_cache_still_uses(site, tmp_path):
    cache = tmp_path / "shared-cache"
    a = _settings(tmp_path, site, home=tmp_path / "a", cache=cache)
    b = _settings(tmp_path, site, "v2", home=tmp_path / "b", cache=cache)
    ra = _install(a)
    _install(b)
    accelstack.uninstall(settings=b)
    rep = accelstack.gc(settings=b)
    wheel_a = ra.artifacts[0].sha256
    assert wheel_a in rep.blobs_kept_shared and str(a.home.resolve()) in rep.other_homes
    assert (cache / "blobs" / "sha256" / wheel_a).is_file()
    assert len(rep.blobs_removed) == 1  # b's own wheel, which nothing references any more
    gone = rep.blobs_removed[0]
    assert not (cache / "blobs" / "sha256" / gone).exists()
    assert not (cache / "blobs" / "sha256" / (gone + ".verified")).exists()  # nor its record
    assert audit(Home(a.home), ra.id).healthy


# -- status and verify point at repair ------------------------------------------------------------
def test_status_notices_missing_files_and_verify_fail_points_to_repair(site, tmp_path):
    s = _settings(tmp_path, site)
    r = _install(s)
    home = Home(s.home)
    lib = next(f.path for f in r.files if f.path.startswith("stable_diffusion_cpp/") and f.path.endswith(".so"))
    (home.runtime_path(r) / lib).unlink()  # the library the bindings load
    st = [x for x in accelstack.status(settings=s) if x.stack == "ggml"][0]
    assert not st.healthy and st.missing_files == 1 and st.problems[0].action == "repair"
    env = cli_env(s.home, s.cache)
    proc = run_cli(["status"], env)
    assert "accelstack repair" in proc.stdout
    proc = run_cli(["verify"], env)
    assert proc.returncode != 0 and "accelstack repair" in proc.stdout + proc.stderr


def test_library_errors_carry_a_code_and_an_action_never_cli_syntax(site, tmp_path):
    s = _settings(tmp_path, site)
    with pytest.raises(accelstack.AccelstackError) as info:
        accelstack.repair(settings=s)
    err = info.value
    assert err.code and err.action == Action.INSTALL
    assert "accelstack" not in err.hint and "--" not in err.hint
    data = err.to_dict()
    assert json.loads(json.dumps(data))["hint"]["action"] == "install"
