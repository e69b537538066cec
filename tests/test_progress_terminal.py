"""The progress line in a real terminal (a pty of 80 columns) is the current step: once a step
ends, its bar is gone while the next step's bar runs."""
from __future__ import annotations

import fcntl
import os
import pty
import struct
import sys
import termios
import time

from test_words import render

from cli_helpers import REPO, finish_pty

CHILD = r"""
import sys
from accelstack.commands.progress import progress_renderer
from accelstack.events import ProgressEvent as E
with progress_renderer(json_mode=False) as p:
    p(E("start", "fetch", task="first-step.whl", total=1 << 20, extra={"unit": "B"}))
    p(E("advance", "fetch", task="first-step.whl", done=1 << 19, total=1 << 20, extra={"unit": "B"}))
    p(E("end", "fetch", task="first-step.whl", ok=True))
    p(E("start", "verify", task="second-step", total=4, extra={"unit": "check"}))
    p(E("advance", "verify", task="second-step", done=1, total=4, extra={"unit": "check"}))
    sys.stdin.readline()  # the test looks at the screen now
    p(E("end", "verify", task="second-step", ok=True, done=4, total=4))
"""


def test_the_bar_shown_is_the_current_step_and_fits_80_columns():
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "80", "TERM": "xterm"}
    pid, fd = pty.fork()
    if pid == 0:
        fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        os.execve(sys.executable, [sys.executable, "-c", CHILD], env)
    seen = b""
    deadline = time.time() + 60
    while b"second-step" not in seen or b"1/4" not in seen.split(b"second-step")[-1]:
        assert time.time() < deadline, seen
        seen += os.read(fd, 4096)
    screen, wrapped = render(seen.decode("utf-8", "replace"))
    os.write(fd, b"\n")
    finish_pty(pid, fd)
    shown = [line for line in screen if line.strip()]
    assert not wrapped and all(len(line) <= 80 for line in shown), screen
    assert not any("first-step" in line and "%|" in line for line in shown), shown  # no stale bar of the ended step
    assert any("second-step" in line for line in shown), shown
