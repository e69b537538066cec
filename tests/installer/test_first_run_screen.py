"""The first-run screen says each thing once, and the current step (issue 42, item 10): the install's
spinner said "installing <wheel>" for the whole minute of the check, cut at the terminal's width; `plan`
printed "cpu rejected: no ggml manifest was given" right under "a local CPU build is needed", and the
feature list three times. The real CLI: `install` in an 80-column pty, `plan` as the first run prints it."""
from __future__ import annotations

import fcntl
import os
import pty
import struct
import sys
import termios
import time

from test_words import render

from cli_helpers import REPO, finish_pty, run_cli


def test_the_install_spinner_names_the_check_while_it_runs_and_fits_the_terminal(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "80", "TERM": "xterm", "ACCELSTACK_HOME": str(tmp_path / "home"),
           "ACCELSTACK_CACHE": str(tmp_path / "cache"), "ACCELSTACK_OFFLINE": "", "ACCELSTACK_BACKEND": ""}
    pid, fd = pty.fork()
    if pid == 0:
        fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        os.execve(sys.executable, [sys.executable, "-m", "accelstack", "install"], env)
    seen, deadline = b"", time.time() + 600
    while b"probe generation" not in seen:  # the check's generation runs: the install's step is the check
        assert time.time() < deadline, seen[-3000:]
        try:
            seen += os.read(fd, 65536)
        except OSError:
            break
    during = seen
    status, rest = finish_pty(pid, fd)
    assert os.waitstatus_to_exitcode(status) == 0, (during + rest)[-3000:]
    screen, wrapped = render(during.decode("utf-8", "replace"))
    rows = [r for r in screen if "linux-" in r and " s — " in r]  # the install task's spinner rows
    assert rows, screen[-20:]
    assert "checking that the runtime works" in rows[-1] and "installing" not in rows[-1], rows[-3:]
    assert not wrapped and all(len(r) <= 80 for r in screen if r.strip()), [r for r in screen if len(r) > 80][:3]


def test_plan_on_a_machine_that_builds_here_says_each_thing_once(tmp_path):
    env = {"ACCELSTACK_HOME": str(tmp_path / "home"), "ACCELSTACK_CACHE": str(tmp_path / "cache"), "ACCELSTACK_BACKEND": ""}
    rc, out, err = run_cli(["plan"], env)
    if "[needs-build]" not in out:
        import pytest
        pytest.skip("a published build fits this machine: no local build to describe")
    assert rc == 0, err
    assert "no ggml manifest was given" not in out, out  # the decision and the channel note say it
    assert out.count("cpu_features") == 1 and out.count("no channel is configured") == 1, out
