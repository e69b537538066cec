"""The local channel rehearsal: what a release does, then what a user's first run does, with no compiler.

Publisher side through the real CLI: the cached CPU build exported (`build ggml`, a cache hit, no
compile), a signing key (`manifest keygen`), the signed manifest (`manifest build`), all in a
directory served over HTTP on 127.0.0.1. User side: `channel add` with the publisher's key, then a
fresh `install` with cmake and the C++ compiler hidden from PATH: it must download, verify and
activate the published build, and `status` and `upgrade` must keep working without any argument.
"""
from __future__ import annotations

import functools
import http.server
import os
import shutil
import sys
import threading
from pathlib import Path

from accelstack.installer.home import Home

from installer_helpers import cli_env, result_of, run_cli


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def _serve(root: Path) -> http.server.ThreadingHTTPServer:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def test_a_published_channel_installs_with_no_compiler_on_path(ggml_cpu_build, tmp_path):
    site, keys = tmp_path / "site", tmp_path / "keys"
    site.mkdir()
    httpd = _serve(site)
    try:
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        # the session's build cache (tests/conftest.py), where the CPU build is: `build ggml` is a lookup there
        publisher = cli_env(tmp_path / "pub-home", tmp_path / "pub-cache")
        proc = run_cli(["build", "ggml", "--backend", "cpu", "--out", str(site / "cpu"), "--json"], publisher)
        assert proc.returncode == 0, proc.stderr
        assert result_of(proc)["cache_hit"] is True  # the rehearsal never compiles
        assert run_cli(["manifest", "keygen", "--out", str(keys / "release")], publisher).returncode == 0
        proc = run_cli(["manifest", "build", str(site), "--base-url", base, "--key", str(keys / "release.key"),
                        "--source", "rehearsal", "--version", "1"], publisher)
        assert proc.returncode == 0, proc.stderr

        # the user's machine: no toolchain on PATH, only the interpreter that runs accelstack
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        os.symlink(sys.executable, bin_dir / "python3")
        home = tmp_path / "home"
        user = cli_env(home, tmp_path / "cache", {"ACCELSTACK_CONFIG_DIR": str(tmp_path / "config"),
                                                  "ACCELSTACK_BUILD_CACHE": str(tmp_path / "no-builds"),
                                                  "PATH": str(bin_dir)})
        assert shutil.which("cmake", path=user["PATH"]) is None and shutil.which("c++", path=user["PATH"]) is None
        proc = run_cli(["channel", "add", "rehearsal", f"{base}/ggml-manifest.json", "--key", str(keys / "release.pub")], user)
        assert proc.returncode == 0, proc.stderr

        proc = run_cli(["install", "--json"], user)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
        out = result_of(proc)
        assert out["changed"] is True and out["built_locally"] is False
        receipt = Home(home).read_receipt(out["runtime"])
        assert receipt.manifest_source == "rehearsal" and receipt.manifest_version == 1
        assert receipt.verification.ok and receipt.verification.check == "verify"
        assert [a.sha256 for a in receipt.plan.artifacts] == [ggml_cpu_build.sha256]
        assert not (tmp_path / "no-builds").exists()  # nothing was built, not even looked up

        status = result_of(run_cli(["status", "--json"], user))["stacks"]
        ggml = next(s for s in status if s["stack"] == "ggml")
        assert ggml["active"] == out["runtime"] and ggml["healthy"] is True and ggml["problems"] == []
        proc = run_cli(["upgrade", "--json"], user)
        assert proc.returncode == 0, proc.stderr
        assert result_of(proc)["changed"] is False
    finally:
        httpd.shutdown()
        httpd.server_close()
