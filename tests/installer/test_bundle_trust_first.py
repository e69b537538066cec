"""Issue 29, bundles write nothing before they are trusted: the documents are read and the signed
manifest checked first; only the artifacts it lists, each at the size it gives, are written (a
sparse member or a gzip-compressed tar no longer expands into the cache); `install --bundle DIR`
is a usage error, not a traceback. Real bundle files, real CLI processes under a file-size limit."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import resource
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from accelstack.core.bundle_file import INDEX, MANIFEST, SIGNATURE, BundleError, read_bundle
from accelstack.manifests.signatures import sign_manifest
from accelstack.manifests.signing import generate_keypair
from tests.fuzz.bundle_tars import tar_bytes

from installer_helpers import cli_env, error_of

EXAMPLE = Path(__file__).resolve().parents[2] / "accelstack" / "manifests" / "data" / "ggml-example.json"
LIMIT = 32 << 20  # the most any file the CLI writes may grow to here: far below what the bundles expand to


def _manifest(artifact_sha: str, size: int) -> bytes:
    doc = json.loads(EXAMPLE.read_text())
    target = next(t for t in doc["targets"] if t["id"] == "linux-x64-cpu-noavx")
    target["artifacts"][0].update(sha256=artifact_sha, size=size)
    doc.update(source="stable", version=1, targets=[target])
    return json.dumps(doc, indent=2).encode()


def _documents(artifact_sha: str, size: int, pem: bytes) -> list:
    manifest = _manifest(artifact_sha, size)
    index = {"format": "accelstack-bundle", "version": 1, "stack": "ggml",
             "channel": {"name": "stable", "url": "https://example.org/ggml-manifest.json"},
             "artifacts": [{"name": "sd.tar.gz", "sha256": artifact_sha, "size": size}]}
    return [(INDEX, json.dumps(index).encode(), None), (MANIFEST, manifest, None),
            (SIGNATURE, sign_manifest(manifest, pem), None)]


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing


def _install(bundle: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    env = cli_env(tmp_path / "home", tmp_path / "cache", {"ACCELSTACK_CONFIG_DIR": str(tmp_path / "config")})
    return subprocess.run([sys.executable, "-m", "accelstack", "install", "--bundle", str(bundle), "--offline", "--json",
                           *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300,
                          preexec_fn=_limited)


def _written(tmp_path: Path) -> int:
    cache = tmp_path / "cache"
    return sum(p.stat().st_blocks * 512 for p in cache.rglob("*") if p.is_file()) if cache.exists() else 0


def test_a_sparse_member_of_an_untrusted_bundle_is_never_written(tmp_path):
    pem, _ = generate_keypair()  # a key nobody trusts
    full = 1 << 30
    sha = hashlib.sha256(b"whatever").hexdigest()
    bundle = tmp_path / "sparse.tar"
    bundle.write_bytes(tar_bytes([*_documents(sha, full, pem), (f"artifacts/{sha}", b"\0" * 512, full)]))
    assert bundle.stat().st_size < 64 * 1024
    proc = _install(bundle, tmp_path)
    err = error_of(proc)
    # refused for what it is (untrusted, a sparse member), before a byte was written: not for the write failing
    assert err["error"] == "ManifestSignatureError" or (err["error"] == "BundleError" and "sparse" in err["message"]), err
    assert "too large" not in err["message"].lower()
    assert "Traceback" not in proc.stderr and _written(tmp_path) < 1 << 20


def test_a_gzip_compressed_bundle_is_refused_before_it_expands(tmp_path):
    pem, pub = generate_keypair()
    size = 128 << 20
    sha = hashlib.sha256(b"\0" * size).hexdigest()
    bundle = tmp_path / "zeros.tar.gz"
    with gzip.open(bundle, "wb", compresslevel=9) as gz, tarfile.open(fileobj=gz, mode="w|") as tf:
        for name, data, _ in _documents(sha, size, pem):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo(f"artifacts/{sha}")
        info.size = size
        with open("/dev/zero", "rb") as zeros:
            tf.addfile(info, zeros)
    assert bundle.stat().st_size < 1 << 20
    key = tmp_path / "k.pub"
    key.write_text(pub + "\n")
    proc = _install(bundle, tmp_path, "--trusted-key", str(key))
    err = error_of(proc)
    assert err["error"] == "BundleError" and "compressed" in err["message"] and "decompress" in err["hint"], err
    assert _written(tmp_path) < 1 << 20


def test_a_bundle_directory_is_a_usage_error_not_a_traceback(tmp_path):
    folder = tmp_path / "bundle-dir"
    folder.mkdir()
    proc = _install(folder, tmp_path)
    err = error_of(proc)
    assert proc.returncode == 2 and err["error"] == "BundleError" and "directory" in err["message"], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "home").exists()  # said before a home is made


def _opened(tmp_path: Path, members: list):
    path = tmp_path / "b.tar"
    path.write_bytes(tar_bytes(members))
    root = tmp_path / "root"
    root.mkdir()
    return read_bundle(path, root), root


def test_only_listed_artifacts_of_their_listed_size_are_written(tmp_path):
    pem, _ = generate_keypair()
    data = b"artifact bytes" * 100
    sha = hashlib.sha256(data).hexdigest()
    docs = _documents(sha, len(data), pem)
    (tmp_path / "ok").mkdir()
    opened, root = _opened(tmp_path / "ok", docs + [(f"artifacts/{sha}", data, None)])
    assert list(root.iterdir()) == []  # the documents are read, nothing else yet
    assert opened.extract({sha: len(data)}) == {sha: root / sha} and (root / sha).read_bytes() == data

    other = hashlib.sha256(b"other").hexdigest()
    (tmp_path / "unlisted").mkdir()
    opened, root = _opened(tmp_path / "unlisted", docs + [(f"artifacts/{other}", b"x" * 4096, None)])
    assert opened.extract({sha: len(data)}) == {}  # passed over: an install then finds its target incomplete
    assert list(root.iterdir()) == []

    (tmp_path / "bigger").mkdir()
    opened, root = _opened(tmp_path / "bigger", docs + [(f"artifacts/{sha}", data + b"more", None)])
    with pytest.raises(BundleError, match=r"its manifest \(or index\) gives"):
        opened.extract({sha: len(data)})
    assert list(root.iterdir()) == []

    (tmp_path / "sparse").mkdir()
    with pytest.raises(BundleError, match="sparse"):
        opened, root = _opened(tmp_path / "sparse", docs + [(f"artifacts/{sha}", b"\0" * 512, len(data))])
        opened.extract({sha: len(data)})
    assert list((tmp_path / "sparse" / "root").iterdir()) == []


def test_a_bundle_whose_artifacts_come_first_is_refused_with_the_reason(tmp_path):
    pem, _ = generate_keypair()
    data = b"x" * 600
    sha = hashlib.sha256(data).hexdigest()
    (tmp_path / "a").mkdir()
    with pytest.raises(BundleError, match="comes before the bundle's index"):
        _opened(tmp_path / "a", [(f"artifacts/{sha}", data, None), *_documents(sha, len(data), pem)])
    assert list((tmp_path / "a" / "root").iterdir()) == []
