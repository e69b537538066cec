"""Fixtures for installer tests: a published ggml build on a real HTTP server on 127.0.0.1."""
from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import json
import shutil
import threading
import time
import zipfile
from pathlib import Path
from typing import Dict

import pytest

from accelstack.manifests.signing import generate_keypair
from accelstack.publisher.build import BuildResult
from accelstack.publisher.publish import build_manifest, write_signed_manifest
from accelstack.serde import to_dict


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


def repack_wheel(src: Path, dest: Path, marker: str) -> None:
    """A second, different build of the same wheel (an extra file, RECORD updated) — an 'upgrade'."""
    extra_name = "stable_diffusion_cpp/_release.txt"
    extra = f"{marker}\n".encode()
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.endswith(".dist-info/RECORD"):
                digest = base64.urlsafe_b64encode(hashlib.sha256(extra).digest()).rstrip(b"=").decode()
                data = data.rstrip(b"\n") + f"\n{extra_name},sha256={digest},{len(extra)}\n".encode()
            zout.writestr(item, data)
        zout.writestr(extra_name, extra)


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


@pytest.fixture(scope="session")
def signing_key():
    private_pem, public_b64 = generate_keypair()
    return private_pem, public_b64


@pytest.fixture
def site(tmp_path, ggml_cpu_build, signing_key):
    """v1 and v2 manifests of the CPU build on a loopback server."""
    root = tmp_path / "site"
    root.mkdir()
    server = Server(root)
    private_pem, public_b64 = signing_key
    wheel = Path(ggml_cpu_build.wheel)
    v2_wheel = tmp_path / "v2" / wheel.name
    v2_wheel.parent.mkdir()
    repack_wheel(wheel, v2_wheel, "v2")
    publish(ggml_cpu_build, wheel, root, "v1", 1, private_pem, server.url)
    publish(ggml_cpu_build, v2_wheel, root, "v2", 2, private_pem, server.url)
    info: Dict[str, object] = {
        "server": server,
        "v1": f"{server.url}/v1/ggml-manifest.json",
        "v2": f"{server.url}/v2/ggml-manifest.json",
        "public_key": public_b64,
        "root": root,
    }
    yield info
    server.close()
