"""Issue 25: `repair` keeps the runtime the user chose and says which is active and why; its
words and uninstall's question say what happened and what will happen.

Found with real installs: v1, then v2, then `rollback` to v1; a damaged active.json was rebuilt by
`repair` as v2 (the newest receipt), silently. The pointer is now rebuilt from the copy written at
every switch, and the receipts decide only when no readable copy is left.
"""
from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import Dict

from accelstack.installer.home import Home

from cli_helpers import REPO, finish_pty, result_of, run_cli


def _corrupt(path: Path) -> None:
    with open(path, "r+b") as fh:
        fh.seek(4096)
        fh.write(b"\0garbage\0")


def _rolled_back_home(site, tmp_path: Path):
    env = {"ACCELSTACK_HOME": str(tmp_path / "home"), "ACCELSTACK_CACHE": str(tmp_path / "cache"), "ACCELSTACK_OFFLINE": ""}
    source = ["--no-build", "--trusted-key", site["public_key"]]
    rc, out, err = run_cli(["install", "--json", "--manifest", site["v1"], *source], env)
    assert rc == 0, err[-2000:]
    rid1 = result_of(out)["runtime"]
    rc, out, err = run_cli(["upgrade", "--json", "--manifest", site["v2"], *source], env)
    assert rc == 0, err[-2000:]
    rid2 = result_of(out)["runtime"]
    rc, out, err = run_cli(["rollback", "--json"], env)
    assert rc == 0 and result_of(out)["active"]["ggml"] == rid1, err
    return env, Home(tmp_path / "home"), rid1, rid2


def test_repair_rebuilds_a_damaged_pointer_as_the_user_left_it_and_says_so(site, tmp_path):
    env, home, rid1, rid2 = _rolled_back_home(site, tmp_path)
    receipt = home.read_receipt(rid1)
    lib = next(f.path for f in receipt.files if f.path.endswith(".so") or ".so." in f.path)

    home.active_path.write_text('{"active": {"ggml": ')  # damaged
    _corrupt(home.runtime_path(receipt) / lib)
    rc, out, err = run_cli(["repair"], env)  # a pipe: the progress is timestamped lines on stderr
    assert rc == 0, err[-2000:]
    assert f"active runtime: {rid1} (active.json was damaged and has been rebuilt: the last good copy" in out, out
    assert "failed" not in out + err, err  # the check that found the damage went on to restore it
    assert "found 1 damaged of" in err and "restored 1" in out, (out, err)
    state = home.read_active()
    assert state.active["ggml"] == rid1 and state.previous["ggml"] == rid2

    home.active_path.write_bytes(b"\xff\xfe")
    rc, out, err = run_cli(["repair", "--json"], env)
    assert rc == 0, err[-2000:]
    rep = result_of(out)
    assert rep["pointer_rebuilt"] is True and rep["active"] == rid1 and "last good copy" in rep["active_reason"]

    rc, out, err = run_cli(["repair", "--json"], env)  # nothing damaged: it says it changed nothing
    rep = result_of(out)
    assert rep["pointer_rebuilt"] is False and rep["active"] == rid1 and "did not change" in rep["active_reason"]

    # with no readable copy either, the receipts decide, and the reason says that is what happened
    home.active_path.write_text("garbage{")
    home.last_good_active_path.write_text("garbage{")
    rep = result_of(run_cli(["repair", "--json"], env)[1])
    assert rep["active"] == rid2 and "no readable copy" in rep["active_reason"] and "most recently installed" in rep["active_reason"]


def _pty_uninstall(env: Dict[str, str], answer: bytes) -> bytes:
    import pty

    full = {**os.environ, **env, "PYTHONPATH": str(REPO)}
    pid, fd = pty.fork()
    if pid == 0:  # the child: stdin and stdout are the terminal
        os.execve(sys.executable, [sys.executable, "-m", "accelstack", "uninstall"], full)
    seen = b""
    deadline = time.time() + 60
    while b"[y/N]" not in seen and time.time() < deadline:
        seen += os.read(fd, 4096)
    os.write(fd, answer)
    seen += finish_pty(pid, fd)[1]
    return seen


def test_uninstall_asks_about_exactly_what_it_removes_in_human_units(site, tmp_path):
    env, home, rid1, rid2 = _rolled_back_home(site, tmp_path)
    seen = _pty_uninstall(env, b"n\n").decode(errors="replace")
    question = next(line for line in seen.splitlines() if "[y/N]" in line)
    assert rid1 in question and rid2 in question and "keeping the caches" in question, question
    assert re.search(r"\(\d+\.\d (KiB|MiB|GiB)\)", question), question
    assert re.search(rf"{rid1}  \d+\.\d MiB  {re.escape(str(home.runtimes('ggml')))}", seen), seen
    assert "downloads cache" in seen and "not touched either: models" in seen, seen
    assert " MB" not in seen and " GB" not in seen and " kB" not in seen, seen  # one unit family
    assert home.read_active().active["ggml"] == rid1  # "n": nothing removed

    rc, out, err = run_cli(["gc"], env)
    assert rc == 0 and re.search(r"freed \d+ B\b|freed \d+\.\d (KiB|MiB|GiB)", out), out
