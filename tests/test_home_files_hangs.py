"""Issue 29: no command hangs on, or dies with a traceback from, the home's own files and paths.

- A FIFO planted where the home keeps a state file (``active.json``, a receipt, ``settings.json``,
  the rollback watermarks, the cache's registry of homes, the last good copy of ``active.json``):
  a plain ``open()`` would wait forever for a writer. Each command must answer (refusing the file
  as "not a regular file", or going on without it) within the test's timeout.
- A home or cache path longer than the system allows: the usual "choose a directory" error, not an
  ``OSError [Errno 36]`` traceback.
- scripts/test.sh: the apt steps wait for apt's lock, run their own ``apt-get update``, fail the run
  under CI with the reason, and outside CI say at the end what was skipped and why.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Dict

import pytest

from cli_helpers import REPO, error_of, final_of, run_cli

TIMEOUT = 60  # a hang is a timeout (subprocess.run kills the child); an answer takes ~1 s


def _env(tmp_path: Path) -> Dict[str, str]:
    return {"ACCELSTACK_HOME": str(tmp_path / "home"), "ACCELSTACK_CACHE": str(tmp_path / "cache"),
            "ACCELSTACK_OFFLINE": "1"}


def _plant_fifo(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)


def _home_files(tmp_path: Path) -> Dict[str, Path]:
    home, cache = tmp_path / "home", tmp_path / "cache"
    key = hashlib.sha256(str((tmp_path / "other-home").resolve()).encode()).hexdigest()[:16]
    return {"active.json": home / "active.json", "receipt": home / "receipts" / "ggml-cpu-1.json",
            "settings.json": home / "settings.json", "manifest-versions.json": home / "state" / "manifest-versions.json",
            "homes registry": cache / "homes" / f"{key}.json", "active.last-good.json": home / "active.last-good.json",
            "install.owner": home / "install.owner"}


@pytest.mark.parametrize("which", ["active.json", "receipt", "settings.json", "manifest-versions.json",
                                   "homes registry", "active.last-good.json", "install.owner"])
@pytest.mark.parametrize("command", [["status", "--offline"], ["gc"], ["repair"], ["rollback"]])
def test_a_fifo_in_the_home_never_hangs_a_command(tmp_path, which, command):
    (tmp_path / "home" / "receipts").mkdir(parents=True)
    (tmp_path / "other-home").mkdir()
    _plant_fifo(_home_files(tmp_path)[which])
    rc, out, err = run_cli([*command, "--json"], _env(tmp_path), timeout=TIMEOUT)
    assert "Traceback" not in err, err[-3000:]
    last = final_of(out)
    if last["event"] == "error":
        assert last["code"] != "internal-error" and "bug in accelstack" not in last["message"], last
    assert (rc == 0) == (last["event"] == "result" and last["ok"]), (rc, last)  # status on damage: ok false, 1
    if which in ("active.json", "receipt") and command[0] == "status":  # refused, and said why
        assert "not a regular file" in json.dumps(last), last
    planted = _home_files(tmp_path)[which]
    if planted.exists() or planted.is_symlink():  # left alone, or replaced whole (repair rebuilds active.json)
        mode = os.lstat(planted).st_mode
        assert stat.S_ISFIFO(mode) or stat.S_ISREG(mode), oct(mode)


def test_state_file_readers_refuse_a_fifo_without_blocking(tmp_path):
    """The library's own readers, one by one (a thread would hang forever on a plain open())."""
    from accelstack.artifacts.cache import Cache
    from accelstack.core.planning import remembered_channels
    from accelstack.installer.errors import StateError
    from accelstack.installer.home import Home
    from accelstack.installer.maintenance import blobs_of_other_homes
    from accelstack.installer.recovery import last_good_active
    from accelstack.manifests.errors import ManifestError
    from accelstack.manifests.rollback import RollbackStore
    from accelstack.settings import Settings

    files = _home_files(tmp_path)
    (tmp_path / "other-home").mkdir()
    for path in files.values():
        _plant_fifo(path)
    home = Home(tmp_path / "home")
    with pytest.raises(StateError, match="not a regular file"):
        home.read_active()
    with pytest.raises(StateError, match="not a regular file"):
        home.read_receipt("ggml-cpu-1")
    assert last_good_active(home) is None
    with pytest.raises(ManifestError, match="not a regular file"):
        RollbackStore(files["manifest-versions.json"])._read()
    settings = Settings.resolve(home=tmp_path / "home", cache=tmp_path / "cache")
    assert remembered_channels(settings) == []
    assert blobs_of_other_homes(Cache(tmp_path / "cache"), home) == (set(), [])
    assert home.lock("install").holder() == {}


# -- paths longer than the system takes ----------------------------------------------------------
@pytest.mark.parametrize("variable, flag", [("ACCELSTACK_HOME", "--home"), ("ACCELSTACK_CACHE", ""),
                                            ("ACCELSTACK_BUILD_CACHE", ""), ("ACCELSTACK_PROBE_CACHE", ""),
                                            ("ACCELSTACK_CONFIG_DIR", ""), ("ACCELSTACK_CONFIG", "")])
@pytest.mark.parametrize("shape", ["one long name", "deep"])
def test_a_path_longer_than_the_system_allows_is_a_usage_error(tmp_path, variable, flag, shape):
    long = tmp_path / ("a" * 5000) if shape == "one long name" else tmp_path.joinpath(*["d" * 200] * 25)
    env = _env(tmp_path)
    for command in (["status", "--offline"], ["gc"]):
        rc, out, err = run_cli([*command, "--json"], {**env, variable: str(long)}, timeout=TIMEOUT)
        assert "Traceback" not in err, err[-3000:]
        e = error_of(out)
        assert rc == 2 and e["code"] == "usage", (rc, e)
        assert "too long" in e["message"] and "choose" in e["hint"], e
        assert len(e["message"]) < 600, e["message"]  # the path is cut, not printed whole
        assert variable in e["message"] and (flag in e["message"] if flag else True), e["message"]
    if flag:
        rc, out, err = run_cli(["status", "--offline", "--json", flag, str(long)], env, timeout=TIMEOUT)
        assert rc == 2 and "too long" in error_of(out)["message"] and "Traceback" not in err, (out, err[-2000:])
        assert error_of(out)["action"] == "choose-home"


# -- scripts/test.sh -------------------------------------------------------------------------------
SCRIPT = REPO / "scripts" / "test.sh"


def _setup_step(tmp_path: Path, ci: str, apt: str) -> subprocess.CompletedProcess:
    """scripts/test.sh's apt step, sourced (its main part does not run), with apt-get replaced by ``apt``
    (a shell function body) and a package whose command is missing, so the step has to install it."""
    script = f"""
        set -euo pipefail
        source {str(SCRIPT)!r}
        apt_get() {{ {apt}; }}
        install_packages "the test tool" "its checks will be skipped" accelstack-missing-tool -- accelstack-missing-pkg
        echo "after the step"
        print_skipped
    """
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci:
        env["CI"] = ci
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=TIMEOUT,
                          cwd=tmp_path)


BUSY = 'echo "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 (apt-get)" >&2; return 100'


def test_test_sh_fails_under_ci_when_a_setup_step_cannot_install(tmp_path):
    proc = _setup_step(tmp_path, "true", BUSY)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "after the step" not in proc.stdout
    text = proc.stdout + proc.stderr
    assert "could not install the test tool" in text and "held by process 4242" in text, text


def test_test_sh_outside_ci_skips_and_says_why_at_the_end(tmp_path):
    proc = _setup_step(tmp_path, "", BUSY)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after = proc.stdout.split("after the step", 1)[1]
    assert "skipped" in after and "the test tool" in after and "held by process 4242" in after, proc.stdout


def test_test_sh_runs_its_own_apt_update_and_waits_for_the_lock(tmp_path):
    calls = tmp_path / "calls"
    proc = _setup_step(tmp_path, "true", f'echo "$*" >> {str(calls)!r}')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = calls.read_text().splitlines()
    assert lines[0].split()[0] == "update", lines  # its own update first, then the install
    assert "install" in lines[1] and "accelstack-missing-pkg" in lines[1], lines
    text = SCRIPT.read_text() + (REPO / "scripts" / "setup-vulkan.sh").read_text()
    assert "DPkg::Lock::Timeout" in text
    for line in text.splitlines():  # every apt-get that changes the system waits for the lock
        said = line.lstrip().startswith(("#", "could_not", "echo", "note"))  # words about apt, not a call
        if "apt-get" in line and (" install " in line or " update" in line) and not said:
            assert "apt_get" in line or "DPkg::Lock::Timeout" in line or "${lock[@]}" in line, line


def test_the_test_scripts_pass_shellcheck():
    exe = shutil.which("shellcheck")
    if exe is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    for args in (["scripts/test.sh"], ["-S", "warning", "scripts/setup-vulkan.sh"]):  # the latter has an old `ls` note
        proc = subprocess.run([exe, "-x", *args], cwd=REPO, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
