"""A closed pipe (`accelstack plan | head -1`) ends the command quietly: no traceback, no
"Exception ignored" at exit, and the shell's usual status for it, 141 (128 + SIGPIPE) (issue 25)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cli_helpers import REPO

CAPTURE = REPO / "tests" / "fixtures" / "captures" / "linux-nvidia-rtx4070-550"


@pytest.mark.parametrize("args", [
    ["plan", "--stack", "torch", "--python", "3.11", "--replay", str(CAPTURE)],
    ["detect", "--replay", str(CAPTURE)],
    ["detect", "--replay", str(CAPTURE), "--json"],
])
def test_a_reader_that_stops_early_gets_no_traceback(args):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write (what `| head -1` becomes): no timing involved
    try:
        proc = subprocess.run([sys.executable, "-m", "accelstack", *args], stdout=write_end, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, env=env, timeout=120)
    finally:
        os.close(write_end)
    err = proc.stderr.decode()
    assert "Traceback" not in err and "Exception ignored" not in err and "BrokenPipeError" not in err, err
    assert proc.returncode == 141, (proc.returncode, err)
