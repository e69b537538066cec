"""Issue 25, consistency: an error's ``run`` is a command to paste or absent (words go in the
hint), a hash mismatch suggests another try and the publisher (never a hardware capture), times
in one form, sizes in one unit family, plurals right, an unreachable server in one readable line."""
from __future__ import annotations

import hashlib
import json
import shlex
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from accelstack.cli import build_parser
from accelstack.commands import common
from accelstack.errors import AccelstackError, Action
from accelstack.events import as_utc_z
from accelstack.serde import plural, size_text

from cli_helpers import check_schema, error_of, finish_pty, run_cli


@pytest.fixture
def env(tmp_path):
    return {"ACCELSTACK_HOME": str(tmp_path / "home"), "ACCELSTACK_CACHE": str(tmp_path / "cache"),
            "ACCELSTACK_CONFIG": str(tmp_path / "config"), "NO_PROXY": "127.0.0.1,localhost", "ACCELSTACK_OFFLINE": ""}


@pytest.fixture
def site():
    """An HTTP server on 127.0.0.1 serving 4096 bytes at /f.bin."""
    body = b"accelstack" * 409 + b"xxxxxx"

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/f.bin", body
    httpd.shutdown()
    httpd.server_close()


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# -- 1. `run` is a command or absent ------------------------------------------------------------------
@pytest.mark.parametrize("action", [a for a in Action])
def test_every_action_s_run_is_a_command_the_parser_accepts_or_absent(action):
    parser = build_parser()
    for argv in (None, ["install", "--json"], ["verify", "--home", "/h"]):
        run = common.run_command(action.value, argv, parser)
        if not run:
            continue
        words = shlex.split(run)
        assert words[0] == "accelstack", run
        parser.parse_args(words[1:])  # a ParseError (usage error) if it were not a command line
        err = AccelstackError("it failed", "a hint", action=action)
        line = json.loads(common.error_line("install", err, argv, parser))
        check_schema("line", line, run)
        assert line["run"] == run


def test_the_schema_refuses_words_in_run():
    line = json.loads(common.error_line("install", AccelstackError("x", action=Action.STATUS)))
    check_schema("line", line, "a command")
    with pytest.raises(AssertionError, match="does not match"):
        check_schema("line", {**line, "run": "retry later, or pass --wait SECONDS"}, "words")


@pytest.mark.parametrize("action", [Action.RETRY, Action.GO_ONLINE, Action.INSTALL_TOOLCHAIN, Action.FIX_CONFIG,
                                    Action.WAIT, Action.CHOOSE_HOME])
def test_words_to_follow_are_in_the_hint_and_run_is_absent(action):
    line = json.loads(common.error_line("status", AccelstackError("it failed", "the hint", action=action)))
    assert "run" not in line, line
    assert line["hint"].startswith("the hint; ") and common.ACTION_WORDS[action.value] in line["hint"]


def test_an_offline_miss_says_go_online_in_its_hint_without_a_run(env, site, tmp_path):
    url, body = site
    rc, out, err = run_cli(["fetch", url, "--sha256", hashlib.sha256(body).hexdigest(), "--size", str(len(body)),
                            "--offline", "--json"], env)
    e = error_of(out)
    assert rc == 1 and e["action"] == "go-online" and "run" not in e
    assert "run without --offline" in e["hint"]
    assert "1 file is not in the cache" in e["message"]  # not "1 file(s) are"


def test_a_hash_mismatch_suggests_another_try_not_a_hardware_capture(env, site):
    url, body = site
    wrong = hashlib.sha256(b"another file").hexdigest()
    args = ["fetch", url, "--sha256", wrong, "--size", str(len(body)), "--retries", "0"]
    rc, out, err = run_cli(args + ["--json"], env)
    e = error_of(out)
    assert rc == 1 and e["code"] == "hash-mismatch", e
    assert e["action"] == "retry" and "capture" not in json.dumps(e)
    assert "try again" in e["hint"] and "publisher" in e["hint"]
    rc, out, err = run_cli(args, env)
    assert rc == 1 and "capture" not in err and "try again" in err


def test_lock_wait_run_is_the_same_command_with_wait():
    err = AccelstackError("held by pid 1", "another accelstack is installing", action=Action.WAIT)
    parser = build_parser()
    line = json.loads(common.error_line("install", err, ["install", "--stack", "torch"], parser))
    assert line["run"] == "accelstack install --stack torch --wait 60"
    again = json.loads(common.error_line("install", err, ["install", "--wait", "5"], parser))
    assert "run" not in again and "retry later" in again["hint"]
    verify = json.loads(common.error_line("verify", err, ["verify"], parser))  # verify has no --wait
    assert "run" not in verify and "retry later" in verify["hint"]


# -- 1. one form of time ------------------------------------------------------------------------------
def test_times_are_iso_utc_with_z():
    assert as_utc_z("2027-06-01T02:00:00+02:00") == "2027-06-01T00:00:00Z"
    assert as_utc_z("2027-06-01T00:00:00.500+00:00") == "2027-06-01T00:00:00.5Z"
    assert as_utc_z("2027-06-01T00:00:00Z") == "2027-06-01T00:00:00Z"
    progress = {"event": "progress", "ts": "2027-06-01T00:00:00+00:00", "kind": "start", "stage": "fetch",
                "stage_index": 0, "task": "", "done": 0, "total": None, "ok": None, "message": "", "extra": {}}
    with pytest.raises(AssertionError, match="does not match"):
        check_schema("line", progress, "a +00:00 time")
    check_schema("line", {**progress, "ts": "2027-06-01T00:00:00.123Z"}, "a Z time")


# -- 2. words and units -------------------------------------------------------------------------------
def test_one_helper_for_sizes_and_plurals():
    assert [size_text(n) for n in (0, 1023, 1536, 10 << 20, 150 << 20, int(4.1 * (1 << 30)))] == \
        ["0 B", "1023 B", "1.5 KiB", "10.0 MiB", "150 MiB", "4.1 GiB"]
    assert (plural(1, "file"), plural(2, "file"), plural(0, "runtime")) == ("1 file", "2 files", "0 runtimes")


def test_an_unreachable_server_is_one_readable_line(env):
    url = f"http://127.0.0.1:{closed_port()}/f.bin"
    args = ["fetch", url, "--sha256", "a" * 64, "--size", "10", "--retries", "0"]
    rc, out, err = run_cli(args + ["--json"], env)
    e = error_of(out)
    assert e["message"] == f"cannot reach {url}: connection refused", e["message"]
    rc, out, err = run_cli(args, env)
    assert rc == 1 and f"accelstack: error: cannot reach {url}: connection refused\n" in err
    for noise in ("HTTPConnection", "Max retries", "NewConnectionError", "Errno", "(s)"):
        assert noise not in err, err
    assert "1 file failed" in err


# -- 3. the progress line in a real terminal ----------------------------------------------------------
def render(raw: str, cols: int = 80):
    """What a terminal of ``cols`` columns shows for ``raw`` (the escapes tqdm writes: CR, LF,
    cursor up, erase line), and the rows that a line too long wrapped onto."""
    import re

    rows: list = [[]]
    r = c = 0
    wrapped = set()
    i = 0
    while i < len(raw):
        ch = raw[i]
        if ch == "\x1b":
            m = re.match(r"\x1b\[(\d*)([A-Za-z])", raw[i:])
            if m:
                n, cmd = int(m.group(1) or 1), m.group(2)
                if cmd == "A":
                    r = max(0, r - n)
                elif cmd == "B":
                    r += n
                elif cmd == "K":
                    row = rows[r]
                    if m.group(1) == "2":
                        row[:] = []
                    else:
                        del row[c:]
                i += len(m.group(0))
                continue
        if ch == "\r":
            c = 0
        elif ch == "\n":
            r += 1
        else:
            if c >= cols:
                r, c = r + 1, 0
                wrapped.add(r)
            while len(rows) <= r:
                rows.append([])
            row = rows[r]
            row.extend(" " * (c + 1 - len(row)))
            row[c] = ch
            c += 1
        while len(rows) <= r:
            rows.append([])
        i += 1
    return ["".join(x).rstrip() for x in rows], wrapped


def test_the_progress_line_fits_80_columns_and_is_cleared_before_the_error(tmp_path, env):
    import os
    import pty
    import struct
    import sys
    import time

    from cli_helpers import REPO

    if not hasattr(pty, "fork"):
        pytest.skip("needs a pty")
    import fcntl
    import termios

    release = threading.Event()
    size = 8 << 20

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            self.wfile.write(b"x" * (size // 4))
            self.wfile.flush()
            release.wait(60)  # until the test saw the bars: then the connection drops

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    name = "stable_diffusion_cpp_python-0.4.7-cp311-cp311-manylinux_2_17_x86_64.whl"
    url = f"http://127.0.0.1:{httpd.server_address[1]}/{name}"
    full = {**os.environ, **env, "PYTHONPATH": str(REPO), "COLUMNS": "80", "TERM": "xterm"}
    pid, fd = pty.fork()
    if pid == 0:  # the child: a terminal of 80 columns on stdin, stdout and stderr
        fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        os.execve(sys.executable, [sys.executable, "-m", "accelstack", "fetch", url, "--sha256", "b" * 64, "--size",
                                   str(size), "--retries", "0", "--read-timeout", "60", "--name", name], full)
    seen = b""
    deadline = time.time() + 60
    try:
        while b"fetch total" not in seen or name[-20:].encode() not in seen.split(b"fetch total")[-1]:
            assert time.time() < deadline, seen
            seen += os.read(fd, 4096)
    finally:
        release.set()
    status, more = finish_pty(pid, fd)
    seen += more
    httpd.shutdown()
    httpd.server_close()
    text = seen.decode("utf-8", "replace")
    screen, wrapped = render(text)
    assert os.WEXITSTATUS(status) == 1, text
    error = max(n for n, line in enumerate(screen) if line.startswith("accelstack: error: "))
    shown = "\n".join(screen)
    assert "connection closed after 2.0 MiB of 8.0 MiB" in "".join(screen[error:]), shown  # the error in full, last
    before = [n for n in range(error) if screen[n].strip()]
    assert before and not wrapped & set(before) and all(len(screen[n]) <= 79 for n in before), shown
    assert not any("%|" in screen[n] or "fetch total" in screen[n] for n in before), shown  # no bar left above it
