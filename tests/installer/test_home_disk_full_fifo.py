"""Issue 29: the home's disk full, and FIFOs in the home, met by the real CLI on a real install.

- With the home on a full file system (a small tmpfs: a real ENOSPC; where mounting is not allowed,
  a file size limit on the child, EFBIG), every command that takes the home's lock says the disk is
  full (a typed error, exit 1, one JSON error line) instead of an ``OSError`` traceback from writing
  ``install.owner``, and the active runtime is left as it was.
- ``install --dry-run`` and ``status`` with a FIFO at ``settings.json`` or the rollback watermarks
  answer instead of waiting forever for a writer.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

from accelstack.installer.home import Home

from cli_helpers import REPO, error_of, final_of, result_of, run_cli

# (an install naming v1's manifest again would be a rollback, refused before the lock: v2's, forced)
COMMANDS = [["install", "--no-build", "--force"], ["install", "--no-build", "--force", "--manifest", "V2"], ["repair"],
            ["rollback"], ["gc"], ["uninstall", "--yes"]]


def _mount_tmpfs(where: Path, size: str) -> bool:
    if os.geteuid() != 0:
        return False
    where.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True).returncode == 0


@pytest.fixture(params=["tmpfs", "file size limit"])
def full_home(request, tmp_path, site) -> Iterator[Tuple[Dict[str, str], Path, Optional[int]]]:
    """A home with v1 then v2 installed (v1 previous), then its disk filled: (env, home, RLIMIT_FSIZE to run with)."""
    disk = tmp_path / "disk"
    mounted = request.param == "tmpfs" and _mount_tmpfs(disk, "300m")
    if request.param == "tmpfs" and not mounted:
        pytest.skip("mounting a tmpfs needs root (the file size limit case runs instead)")
    if not mounted:
        disk.mkdir()
    home = disk / "home"
    env = {"ACCELSTACK_HOME": str(home), "ACCELSTACK_CACHE": str(tmp_path / "cache"), "ACCELSTACK_OFFLINE": ""}
    try:
        for v in ("v1", "v2"):
            rc, out, err = run_cli(["install", "--json", "--no-build", "--manifest", site[v], "--trusted-key",
                                    site["public_key"]], env)
            assert rc == 0, err[-2000:]
        limit = None
        if mounted:
            fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                for chunk in (1 << 20, 4096, 1):  # fill the disk to its last byte
                    try:
                        while True:
                            os.write(fd, b"\0" * chunk)
                    except OSError:
                        pass
            finally:
                os.close(fd)
        else:
            limit = 0
        yield env, home, limit
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _run_limited(args: List[str], env: Dict[str, str], limit: Optional[int]) -> Tuple[int, str, str]:
    if limit is None:
        return run_cli(args, env, timeout=300)

    def no_bigger_files() -> None:  # writing past the limit fails with EFBIG instead of killing the process
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    full = {**os.environ, **env, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-m", "accelstack", *args], capture_output=True, text=True, env=full,
                          timeout=300, stdin=subprocess.DEVNULL, preexec_fn=no_bigger_files)
    return proc.returncode, proc.stdout, proc.stderr


def _snapshot(home: Path) -> Tuple[str, List[str]]:
    return (home / "active.json").read_text(), sorted(str(p.relative_to(home)) for p in (home / "runtimes").rglob("*"))


def test_a_full_disk_is_said_by_every_command_that_takes_the_lock(full_home, site):
    env, home, limit = full_home
    before = _snapshot(home)
    for command in COMMANDS:
        args = [site["v2"] if a == "V2" else a for a in command]
        if args[0] == "install":
            args += ["--trusted-key", site["public_key"]]
        rc, out, err = _run_limited([*args, "--json"], env, limit)
        assert "Traceback" not in err, (command, err[-3000:])
        e = error_of(out)
        assert rc == 1, (command, rc, e)
        assert e["code"] == "disk-full" and e["action"] == "free-disk", (command, e)
        assert "disk of the runtime home" in e["message"] and "is full" in e["message"], e["message"]
        assert "active runtime is as it was" in e["hint"], e
        assert _snapshot(home) == before, command  # nothing changed
        assert not (home / "install.owner").exists()
    rc, out, err = _run_limited(["status", "--offline", "--json"], env, limit)  # status needs no room
    ggml = next(s for s in result_of(out)["stacks"] if s["stack"] == "ggml")
    assert rc == 0 and ggml["healthy"] is True, (rc, ggml)
    if limit is None:
        (home.parent / "filler").unlink()
    else:
        limit = None
    rc, out, err = _run_limited(["gc", "--json"], env, limit)  # with room again, the same commands work
    assert rc == 0, out + err[-2000:]
    assert Home(home).read_active().active["ggml"] == json.loads(before[0])["active"]["ggml"]


@pytest.mark.parametrize("which", ["settings.json", "state/manifest-versions.json", "state/manifests/*.json"])
def test_a_fifo_at_a_state_file_does_not_hang_a_dry_run(site, tmp_path, which):
    env = {"ACCELSTACK_HOME": str(tmp_path / "home"), "ACCELSTACK_CACHE": str(tmp_path / "cache"), "ACCELSTACK_OFFLINE": ""}
    rc, out, err = run_cli(["install", "--json", "--no-build", "--manifest", site["v1"], "--trusted-key", site["public_key"]], env)
    assert rc == 0, err[-2000:]
    planted = next((tmp_path / "home").glob(which))  # the saved manifest: the copy offline runs read
    planted.unlink()
    os.mkfifo(planted)
    for command in (["install", "--dry-run", "--no-build", "--manifest", site["v2"], "--trusted-key", site["public_key"]],
                    ["status"], ["status", "--offline"], ["install", "--dry-run", "--no-build"],
                    ["install", "--dry-run", "--no-build", "--offline"]):
        rc, out, err = run_cli([*command, "--json"], env, timeout=60)  # a plain open() would never return
        assert "Traceback" not in err, (command, err[-3000:])
        last = final_of(out)
        assert last["event"] == "result" or last["code"] != "internal-error", (command, last)
        if last["event"] == "error" and which.endswith("manifest-versions.json") and command[1] == "--dry-run":
            assert "not a regular file" in last["message"], (command, last)
