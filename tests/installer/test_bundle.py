"""Offline bundles: made from a channel on one home, installed into a fresh home with the server gone,
checked as online (signature, hashes, then the real generation check); hostile bundle files refused."""
from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelstack.artifacts import HashMismatchError
from accelstack.core.bundles import BundleError, create_bundle, install_bundle, read_bundle
from accelstack.core.verifiers import import_verifier
from accelstack.errors import UsageError
from accelstack.installer.home import Home
from accelstack.manifests.errors import ManifestSignatureError
from accelstack.settings import Channel, Settings

from installer_helpers import cli_env, error_of, result_of, run_cli


def _pub(path: Path, public_b64: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# test key\n{public_b64}\n")
    return path


def _home(tmp_path: Path, name: str) -> dict:
    return cli_env(tmp_path / name / "home", tmp_path / name / "cache", {"ACCELSTACK_CONFIG_DIR": str(tmp_path / name / "config")})


def test_a_bundle_made_online_installs_offline_into_a_fresh_home(site, tmp_path, signing_key, ggml_cpu_build):
    pub = _pub(tmp_path / "release.pub", signing_key[1])
    online = _home(tmp_path, "online")
    assert run_cli(["channel", "add", "test-channel", site["v1"], "--key", str(pub)], online).returncode == 0
    bundle = tmp_path / "runtime.tar"
    proc = run_cli(["bundle", "create", "-o", str(bundle), "--json"], online)  # the target this machine would install
    assert proc.returncode == 0, proc.stderr
    made = result_of(proc)
    assert made["channel"] == "test-channel" and made["version"] == 1 and len(made["targets"]) == 1
    assert made["targets"][0].endswith("-cpu")
    with tarfile.open(bundle) as tf:
        assert sorted(tf.getnames()) == sorted(["accelstack-bundle.json", "ggml-manifest.json", "ggml-manifest.json.sig",
                                                f"artifacts/{ggml_cpu_build.sha256}"])
    site["server"].close()  # no network from here on

    offline = _home(tmp_path, "offline")
    offline["ACCELSTACK_OFFLINE"] = "1"
    proc = run_cli(["install", "--bundle", str(bundle), "--json"], offline)  # the key is not trusted there
    assert proc.returncode != 0 and error_of(proc)["error"] == "ManifestSignatureError"

    proc = run_cli(["install", "--bundle", str(bundle), "--offline", "--trusted-key", str(pub), "--json"], offline)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    out = result_of(proc)
    assert out["changed"] is True and out["built_locally"] is False
    receipt = Home(tmp_path / "offline" / "home").read_receipt(out["runtime"])
    assert receipt.manifest_source == "test-channel" and receipt.verification.ok and receipt.verification.check == "verify"
    status = result_of(run_cli(["status", "--json"], offline))["stacks"]
    assert next(s for s in status if s["stack"] == "ggml")["healthy"] is True


def _bundle(site, tmp_path: Path, signing_key) -> Path:
    s = Settings.resolve(home=tmp_path / "a" / "home", cache=tmp_path / "a" / "cache", config_dir=tmp_path / "a" / "config",
                         channels=[Channel("test-channel", site["v1"], keys=[signing_key[1]])])
    return Path(create_bundle(tmp_path / "b.tar", settings=s, backends=["cpu"]).path)


def _fresh(tmp_path: Path, name: str, **kw) -> Settings:
    return Settings.resolve(home=tmp_path / name / "home", cache=tmp_path / name / "cache",
                            config_dir=tmp_path / name / "config", offline=True, **kw)


def _rewrite(src: Path, dest: Path, change) -> Path:
    """A copy of the bundle ``src`` with each member's bytes passed through ``change(name, data)``."""
    with tarfile.open(src) as tin, tarfile.open(dest, "w") as tout:
        for m in tin.getmembers():
            data = change(m.name, tin.extractfile(m).read())
            m.size = len(data)
            tout.addfile(m, io.BytesIO(data))
    return dest


def test_a_tampered_bundle_is_refused_as_online(site, tmp_path, signing_key):
    bundle = _bundle(site, tmp_path, signing_key)
    key = [signing_key[1]]

    def flip_artifact(name, data):
        return data[:100] + bytes([data[100] ^ 1]) + data[101:] if name.startswith("artifacts/") else data

    s = _fresh(tmp_path, "x", trusted_keys=key)
    with pytest.raises(HashMismatchError):
        install_bundle(_rewrite(bundle, tmp_path / "bad-artifact.tar", flip_artifact), settings=s, verifier=import_verifier())

    def edit_manifest(name, data):
        if name != "ggml-manifest.json":
            return data
        doc = json.loads(data)
        doc["targets"][0]["artifacts"][0]["size"] += 1
        return json.dumps(doc).encode()

    with pytest.raises(ManifestSignatureError):
        install_bundle(_rewrite(bundle, tmp_path / "bad-manifest.tar", edit_manifest), settings=s, verifier=import_verifier())
    assert Home(s.home).read_active().active == {}

    # a key pinned for the bundle's channel name is the one that counts
    from accelstack.manifests.signing import generate_keypair

    other = Channel("test-channel", "https://example.org/m.json", keys=[generate_keypair()[1]])
    with pytest.raises(ManifestSignatureError):
        install_bundle(bundle, settings=_fresh(tmp_path, "y", channels=[other]), verifier=import_verifier())

    summary = install_bundle(bundle, settings=_fresh(tmp_path, "z", trusted_keys=key), verifier=import_verifier())
    assert summary.changed and summary.receipt.manifest_source == "test-channel"


def _tar(path: Path, members) -> Path:
    with tarfile.open(path, "w") as tf:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.SYMTYPE:
                info.linkname = "../../etc/passwd"
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return path


def test_hostile_bundle_files_are_refused(tmp_path):
    sha = "a" * 64
    index = json.dumps({"format": "accelstack-bundle", "version": 1}).encode()
    cases = {
        "traversal": ([("../evil", tarfile.REGTYPE, b"x")], "unexpected member"),
        "absolute": ([("/etc/evil", tarfile.REGTYPE, b"x")], "unexpected member"),
        "symlink": ([(f"artifacts/{sha}", tarfile.SYMTYPE, b"")], "not a regular file"),
        "directory": ([("artifacts/" + "b" * 64, tarfile.DIRTYPE, b"")], "not a regular file"),
        "duplicate": ([("accelstack-bundle.json", tarfile.REGTYPE, index)] * 2, "appears twice"),
        "big-signature": ([("ggml-manifest.json.sig", tarfile.REGTYPE, b"x" * (64 * 1024 + 1))], "more than accepted"),
        "no-manifest": ([("accelstack-bundle.json", tarfile.REGTYPE, index)], "ggml-manifest.json missing"),
        "not-ours": ([("accelstack-bundle.json", tarfile.REGTYPE, b'{"format": "zip"}'),
                      ("ggml-manifest.json", tarfile.REGTYPE, b"{}")], "not an accelstack bundle"),
    }
    for name, (members, words) in cases.items():
        root = tmp_path / name
        root.mkdir()
        with pytest.raises(BundleError, match=words):
            read_bundle(_tar(tmp_path / f"{name}.tar", members), root)
        assert not (tmp_path / "evil").exists() and not any(p.is_symlink() for p in root.iterdir())

    good = _tar(tmp_path / "good.tar", [("accelstack-bundle.json", tarfile.REGTYPE, index),
                                         ("ggml-manifest.json", tarfile.REGTYPE, b"{}"), (f"artifacts/{sha}", tarfile.REGTYPE, b"y" * 5000)])
    truncated = tmp_path / "truncated.tar"
    truncated.write_bytes(good.read_bytes()[:2000])
    (tmp_path / "t").mkdir()
    with pytest.raises(BundleError, match="not a complete"):
        read_bundle(truncated, tmp_path / "t")
    (tmp_path / "junk.tar").write_bytes(os.urandom(4096))
    (tmp_path / "j").mkdir()
    with pytest.raises(BundleError, match="not a complete"):
        read_bundle(tmp_path / "junk.tar", tmp_path / "j")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(BundleError, match="not a regular file"):
        read_bundle(tmp_path / "fifo", tmp_path / "j")
    (tmp_path / "g").mkdir()
    opened = read_bundle(good, tmp_path / "g")
    opened.extract({sha: 5000})  # what a signed manifest (or a torch index) lists
    assert opened.artifacts == {sha: tmp_path / "g" / sha} and opened.signature is None


_NAMES = st.sampled_from(["accelstack-bundle.json", "ggml-manifest.json", "ggml-manifest.json.sig", f"artifacts/{'c' * 64}",
                          "../x", "/abs", "artifacts/../../x", "artifacts/" + "C" * 64, "./ggml-manifest.json", "a" * 300,
                          "artifacts/", "wheels/x.whl"])
_KINDS = st.sampled_from([tarfile.REGTYPE, tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.DIRTYPE,
                          tarfile.FIFOTYPE, tarfile.CHRTYPE])


@settings(max_examples=150, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(_NAMES, _KINDS, st.binary(max_size=64)), max_size=6), st.integers(0, 64))
def test_any_tar_is_read_safely_or_refused_with_a_bundle_error(tmp_path, members, cut):
    case = Path(tempfile.mkdtemp(prefix="case-", dir=tmp_path))  # hypothesis may run one example twice
    path = case / "b.tar"
    with tarfile.open(path, "w") as tf:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                info.linkname = "../../outside"
                tf.addfile(info)
            elif kind == tarfile.REGTYPE:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            else:
                tf.addfile(info)
    if cut:
        path.write_bytes(path.read_bytes()[:-cut * 64])
    root = case / "root"
    root.mkdir()
    listed = {name[len("artifacts/"):]: len(data) for name, kind, data in members if name.startswith("artifacts/")}
    try:
        read_bundle(path, root).extract(listed)
    except BundleError:
        pass
    assert {p.name for p in case.iterdir()} <= {"b.tar", "root"}
    assert all(p.is_file() and not p.is_symlink() and len(p.name) == 64 for p in root.iterdir())


def test_torch_bundles_take_a_plan_not_manifest_targets(tmp_path):
    # torch bundles themselves: tests/installer/test_torch_bundle.py
    s = Settings.resolve(home=tmp_path / "home", cache=tmp_path / "cache", config_dir=tmp_path / "config")
    with pytest.raises(UsageError, match="holds one torch plan"):
        create_bundle(tmp_path / "t.tar", settings=s, stack="torch", targets=["linux-x86_64-cpu"])


def test_an_old_bundle_renamed_in_its_unsigned_index_is_still_a_rollback(site, tmp_path, signing_key):
    """The rollback watermark is keyed by signed data (issue 47): an old bundle refused as a rollback
    installed once the channel name in its unsigned accelstack-bundle.json was edited, and the edited
    name and URL were remembered for status and upgrade."""
    key = [signing_key[1]]
    pub = _pub(tmp_path / "release.pub", signing_key[1])
    old = _bundle(site, tmp_path, signing_key)  # version 1
    newer = Settings.resolve(home=tmp_path / "n" / "home", cache=tmp_path / "n" / "cache", config_dir=tmp_path / "n" / "config",
                             channels=[Channel("test-channel", site["v2"], keys=key)])
    new = Path(create_bundle(tmp_path / "new.tar", settings=newer, backends=["cpu"]).path)
    s = _fresh(tmp_path, "z", trusted_keys=key)
    installed = install_bundle(new, settings=s, verifier=import_verifier()).receipt.id
    env = {**_home(tmp_path, "z"), "ACCELSTACK_OFFLINE": "1"}
    cmd = ["install", "--bundle", "--offline", "--trusted-key", str(pub), "--json"]
    proc = run_cli(cmd[:2] + [str(old)] + cmd[2:], env)
    assert proc.returncode != 0 and error_of(proc)["error"] == "ManifestRollbackError", proc.stdout[-2000:]

    def rename(name, data):
        if name != "accelstack-bundle.json":
            return data
        return json.dumps({**json.loads(data), "channel": {"name": "elsewhere", "url": "https://evil.example/m.json"}}).encode()

    renamed = _rewrite(old, tmp_path / "renamed.tar", rename)
    proc = run_cli(cmd[:2] + [str(renamed)] + cmd[2:], env)
    assert proc.returncode != 0 and error_of(proc)["error"] == "ManifestRollbackError", proc.stdout[-2000:]
    assert Home(s.home).read_active().active["ggml"] == installed
    kept = "".join(p.read_text() for p in (tmp_path / "z").rglob("*.json"))
    assert "evil.example" not in kept and "elsewhere" not in kept
