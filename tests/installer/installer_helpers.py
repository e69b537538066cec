"""Run the real CLI in a child process against a private home and cache."""
from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path
from typing import Dict, List, Optional

from accelstack.publisher.build_cache import BuildResult
from accelstack.publisher.publish import build_manifest, write_signed_manifest
from accelstack.serde import to_dict

import cli_helpers


def cli_env(home: Path, cache: Path, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = {**os.environ, "ACCELSTACK_HOME": str(home), "ACCELSTACK_CACHE": str(cache)}
    env.pop("ACCELSTACK_OFFLINE", None)
    env.update(extra or {})
    return env


def run_cli(args: List[str], env: Dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "accelstack", *args], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=timeout)


def result_of(proc: subprocess.CompletedProcess) -> dict:
    """The ``result`` of the final line of a --json command (the whole JSON Lines contract checked)."""
    try:
        return cli_helpers.result_of(proc.stdout)
    except AssertionError as exc:
        raise AssertionError(f"{exc} (exit {proc.returncode}): {proc.stdout[-2000:]} {proc.stderr[-2000:]}") from None


def error_of(proc: subprocess.CompletedProcess) -> dict:
    """The final error line of a --json command."""
    try:
        return cli_helpers.error_of(proc.stdout)
    except AssertionError as exc:
        raise AssertionError(f"{exc} (exit {proc.returncode}): {proc.stdout[-2000:]} {proc.stderr[-2000:]}") from None


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves a directory; ``server.delay`` seconds between 64 KiB chunks lets a test catch a download mid-way."""

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    def copyfile(self, source, outputfile) -> None:
        delay = getattr(self.server, "delay", 0.0)
        while True:
            chunk = source.read(64 * 1024)
            if not chunk:
                return
            outputfile.write(chunk)
            if delay:
                time.sleep(delay)


class Server:
    def __init__(self, root: Path) -> None:
        self.root = root
        handler = functools.partial(_Handler, directory=str(root))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.delay = 0.0  # type: ignore[attr-defined]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def set_delay(self, seconds: float) -> None:
        self.httpd.delay = seconds  # type: ignore[attr-defined]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def write_wheel(path: Path, files: Dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> Path:
    """A wheel at ``path`` holding ``files`` (its dist-info METADATA and WHEEL among them) and a
    RECORD with every file's sha256 and size, as the installers check it. Stored uncompressed by
    default, so a payload of random bytes makes the file that big."""
    info = next(name.split("/")[0] for name in files if name.endswith(".dist-info/METADATA"))
    rows = [f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
            for name, data in files.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(f"{info}/RECORD", "\n".join(rows + [f"{info}/RECORD,,"]) + "\n")
    return path


def publish(build: BuildResult, wheel: Path, site: Path, sub: str, version: int, private_pem: bytes, base_url: str) -> Path:
    """Lay out ``site/sub/`` with the wheel, its build record, and a signed manifest."""
    d = site / sub
    d.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(wheel, d / wheel.name)
    data = wheel.read_bytes()
    rec = BuildResult(**{**to_dict(build), "wheel": str(d / wheel.name), "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)})
    (d / f"{wheel.name}.build.json").write_text(json.dumps(to_dict(rec)))
    doc = build_manifest(d, f"{base_url}/{sub}", source="test-channel", version=version)
    return write_signed_manifest(d, doc, private_pem)


def fake_torch(site: Path, version: str) -> None:
    """A distribution named torch, as pip leaves one: its package and its dist-info with a RECORD."""
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(f"__version__ = {version!r}\n")
    info = site / f"torch-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
    (info / "RECORD").write_text(f"torch/__init__.py,,\ntorch-{version}.dist-info/METADATA,,\ntorch-{version}.dist-info/RECORD,,\n")
