"""Issue 25: `status` claims no health it did not check, found the way a user found it.

A real install of the CPU build (published on 127.0.0.1) gets 4 bytes of its native library
overwritten in place (same size); the real CLI then has to say so. Default status compares each
file's size, mtime and inode with what the receipt recorded when it was hashed; `status --deep`
re-hashes. An edit that restores the mtime is beyond the cheap check: status must then say it
did not re-hash, and `--deep` must find it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, Tuple

from accelstack.installer.home import Home

from cli_helpers import events_of, result_of, run_cli


def _install(site, tmp_path: Path) -> Tuple[Dict[str, str], Home, str, Path]:
    """A real install through the CLI; returns its env, home, runtime id and the native library."""
    env = {"ACCELSTACK_HOME": str(tmp_path / "home"), "ACCELSTACK_CACHE": str(tmp_path / "cache"), "ACCELSTACK_OFFLINE": ""}
    rc, out, err = run_cli(["install", "--json", "--no-build", "--manifest", site["v1"], "--trusted-key", site["public_key"]], env)
    assert rc == 0, err[-2000:]
    rid = result_of(out)["runtime"]
    home = Home(tmp_path / "home")
    receipt = home.read_receipt(rid)
    libs = [f.path for f in receipt.files if f.path.endswith(".so") or ".so." in f.path]
    lib = next((p for p in libs if "libstable-diffusion" in p), libs[0])
    return env, home, rid, home.runtime_path(receipt) / lib


def _overwrite_4_bytes(path: Path, restore_mtime: bool) -> None:
    before = os.stat(path)
    with open(path, "r+b") as fh:
        fh.seek(before.st_size // 2)
        old = fh.read(4)
        fh.seek(before.st_size // 2)
        fh.write(bytes(b ^ 0xFF for b in old))
    if restore_mtime:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert after.st_size == before.st_size and after.st_ino == before.st_ino
    assert (after.st_mtime_ns == before.st_mtime_ns) == restore_mtime


def _ggml(out: str) -> dict:
    return next(s for s in result_of(out)["stacks"] if s["stack"] == "ggml")


def test_status_finds_a_same_size_overwrite_and_says_what_it_checked(site, tmp_path):
    env, home, rid, lib = _install(site, tmp_path)
    rc, out, err = run_cli(["status", "--offline"], env)
    assert rc == 0, err
    assert "[healthy, not re-hashed]" in out and "match the receipt's size, mtime and inode" in out, out
    rc, out, err = run_cli(["status", "--offline", "--json"], env)
    ggml = _ggml(out)
    assert ggml["healthy"] is True and ggml["checked"] == "metadata" and ggml["files"] > 5

    _overwrite_4_bytes(lib, restore_mtime=False)
    rc, out, err = run_cli(["status", "--offline"], env)
    assert rc == 1, err  # damage found: a negative verdict (issue 42)
    assert "[healthy" not in out, out
    assert "[changed since install: run `accelstack repair`]" in out and "1 changed since install" in out, out
    rc, out, err = run_cli(["status", "--offline", "--json"], env)
    ggml = _ggml(out)
    assert ggml["healthy"] is False and ggml["checked"] == "metadata" and ggml["changed_files"] == 1
    assert any(p["action"] == "repair" and lib.name in p["message"] for p in ggml["problems"]), ggml["problems"]

    # repair finds it by hashing, restores it, and records the new file's stat: status trusts it again
    rc, out, err = run_cli(["repair", "--json"], env)
    assert rc == 0, err[-2000:]
    rep = result_of(out)
    assert rep["corrupt"] == [lib.relative_to(home.runtime_path(home.read_receipt(rid))).as_posix()]
    assert rep["fixed"] == rep["corrupt"]
    rc, out, err = run_cli(["status", "--offline", "--json"], env)
    ggml = _ggml(out)
    assert ggml["healthy"] is True and ggml["changed_files"] == 0, ggml["problems"]


def test_an_overwrite_that_restores_the_mtime_is_not_called_re_hashed_and_deep_finds_it(site, tmp_path):
    env, home, rid, lib = _install(site, tmp_path)
    _overwrite_4_bytes(lib, restore_mtime=True)
    rc, out, err = run_cli(["status", "--offline"], env)
    assert rc == 0, err
    assert "not re-hashed" in out and "[healthy, re-hashed]" not in out, out

    rc, out, err = run_cli(["status", "--offline", "--deep"], env)
    assert rc == 1, err
    assert "[damaged: run `accelstack repair`]" in out and "1 different when re-hashed" in out, out
    assert "failed" not in err, err  # the check ran to its end: what it found is not a failure of it
    rc, out, err = run_cli(["status", "--offline", "--deep", "--json"], env)
    ggml = _ggml(out)
    assert ggml["checked"] == "hashes" and ggml["healthy"] is False and ggml["corrupt_files"] == 1
    assert any(lib.name in p["message"] and p["action"] == "repair" for p in ggml["problems"]), ggml["problems"]
    hashing = [e for e in events_of(out) if e["event"] == "progress" and e["task"] == rid]
    assert hashing and hashing[0]["kind"] == "start" and hashing[0]["extra"]["unit"] == "B"
    assert hashing[0]["total"] > 1 << 20 and any(e["kind"] == "advance" for e in hashing)

    # a receipt from before file stats were recorded: present is all the cheap check can say
    path = home.receipt_path(rid)
    data = json.loads(path.read_text())
    for f in data["files"]:
        f.pop("mtime_ns", None)
        f.pop("inode", None)
    path.write_text(json.dumps(data))
    rc, out, err = run_cli(["status", "--offline"], env)
    assert "[files present, not re-hashed]" in out and "healthy" not in out, out
    assert _ggml(run_cli(["status", "--offline", "--json"], env)[1])["checked"] == "presence"
