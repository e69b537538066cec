"""Fixtures for installer tests: a published ggml build on a real HTTP server on 127.0.0.1."""
from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path
from typing import Dict

import pytest

from accelstack.manifests.signing import generate_keypair

from installer_helpers import Server, publish  # noqa: F401 - the fixtures' server, importable by test modules


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
