"""Issue 25: SIGTERM is handled like Ctrl-C, and `--wait` says who holds the lock while it waits.

Real processes throughout: the CLI in a child process, a loopback HTTP server that holds the
download of the runtime's wheel open (so SIGTERM lands mid-install at a point the test knows),
and a second process that really holds the home's lock.
"""
from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import platform
import subprocess
import sys
import threading
from pathlib import Path
from typing import Dict, List

import pytest

from accelstack.manifests.signing import generate_keypair
from accelstack.publisher.build_cache import BuildResult

from cli_helpers import REPO, error_of, finish_pty, json_lines, result_of

sys.path.insert(0, str(Path(__file__).with_name("installer")))
from installer_helpers import publish, write_wheel  # noqa: E402

VERSION = "0.4.7"
pytestmark = pytest.mark.skipif(os.name == "nt", reason="POSIX signals")


def _wheel(directory: Path) -> Path:
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    info = f"stable_diffusion_cpp_python-{VERSION}.dist-info"
    return write_wheel(directory / f"stable_diffusion_cpp_python-{VERSION}-{tag}-{tag}-linux_{platform.machine()}.whl", {
        "stable_diffusion_cpp/__init__.py": b"MARK = 'sigterm'\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: stable-diffusion-cpp-python\nVersion: {VERSION}\n".encode(),
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\n"
                         f"Tag: {tag}-{tag}-linux_{platform.machine()}\n".encode(),
        "stable_diffusion_cpp/padding.bin": os.urandom(1 << 20),
    })


class _HoldingHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the site; a wheel's download sends its first bytes, says so, then waits to be released."""

    def log_message(self, *args) -> None:
        pass

    def copyfile(self, source, outputfile) -> None:
        if not self.path.endswith(".whl"):
            return super().copyfile(source, outputfile)
        outputfile.write(source.read(64 * 1024))
        outputfile.flush()
        self.server.seen.set()  # type: ignore[attr-defined]
        self.server.release.wait(120)  # type: ignore[attr-defined]


@pytest.fixture
def holding_site(tmp_path):
    root = tmp_path / "site"
    root.mkdir()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_HoldingHandler, directory=str(root)))
    httpd.seen, httpd.release = threading.Event(), threading.Event()  # type: ignore[attr-defined]
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    private_pem, public_b64 = generate_keypair()
    wheel = _wheel(tmp_path / "wheels")
    data = wheel.read_bytes()
    build = BuildResult(variant="cpu", wheel=str(wheel), sha256=hashlib.sha256(data).hexdigest(), size=len(data),
                        cmake_args=[], source_sha256="0" * 64, key="test-sigterm", platform_tag=f"linux_{platform.machine()}")
    publish(build, wheel, root, "v1", 1, private_pem, url)
    yield {"httpd": httpd, "manifest": f"{url}/v1/ggml-manifest.json", "public_key": public_b64}
    httpd.release.set()  # type: ignore[attr-defined]
    httpd.shutdown()
    httpd.server_close()


def _env(tmp_path: Path) -> Dict[str, str]:
    state = tmp_path / "state"
    env = {**os.environ, "ACCELSTACK_HOME": str(state / "home"), "ACCELSTACK_CACHE": str(state / "cache"),
           "ACCELSTACK_BUILD_CACHE": str(state / "builds"), "ACCELSTACK_PROBE_CACHE": str(state / "probe"),
           "ACCELSTACK_CONFIG": str(state / "config" / "config.yaml"), "ACCELSTACK_CONFIG_DIR": str(state / "config"),
           "ACCELSTACK_OFFLINE": "", "ACCELSTACK_BACKEND": "", "PYTHONPATH": str(REPO),
           "ACCELSTACK_MIN_RATE": "0"}  # the held download is stopped by the signal, never by a clock
    env.pop("ACCELSTACK_DEBUG", None)
    return env


def test_sigterm_mid_install_cleans_up_and_ends_with_one_error_line(tmp_path, holding_site):
    env = _env(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "accelstack", "install", "--json", "--no-build",
                             "--manifest", holding_site["manifest"], "--trusted-key", holding_site["public_key"]],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        assert holding_site["httpd"].seen.wait(120), "the install never asked for the wheel"
        home = Path(env["ACCELSTACK_HOME"])
        assert (home / "install.owner").is_file()  # the lock is held while the download runs
        proc.terminate()  # what an app's installer sends
        out, err = proc.communicate(timeout=120)
    finally:
        holding_site["httpd"].release.set()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, (proc.returncode, out[-2000:], err[-2000:])
    e = error_of(out)  # the whole JSON Lines contract: one final line, last, schema-valid
    assert e["error"] == "Interrupted" and e["code"] == "interrupted"
    assert e["message"].startswith("terminated: nothing changed, no runtime is active"), e["message"]
    assert e["action"] == "retry"
    assert "Traceback" not in err
    assert not (home / "install.owner").exists()
    staging = home / "staging"
    assert not staging.exists() or list(staging.iterdir()) == []


def test_sigterm_while_waiting_for_the_lock_is_said_with_143(tmp_path):
    """Any command, not only install: `gc` waiting for the lock is terminated: one error line, 143,
    and the other process's lock is left as it was."""
    env = _env(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, env["ACCELSTACK_HOME"]], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    proc = None
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        proc = subprocess.Popen([sys.executable, "-m", "accelstack", "gc", "--json", "--wait", "120"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        assert proc.stdout is not None
        lines: List[dict] = []
        _read_until(proc.stdout, lambda d: d.get("stage") == "lock" and d.get("kind") == "start", lines)
        proc.terminate()
        rest, err = proc.communicate(timeout=60)
        assert proc.returncode == 143 and "Traceback" not in err, (proc.returncode, err[-2000:])
        out = "".join(json.dumps(d) + "\n" for d in lines) + rest
        e = error_of(out)
        assert e["code"] == "interrupted" and e["message"].startswith("terminated"), e
        owner = json.loads((Path(env["ACCELSTACK_HOME"]) / "install.owner").read_text())
        assert owner["pid"] == holder.pid  # the holder's lock, untouched
    finally:
        holder.kill()
        holder.communicate()
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.communicate()


# -- --wait says who holds the lock ------------------------------------------------------------------
HOLDER = """
import sys
from pathlib import Path
from accelstack.installer.home import Home
home = Home(Path(sys.argv[1]))
home.ensure()
with home.lock("install"):
    print("held", flush=True)
    sys.stdin.readline()
"""


def _read_until(stream, wanted, lines: List[dict], limit: int = 200) -> dict:
    for _ in range(limit):
        line = stream.readline()
        assert line, f"the command ended before {wanted}: {lines}"
        doc = json.loads(line)
        lines.append(doc)
        if wanted(doc):
            return doc
    raise AssertionError(f"no line for {wanted}: {lines}")


@pytest.mark.parametrize("command", [["gc"], ["rollback"]])
def test_wait_for_the_lock_says_who_holds_it_and_ticks(tmp_path, command):
    env = _env(tmp_path)
    home = env["ACCELSTACK_HOME"]
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, home], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    proc = None
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        proc = subprocess.Popen([sys.executable, "-m", "accelstack", *command, "--json", "--wait", "120"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        assert proc.stdout is not None
        lines: List[dict] = []
        start = _read_until(proc.stdout, lambda d: d.get("stage") == "lock" and d.get("kind") == "start", lines)
        assert f"process {holder.pid}" in start["message"] and "(install, since " in start["message"], start
        assert start["extra"]["holder"]["pid"] == holder.pid and start["extra"]["holder"]["command"] == "install"
        tick = _read_until(proc.stdout, lambda d: d.get("stage") == "lock" and d.get("kind") == "advance", lines)
        assert tick["done"] >= 1 and tick["extra"]["unit"] == "s" and f"process {holder.pid}" in tick["message"]
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        rest, err = proc.communicate(timeout=120)
        out = "".join(json.dumps(d) + "\n" for d in lines) + rest
        docs = json_lines(out)
        ends = [d for d in docs if d.get("stage") == "lock" and d.get("kind") == "end"]
        assert ends and ends[0]["ok"] is True, docs
        last = docs[-1]
        # the command ran once the lock was free (rollback with nothing to go back to is its own error)
        assert last["event"] == "result" or last["code"] != "lock-held", last
        if command == ["gc"]:
            assert proc.returncode == 0 and result_of(out) is not None
    finally:
        holder.kill()
        holder.communicate()
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_wait_is_shown_on_a_terminal(tmp_path):
    """The progress line of a terminal shows the wait: who holds the lock, and the time going by."""
    import fcntl
    import pty
    import struct
    import termios

    env = _env(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, env["ACCELSTACK_HOME"]], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        pid, fd = pty.fork()
        if pid == 0:  # a terminal of 24 rows and 200 columns (a pty starts with none)
            fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 200, 0, 0))
            os.execve(sys.executable, [sys.executable, "-m", "accelstack", "gc", "--wait", "120"], env)
        seen = b""
        while b"waiting up to 120 s for" not in seen or f"process {holder.pid} (install, since ".encode() not in seen:
            chunk = os.read(fd, 4096)
            assert chunk, seen
            seen += chunk
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        status, more = finish_pty(pid, fd)
        seen += more
        assert os.WEXITSTATUS(status) == 0, seen
        assert b"Traceback" not in seen
    finally:
        holder.kill()
        holder.communicate()
