"""Issue 29: the rollback state of a channel is its own, per signing key. A key that verifies one
channel cannot raise another's watermark or change the source it expects; a co-signed manifest
raises each signer's entry (a key rotation keeps what was seen); a channel removed and added again
starts over. Real state files in a temporary home."""
from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from accelstack.manifests.channels import add_channel, remove_channel, trust_for
from accelstack.manifests.errors import ManifestError, ManifestRollbackError
from accelstack.manifests.keys import generate_keypair
from accelstack.manifests.rollback import RollbackStore
from accelstack.manifests.signatures import sign_manifest
from accelstack.manifests.trust import TrustedManifests
from accelstack.settings import Channel, Settings

NOW = datetime(2026, 6, 1, tzinfo=timezone.utc)


def _manifest(source: str, version: int) -> bytes:
    return json.dumps({
        "format": "accelstack-manifest", "format_version": 1, "source": source, "version": version,
        "expires": "2099-06-01T00:00:00Z", "kind": "ggml", "package": "stable-diffusion.cpp",
        "targets": [{"id": "cpu", "os": "linux", "arch": "x86_64", "backend": "cpu",
                     "artifacts": [{"name": "cpu.whl", "sha256": "ab" * 32, "size": 10,
                                    "url": "https://example.org/cpu.whl"}]}]}).encode()


def _signed(source: str, version: int, *pems: bytes):
    data, sig = _manifest(source, version), None
    for pem in pems:
        sig = sign_manifest(data, pem, sig)
    return data, sig


def _trusted(state, channel, *pubs) -> TrustedManifests:
    return TrustedManifests(keys=list(pubs), include_package_keys=False, rollback_state=state, channel=channel,
                            clock=lambda: NOW)


@pytest.fixture
def state(tmp_path):
    return tmp_path / "state" / "manifest-versions.json"


def test_one_channels_key_moves_nothing_of_another_channel(state):
    pem_a, pub_a = generate_keypair()
    pem_b, pub_b = generate_keypair()
    _trusted(state, "a", pub_a).verify(*_signed("stable", 3, pem_a))
    _trusted(state, "b", pub_b).verify(*_signed("stable", 2 ** 62, pem_b))  # b claims a's source
    _trusted(state, "a", pub_a).verify(*_signed("stable", 4, pem_a))  # a's genuine manifests go on
    with pytest.raises(ManifestRollbackError, match="version 3 is older than version 4"):
        _trusted(state, "a", pub_a).verify(*_signed("stable", 3, pem_a))
    # the same key given for channel a alongside its own (a bundle's --trusted-key) moves only its entry
    _trusted(state, "a", pub_a, pub_b).verify(*_signed("stable", 2 ** 62, pem_b))
    _trusted(state, "a", pub_a).verify(*_signed("stable", 5, pem_a))
    assert RollbackStore(state).channel_state("a")[_trusted(state, "a", pub_a).trust.keyids[0]] == ("stable", 5)
    assert RollbackStore(state).highest("stable") is None  # the per-source table is for checks without a channel


def test_a_channel_keeps_its_source_and_a_check_without_record_writes_nothing(state):
    pem, pub = generate_keypair()
    _trusted(state, "a", pub).verify(*_signed("stable", 3, pem), record=False)
    assert not state.parent.exists()
    _trusted(state, "a", pub).verify(*_signed("stable", 3, pem))
    before = state.read_bytes()
    with pytest.raises(ManifestRollbackError, match="source 'stable', and this one is of source 'beta'") as info:
        _trusted(state, "a", pub).verify(*_signed("beta", 9, pem))
    assert "remove the channel and add it again" in info.value.hint
    assert state.read_bytes() == before


def test_a_co_signed_manifest_raises_each_signers_entry_so_a_rotation_keeps_the_watermark(state):
    pem_old, pub_old = generate_keypair()
    pem_new, pub_new = generate_keypair()
    _trusted(state, "a", pub_old, pub_new).verify(*_signed("stable", 10, pem_old, pem_new))
    with pytest.raises(ManifestRollbackError, match="older than version 10"):  # the old key dropped
        _trusted(state, "a", pub_new).verify(*_signed("stable", 5, pem_old, pem_new))


def test_removing_a_channel_forgets_its_state_and_corrupt_state_is_loud(tmp_path):
    s = Settings.resolve(home=tmp_path / "h", config_dir=tmp_path / "cfg", env={})
    pem, pub = generate_keypair()
    add_channel(s, Channel("a", "https://example.org/m.json", keys=[pub]))
    trust_for(Channel("a", "u", keys=[pub]), s).verify(*_signed("stable", 3, pem))
    assert RollbackStore(s.rollback_state).channel_state("a")
    remove_channel(s, "a")
    assert RollbackStore(s.rollback_state).channel_state("a") == {}
    trust_for(Channel("a", "u", keys=[pub]), s).verify(*_signed("beta", 1, pem))  # bound anew
    doc = json.loads(s.rollback_state.read_text())
    doc["channels"]["a"] = {"x": {"version": 1}}
    s.rollback_state.write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match="corrupt"):
        trust_for(Channel("a", "u", keys=[pub]), s).verify(*_signed("beta", 1, pem))


def test_a_manifest_named_by_url_alone_is_kept_by_its_source_per_key(tmp_path):
    """``install --manifest URL``: each URL is its own ad-hoc channel, so an older version of the
    same publisher's manifest at another address must still be a rollback (test_e2e's
    test_manifest_rollback_is_refused); and a key given for another URL that claims the same
    source with a huge version must not block the first publisher's next release."""
    pem_a, pub_a = generate_keypair()
    pem_b, pub_b = generate_keypair()
    s = Settings.resolve(home=tmp_path / "home", cache=tmp_path / "cache", config_dir=tmp_path / "config")

    def adhoc(url: str, pub: str) -> TrustedManifests:
        from accelstack.manifests.channels import adhoc_channel_name

        t = trust_for(Channel(adhoc_channel_name(url), url, [], [pub]), s)
        t.clock = lambda: NOW
        return t

    adhoc("https://a.example/v2.json", pub_a).verify(*_signed("stable", 2, pem_a))
    with pytest.raises(ManifestRollbackError, match="version 1 is older than version 2"):
        adhoc("https://a.example/v1.json", pub_a).verify(*_signed("stable", 1, pem_a))
    adhoc("https://b.example/m.json", pub_b).verify(*_signed("stable", 2 ** 62, pem_b))  # b claims a's source
    adhoc("https://a.example/v3.json", pub_a).verify(*_signed("stable", 3, pem_a))  # a's next release goes on
    assert RollbackStore(s.rollback_state).channel_state("source:stable")  # kept by the source it claims
