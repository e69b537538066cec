"""Issue 29, trust and rollback: a key trusted for one channel (or given for one bundle) cannot move
another channel's rollback state, and a channel keeps the source its first trusted manifest had (a
mirror serving the same publisher's "beta" manifest is refused). Real CLI processes, manifests
served over HTTP on 127.0.0.1, real bundle files."""
from __future__ import annotations

import copy
import json
import socket
from pathlib import Path

import pytest

from accelstack.core.bundle_file import INDEX, MANIFEST, SIGNATURE, write_tar
from accelstack.manifests.signing import generate_keypair
from accelstack.publisher.publish import write_signed_manifest

from installer_helpers import Server, cli_env, error_of, result_of, run_cli

EXAMPLE = Path(__file__).resolve().parents[2] / "accelstack" / "manifests" / "data" / "ggml-example.json"
HUGE = 2 ** 62


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _doc(source: str, version: int) -> dict:
    """A manifest with one CPU target any x86_64 Linux machine fits, its artifact on a closed port
    (an install records the version, then fails to download: no build, no activation)."""
    doc = json.loads(EXAMPLE.read_text())
    target = copy.deepcopy(next(t for t in doc["targets"] if t["id"] == "linux-x64-cpu-noavx"))
    target["requires"] = {"cpu_features": [], "glibc": "2.17"}
    target["artifacts"][0]["urls"] = [f"http://127.0.0.1:{_closed_port()}/sd.tar.gz"]
    doc.update(source=source, version=version, targets=[target])
    return doc


def _publish(root: Path, sub: str, source: str, version: int, pem: bytes) -> Path:
    d = root / sub
    d.mkdir(parents=True, exist_ok=True)
    return write_signed_manifest(d, _doc(source, version), pem)


def _pub(path: Path, public_b64: str) -> Path:
    path.write_text(f"# test key\n{public_b64}\n")
    return path


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "site"
    root.mkdir()
    server = Server(root)
    yield root, server.url
    server.close()


@pytest.fixture
def env(tmp_path):
    return cli_env(tmp_path / "home", tmp_path / "cache", {"ACCELSTACK_CONFIG_DIR": str(tmp_path / "config")})


def _plan(env: dict, channel: str) -> dict:
    """What ``install --dry-run`` plans from ``channel`` (its manifest checked, nothing recorded)."""
    proc = run_cli(["install", "--dry-run", "--channel", channel, "--backend", "cpu", "--no-build", "--json"], env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return result_of(proc)["plan"]


def _install_records(env: dict, *args: str) -> None:
    """An install that verifies (and records) the manifest, then fails to download its artifact."""
    proc = run_cli(["install", "--backend", "cpu", "--no-build", "--json", *args], env)
    assert proc.returncode != 0
    assert error_of(proc)["error"] not in ("ManifestRollbackError", "ManifestSignatureError"), proc.stdout[-2000:]


def test_a_key_pinned_to_one_channel_cannot_raise_another_channels_watermark(served, env, tmp_path):
    root, url = served
    pem_a, pub_a = generate_keypair()
    pem_b, pub_b = generate_keypair()
    _publish(root, "a", "stable", 3, pem_a)
    _publish(root, "b", "stable", HUGE, pem_b)  # channel b's publisher claims channel a's source
    for name, pub in (("a", pub_a), ("b", pub_b)):
        key = _pub(tmp_path / f"{name}.pub", pub)
        proc = run_cli(["channel", "add", name, f"{url}/{name}/ggml-manifest.json", "--key", str(key)], env)
        assert proc.returncode == 0, proc.stderr
    _install_records(env, "--channel", "a")
    _install_records(env, "--channel", "b")  # recorded for channel b alone
    planned = _plan(env, "a")  # channel a's genuine manifest is still accepted
    assert planned["status"] == "ready", planned
    # and channel a's own watermark still holds: its older manifest is a rollback
    _publish(root, "a", "stable", 2, pem_a)
    proc = run_cli(["install", "--dry-run", "--channel", "a", "--json"], env)
    assert error_of(proc)["error"] == "ManifestRollbackError" and "older than version 3" in error_of(proc)["message"]


def test_a_key_given_for_a_bundle_cannot_raise_the_channels_watermark(served, env, tmp_path):
    root, url = served
    pem_a, pub_a = generate_keypair()
    pem_k, pub_k = generate_keypair()
    _publish(root, "a", "stable", 3, pem_a)
    key = _pub(tmp_path / "a.pub", pub_a)
    assert run_cli(["channel", "add", "a", f"{url}/a/ggml-manifest.json", "--key", str(key)], env).returncode == 0
    _install_records(env, "--channel", "a")
    # a bundle that names channel a, its manifest signed by another key, claiming a's source
    hostile = _publish(tmp_path / "hostile", "m", "stable", HUGE, pem_k)
    index = {"format": "accelstack-bundle", "version": 1, "stack": "ggml",
             "channel": {"name": "a", "url": f"{url}/a/ggml-manifest.json"}, "source": "stable",
             "manifest_version": HUGE, "targets": [], "artifacts": []}
    bundle = tmp_path / "hostile.tar"
    write_tar(bundle, [(INDEX, json.dumps(index).encode()), (MANIFEST, hostile.read_bytes()),
                       (SIGNATURE, hostile.with_name(hostile.name + ".sig").read_bytes())], [])
    k = _pub(tmp_path / "k.pub", pub_k)
    proc = run_cli(["install", "--bundle", str(bundle), "--offline", "--trusted-key", str(k), "--json"], env)
    assert proc.returncode != 0  # it holds no artifact; its manifest was verified with the key given
    planned = _plan(env, "a")
    assert planned["status"] == "ready", planned


def test_a_mirror_serving_the_publishers_other_manifest_is_refused(served, env, tmp_path):
    root, url = served
    pem, pub = generate_keypair()
    _publish(root, "stable", "stable", 3, pem)
    _publish(root, "beta", "beta", 1, pem)  # the same key signed an old beta manifest
    key = _pub(tmp_path / "release.pub", pub)
    primary = root / "primary"
    primary.mkdir()
    (primary / "ggml-manifest.json").write_bytes((root / "stable" / "ggml-manifest.json").read_bytes())
    (primary / "ggml-manifest.json.sig").write_bytes((root / "stable" / "ggml-manifest.json.sig").read_bytes())
    proc = run_cli(["channel", "add", "a", f"{url}/primary/ggml-manifest.json", "--mirror",
                    f"{url}/beta/ggml-manifest.json", "--key", str(key)], env)
    assert proc.returncode == 0, proc.stderr
    _install_records(env, "--channel", "a")  # stable v3 seen
    for name in ("ggml-manifest.json", "ggml-manifest.json.sig"):
        (primary / name).unlink()  # the channel's address fails: its mirror serves the beta manifest
    proc = run_cli(["install", "--dry-run", "--channel", "a", "--json"], env)
    assert proc.returncode != 0, "the beta manifest was planned from"
    err = error_of(proc)
    assert err["error"] == "ManifestRollbackError" and "'stable'" in err["message"] and "'beta'" in err["message"], err
    # a channel that is removed and added again binds to the source it then sees
    assert run_cli(["channel", "remove", "a"], env).returncode == 0
    assert run_cli(["channel", "add", "a", f"{url}/beta/ggml-manifest.json", "--key", str(key)], env).returncode == 0
    assert _plan(env, "a")["status"] == "ready"
