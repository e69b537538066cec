"""Channels: the user's channels file through the real CLI, trust pinned per channel, a --trusted-key
remembered for status and upgrade, key rotation, and what install says when no channel is configured."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

import accelstack
from accelstack.core.local_build import NoChannelError, compiler_instructions
from accelstack.core.planning import active_channels, load_manifests
from accelstack.core.verifiers import import_verifier
from accelstack.manifests.channels import ChannelError, read_user_channels, remove_channel
from accelstack.manifests.errors import ManifestSignatureError
from accelstack.manifests.keys import keyid_of, parse_public_key
from accelstack.manifests.signing import generate_keypair, sign_manifest
from accelstack.settings import Channel, Settings

from installer_helpers import cli_env, error_of, result_of, run_cli


def _pub(path: Path, public_b64: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# test key\n{public_b64}\n")
    return path


def _settings(tmp_path: Path, **kw) -> Settings:
    return Settings.resolve(home=tmp_path / "home", cache=tmp_path / "cache", config_dir=tmp_path / "config", **kw)


def test_channel_add_list_remove_through_the_cli(tmp_path, signing_key):
    config = tmp_path / "config"
    env = cli_env(tmp_path / "home", tmp_path / "cache", {"ACCELSTACK_CONFIG_DIR": str(config)})
    _, public_b64 = signing_key
    pub = _pub(tmp_path / "keys" / "release.pub", public_b64)
    kid = keyid_of(parse_public_key(public_b64))

    proc = run_cli(["channel", "list"], env)
    assert proc.returncode == 0 and "no channel is configured" in proc.stdout

    proc = run_cli(["channel", "add", "stable", "https://example.org/ggml-manifest.json", "--key", str(pub),
                    "--mirror", "https://mirror.example.org/ggml-manifest.json", "--no-check", "--json"], env)
    assert proc.returncode == 0, proc.stderr
    added = result_of(proc)
    assert added["keys"] == [public_b64] and kid in added["trust"]
    # a key already trusted globally, named by its id
    other_pem, other_b64 = generate_keypair()
    _pub(config / "trusted-keys" / "beta.pub", other_b64)
    other_id = keyid_of(parse_public_key(other_b64))
    assert run_cli(["channel", "add", "beta", "https://example.org/beta.json", "--key-id", other_id, "--no-check"], env).returncode == 0

    proc = run_cli(["channel", "add", "stable", "https://example.org/x.json", "--key", str(pub)], env)
    assert proc.returncode != 0 and "already configured" in proc.stderr
    proc = run_cli(["channel", "add", "Bad/Name", "https://example.org/x.json", "--key", str(pub)], env)
    assert proc.returncode != 0 and "not a valid channel name" in proc.stderr
    proc = run_cli(["channel", "add", "nokey", "https://example.org/x.json"], env)
    assert proc.returncode != 0 and "--key" in proc.stderr
    proc = run_cli(["channel", "add", "plain", "http://example.org/x.json", "--key", str(pub)], env)
    assert proc.returncode != 0 and "only https://" in proc.stderr

    rows = result_of(run_cli(["channel", "list", "--json"], env))["channels"]
    assert [(r["name"], r["mirrors"]) for r in rows] == [("stable", ["https://mirror.example.org/ggml-manifest.json"]),
                                                         ("beta", [])]
    assert rows[1]["keys"] == [other_b64]
    doc = json.loads((config / "channels.json").read_text())
    assert doc["format"] == "accelstack-channels" and len(doc["channels"]) == 2

    assert run_cli(["channel", "remove", "beta"], env).returncode == 0
    proc = run_cli(["channel", "remove", "beta", "--json"], env)
    assert proc.returncode != 0 and error_of(proc)["error"] == "ChannelError"
    assert [c.name for c in read_user_channels(_settings(tmp_path))] == ["stable"]


def test_the_channels_file_is_read_with_bounds_and_checked(tmp_path, signing_key):
    s = _settings(tmp_path)
    s.config_dir.mkdir(parents=True)
    _, public_b64 = signing_key
    yaml_file = s.channels_file.with_name("channels.yaml")
    yaml_file.write_text(f"channels:\n  - name: handmade\n    url: https://example.org/m.json\n    keys: ['{public_b64}']\n")
    assert [(c.name, c.keys) for c in read_user_channels(s)] == [("handmade", [public_b64])]
    with pytest.raises(ChannelError, match="edit that file"):
        remove_channel(s, "handmade")

    for bad, words in (('{"channels": [{"name": "x"}]}', "needs a 'name' and a 'url'"),
                       ('{"channels": [{"name": "x", "url": "u", "keys": ["bm90IGEga2V5"]}]}', "32 bytes"),
                       ("[" * 100_000, "nests"),
                       ('{"format": "accelstack-channels", "version": 99}', "version"),
                       ("{not json", "not valid JSON")):
        s.channels_file.write_text(bad)
        with pytest.raises(ChannelError, match=words):
            read_user_channels(s)
    s.channels_file.unlink()
    yaml_file.write_text("a: &x [1]\nb: *x\n")
    with pytest.raises(ChannelError, match="alias"):
        read_user_channels(s)


def test_trust_is_pinned_per_channel(site, tmp_path, signing_key):
    _, signer_b64 = signing_key
    _, stranger_b64 = generate_keypair()
    # the signer is trusted globally (the user's trusted-keys directory) and for channel "a" only
    s = _settings(tmp_path, channels=[Channel("a", site["v1"], keys=[signer_b64]),
                                      Channel("b", site["v2"], keys=[stranger_b64])])
    _pub(s.user_keys_dir / "signer.pub", signer_b64)

    trusted = load_manifests(s.replace(channel=["a"]), record=False)
    assert [(m.channel, m.version) for m in trusted.loaded] == [("a", 1)]
    with pytest.raises(ManifestSignatureError) as err:
        load_manifests(s.replace(channel=["b"]), record=False)
    assert "not signed by a trusted key" in err.value.message or "trusted" in err.value.message
    # with both channels configured, b's manifest is still refused: a's key does not sign for b
    with pytest.raises(ManifestSignatureError):
        load_manifests(s, record=False)
    with pytest.raises(ChannelError, match="no channel named 'c'"):
        active_channels(s.replace(channel=["c"]))


def test_a_manifest_signed_by_the_current_and_the_next_key_is_accepted_by_either(site, tmp_path, signing_key):
    current_pem, current_b64 = signing_key
    next_pem, next_b64 = generate_keypair()
    _, other_b64 = generate_keypair()
    manifest = tmp_path / "rotated" / "ggml-manifest.json"
    manifest.parent.mkdir()
    data = (site["root"] / "v1" / "ggml-manifest.json").read_bytes()
    manifest.write_bytes(data)
    sig = sign_manifest(data, next_pem, sign_manifest(data, current_pem))  # co-signed during the transition
    manifest.with_name(manifest.name + ".sig").write_bytes(sig)
    s = _settings(tmp_path)
    for keys in ([current_b64], [next_b64], [current_b64, next_b64]):
        loaded = load_manifests(s, record=False, channels=[Channel("rot", str(manifest), keys=keys)]).loaded
        assert loaded[0].version == 1
    with pytest.raises(ManifestSignatureError):
        load_manifests(s, record=False, channels=[Channel("rot", str(manifest), keys=[other_b64])])


def test_a_mirror_serves_when_the_channel_url_does_not(site, tmp_path, signing_key):
    s = _settings(tmp_path)
    dead = site["v1"].replace("/v1/", "/gone/")
    loaded = load_manifests(s, record=False, channels=[Channel("m", dead, [site["v1"]], [signing_key[1]])]).loaded
    assert loaded[0].url == site["v1"]


def test_a_trusted_key_given_at_install_is_remembered_for_status_and_upgrade(site, tmp_path, signing_key):
    first = _settings(tmp_path, manifests=[site["v1"]], trusted_keys=[signing_key[1]], allow_build=False)
    report = accelstack.detect(settings=first)
    summary = accelstack.install(None, report=report, settings=first, verifier=import_verifier())
    assert summary.changed and summary.receipt.manifest_source == "test-channel"

    later = _settings(tmp_path, allow_build=False)  # no --manifest, no --trusted-key
    assert later.trusted_keys == [] and later.manifests == []
    st = accelstack.status(report=report, settings=later)[0]
    assert st.healthy and st.problems == [], st.problems
    again = accelstack.upgrade(report=report, settings=later, verifier=import_verifier())
    assert again.changed is False and again.runtime == summary.runtime
    remembered = json.loads(later.remembered.read_text())["channels"]
    assert remembered[0]["url"] == site["v1"] and remembered[0]["keys"] == [signing_key[1]]


def test_compiler_instructions_name_what_each_os_installs():
    assert "Visual Studio Build Tools" in compiler_instructions("windows") and "CMake" in compiler_instructions("windows")
    assert "c++" not in compiler_instructions("windows")
    assert "xcode-select --install" in compiler_instructions("macos") and "brew install cmake" in compiler_instructions("macos")
    linux = compiler_instructions("linux")
    assert "apt install cmake g++" in linux and "dnf install cmake gcc-c++" in linux


def _hidden_toolchain_path(tmp_path: Path) -> str:
    """A PATH with only the Python that runs the CLI: no cmake, ninja or compiler."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(sys.executable, bin_dir / "python3")
    return str(bin_dir)


def test_no_channel_and_no_toolchain_explains_the_choices(tmp_path, ggml_cpu_build):
    # the source is cached, the compile is not, and no compiler is on PATH
    builds = tmp_path / "builds"
    (builds / "sdist").mkdir(parents=True)
    sdist = next((Settings.resolve().build_cache / "sdist").glob("*.tar.gz"))
    os.symlink(sdist, builds / "sdist" / sdist.name)
    env = cli_env(tmp_path / "home", tmp_path / "cache", {"ACCELSTACK_BUILD_CACHE": str(builds),
                  "ACCELSTACK_CONFIG_DIR": str(tmp_path / "config"), "PATH": _hidden_toolchain_path(tmp_path)})
    proc = run_cli(["install"], env)
    assert proc.returncode != 0
    assert "no channel is configured" in proc.stdout + proc.stderr
    assert "cmake" in proc.stderr and "not found" in proc.stderr
    assert "configure a channel" in proc.stderr and "offline bundle" in proc.stderr and "apt install cmake g++" in proc.stderr
    assert "accelstack channel add" in proc.stderr
    assert not (builds / ggml_cpu_build.key).joinpath("build.json").exists()

    proc = run_cli(["install", "--no-build", "--json"], env)
    err = error_of(proc)
    assert err["error"] == "NoChannelError" and err["action"] == "add-manifest"
    assert "local builds are turned off" in err["message"]


def test_no_channel_with_a_cached_build_says_so_once_and_installs_without_a_compiler(tmp_path, ggml_cpu_build, monkeypatch):
    monkeypatch.setenv("PATH", _hidden_toolchain_path(tmp_path))
    assert shutil.which("cmake") is None and shutil.which("c++") is None
    s = _settings(tmp_path)
    events = []
    summary = accelstack.install(None, settings=s, verifier=import_verifier(), on_progress=events.append)
    said = [e.message for e in events if e.kind == "message"]
    assert sum("no channel is configured" in m for m in said) == 1
    assert summary.notes == ["no channel is configured, so there is no published build to download"]
    assert summary.built_locally and summary.changed and summary.receipt.manifest_source == "local-build"
    assert accelstack.status(settings=s)[0].healthy


def test_no_channel_and_no_local_builds_is_a_typed_error_with_the_choices(tmp_path):
    s = _settings(tmp_path, allow_build=False)
    with pytest.raises(NoChannelError) as err:
        accelstack.install(None, settings=s, verifier=import_verifier())
    assert err.value.action.value == "add-manifest"
    assert "configure a channel" in err.value.hint and "bundle" in err.value.hint
