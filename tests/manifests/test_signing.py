"""Signed manifests: tampered, unsigned, untrusted, expired, rolled back, malformed; the trust
store; the rollback state; and `accelstack manifest keygen | sign | verify`."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from accelstack.cli import main
from accelstack.errors import Action
from accelstack.manifests.errors import (
    ManifestError,
    ManifestExpiredError,
    ManifestFormatError,
    ManifestKeyError,
    ManifestRollbackError,
    ManifestSignatureError,
)
from accelstack.manifests.signing import (
    RollbackStore,
    TrustStore,
    generate_keypair,
    keyid_of,
    sign_manifest,
)
from accelstack.manifests.trust import TrustedManifests, VerifiedManifest
from accelstack.settings import Settings

from cli_helpers import result_of

NOW = datetime(2026, 6, 1, tzinfo=timezone.utc)
SHA = "ab" * 32


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELSTACK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))


def manifest(**over) -> bytes:
    doc = {
        "format": "accelstack-manifest",
        "format_version": 1,
        "source": "official",
        "version": 7,
        "expires": "2027-06-01T00:00:00Z",
        "kind": "ggml",
        "package": "stable-diffusion.cpp",
        "targets": [{"id": "cpu", "os": "linux", "arch": "x86_64", "backend": "cpu",
                     "artifacts": [{"name": "cpu.whl", "sha256": SHA, "size": 10, "url": "https://example.org/cpu.whl"}]}],
    }
    doc.update(over)
    for key in [k for k, v in over.items() if v is ...]:
        del doc[key]
    return json.dumps(doc, indent=2).encode()


@pytest.fixture
def keys():
    pem, pub = generate_keypair()
    return pem, pub


@pytest.fixture
def trust(keys):
    """The publisher's public key only (the shipped ones and the user's are left out)."""
    return [keys[1]]


@pytest.fixture
def rollback(tmp_path):
    return tmp_path / "state" / "versions.json"


def verify(data, sig, trust, *, rollback=None, insecure_unsigned=False, now=NOW, record=True) -> dict:
    """Verify as accelstack does; the manifest's envelope as a dict, plus its signer."""
    result = checked(data, sig, trust, rollback=rollback, insecure_unsigned=insecure_unsigned, now=now, record=record)
    env = result.envelope
    return {"source": env.source, "version": env.version, "kind": env.kind, "keyid": result.keyid}


def checked(data, sig, trust, *, rollback=None, insecure_unsigned=False, now=NOW, record=True) -> VerifiedManifest:
    clock = (lambda: now) if now is not None else None
    trusted = TrustedManifests(keys=trust, include_package_keys=False, rollback_state=rollback,
                               insecure_unsigned=insecure_unsigned, **({"clock": clock} if clock else {}))
    return trusted.verify(data, sig, record=record)


# -- signatures ------------------------------------------------------------------------------------
def test_sign_and_verify_round_trip(keys, trust, rollback):
    data = manifest()
    sig = sign_manifest(data, keys[0])
    doc = json.loads(sig)
    raw = base64.b64decode(keys[1])
    assert doc["format"] == "accelstack-signature"
    assert doc["signatures"][0]["keyid"] == hashlib.sha256(raw).hexdigest()[:16] == keyid_of(raw)
    assert verify(data, sig, trust, rollback=rollback)["version"] == 7
    assert RollbackStore(rollback).highest("official") == 7


def test_tampered_manifest_is_refused(keys, trust):
    data = manifest()
    sig = sign_manifest(data, keys[0])
    tampered = data.replace(b'"version": 7', b'"version": 8')
    with pytest.raises(ManifestSignatureError, match="modified after signing"):
        verify(tampered, sig, trust)
    one_byte = data + b" "
    with pytest.raises(ManifestSignatureError):
        verify(one_byte, sig, trust)


def test_unsigned_manifest_is_refused_unless_insecure(keys, trust, rollback):
    data = manifest()
    with pytest.raises(ManifestSignatureError, match="not signed") as info:
        verify(data, None, trust)
    assert info.value.action is Action.ALLOW_UNSIGNED and "mirror you control" in info.value.hint
    assert "--" not in info.value.hint and "accelstack " not in info.value.hint
    assert verify(data, None, trust, insecure_unsigned=True, rollback=rollback)["source"] == "official"
    assert RollbackStore(rollback).highest("official") is None, "an unverified manifest never raises the watermark"
    # a wrong signature accepted on the user's word does not raise it either; a valid one does
    other_pem, _ = generate_keypair()
    assert verify(data, sign_manifest(data, other_pem), trust, insecure_unsigned=True, rollback=rollback)["keyid"] is None
    assert RollbackStore(rollback).highest("official") is None
    assert verify(data, sign_manifest(data, keys[0]), trust, insecure_unsigned=True, rollback=rollback)["keyid"]
    assert RollbackStore(rollback).highest("official") == 7
    # and the watermark still refuses an older one, signed or not
    with pytest.raises(ManifestRollbackError):
        verify(manifest(version=6), None, trust, insecure_unsigned=True, rollback=rollback)


def test_insecure_unsigned_still_checks_envelope_and_expiry(trust):
    with pytest.raises(ManifestFormatError):
        verify(manifest(version="7"), None, trust, insecure_unsigned=True)
    with pytest.raises(ManifestExpiredError):
        verify(manifest(expires="2020-01-01T00:00:00Z"), None, trust, insecure_unsigned=True)


def test_untrusted_key_is_refused(keys):
    other_pem, other_pub = generate_keypair()
    data = manifest()
    sig = sign_manifest(data, other_pem)
    with pytest.raises(ManifestSignatureError, match="not trusted") as info:
        verify(data, sig, [keys[1]])
    assert info.value.action is Action.TRUST_KEY
    with pytest.raises(ManifestSignatureError, match="not trusted.*none"):
        verify(data, sig, [])


def test_cosigned_manifest_verifies_with_either_key(keys):
    other_pem, other_pub = generate_keypair()
    data = manifest()
    sig = sign_manifest(data, keys[0])
    sig = sign_manifest(data, other_pem, existing=sig)
    assert len(json.loads(sig)["signatures"]) == 2
    sig = sign_manifest(data, keys[0], existing=sig)  # re-signing replaces, not duplicates
    assert len(json.loads(sig)["signatures"]) == 2
    for pub in (keys[1], other_pub):
        assert verify(data, sig, [pub])["keyid"] == keyid_of(base64.b64decode(pub))


@pytest.mark.parametrize("sig", [
    b"not json",
    b"[]",
    json.dumps({"format": "other", "signatures": []}).encode(),
    json.dumps({"format": "accelstack-signature", "signatures": "x"}).encode(),
    json.dumps({"format": "accelstack-signature", "signatures": []}).encode(),
    json.dumps({"format": "accelstack-signature", "signatures": [{"keyid": 1}]}).encode(),
])
def test_malformed_signature_files(trust, sig):
    with pytest.raises(ManifestSignatureError):
        verify(manifest(), sig, trust)


def test_garbage_signature_from_a_trusted_keyid(keys, trust):
    kid = keyid_of(base64.b64decode(keys[1]))
    sig = json.dumps({"format": "accelstack-signature",
                      "signatures": [{"keyid": kid, "sig": base64.b64encode(b"\0" * 64).decode()}]}).encode()
    with pytest.raises(ManifestSignatureError, match="does not match"):
        verify(manifest(), sig, trust)


# -- expiry and rollback -------------------------------------------------------------------------------
def test_expired_manifest_is_refused(keys, trust):
    data = manifest(expires="2026-05-31T23:59:59Z")
    with pytest.raises(ManifestExpiredError, match="expired on 2026-05-31"):
        verify(data, sign_manifest(data, keys[0]), trust)
    # an offset is fine, and `now` defaults to the real clock
    data = manifest(expires="2026-06-01T02:00:00+03:00")  # 23:00 UTC the day before
    with pytest.raises(ManifestExpiredError):
        verify(data, sign_manifest(data, keys[0]), trust)
    future = (datetime.now(timezone.utc) + timedelta(days=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    data = manifest(expires=future)
    assert verify(data, sign_manifest(data, keys[0]), trust, now=None)
    # the clock is an input
    assert verify(data, sign_manifest(data, keys[0]), trust, now=datetime.now(timezone.utc) + timedelta(days=29))
    with pytest.raises(ManifestExpiredError):
        verify(data, sign_manifest(data, keys[0]), trust, now=datetime.now(timezone.utc) + timedelta(days=31))


def test_rollback_is_refused_and_newer_is_recorded(keys, trust, rollback):
    def signed(version, source="official"):
        data = manifest(version=version, source=source)
        return data, sign_manifest(data, keys[0])

    verify(*signed(7), trust, rollback=rollback)
    verify(*signed(7), trust, rollback=rollback)  # the same version again is fine
    with pytest.raises(ManifestRollbackError, match="version 6 is older than version 7"):
        verify(*signed(6), trust, rollback=rollback)
    verify(*signed(9), trust, rollback=rollback)
    assert RollbackStore(rollback).highest("official") == 9
    with pytest.raises(ManifestRollbackError):
        verify(*signed(8), trust, rollback=rollback)
    verify(*signed(1, source="mirror-b"), trust, rollback=rollback)  # per source
    # persisted across instances
    again = RollbackStore(rollback)
    assert again.highest("official") == 9 and again.highest("mirror-b") == 1
    # record=False checks without remembering
    verify(*signed(20), trust, rollback=rollback, record=False)
    assert again.highest("official") == 9
    # no rollback state: no check
    verify(*signed(2), trust)


def test_rollback_check_without_record_writes_nothing(keys, trust, rollback):
    """A plan or dry run checks the watermark but leaves the home untouched, state or not."""
    old = manifest(version=3)
    verify(old, sign_manifest(old, keys[0]), trust, rollback=rollback, record=False)
    assert not rollback.parent.exists()  # nothing seen yet: no directory, no lock file
    RollbackStore(rollback).check("official", 5)
    before = sorted(p.name for p in rollback.parent.iterdir())
    with pytest.raises(ManifestRollbackError, match="version 3 is older than version 5"):
        verify(old, sign_manifest(old, keys[0]), trust, rollback=rollback, record=False)
    (rollback.parent / (rollback.name + ".lock")).unlink(missing_ok=True)
    newer = manifest(version=6)
    verify(newer, sign_manifest(newer, keys[0]), trust, rollback=rollback, record=False)
    assert sorted(p.name for p in rollback.parent.iterdir()) == [n for n in before if not n.endswith(".lock")]
    assert RollbackStore(rollback).highest("official") == 5


def test_rollback_state_is_atomic_and_corruption_is_loud(rollback):
    rollback = RollbackStore(rollback)
    rollback.check("s", 3)
    assert [p.name for p in rollback.path.parent.iterdir() if p.name.endswith(".tmp")] == []
    assert json.loads(rollback.path.read_text())["sources"]["s"]["version"] == 3
    rollback.path.write_text("{ not json")
    with pytest.raises(ManifestError, match="corrupt") as info:
        rollback.check("s", 1)
    assert "delete" in info.value.hint


def test_trust_follows_settings_of_the_home(tmp_path, keys):
    settings = Settings.resolve(home=tmp_path / "h", config_dir=tmp_path / "cfg", trusted_keys=[keys[1]], env={})
    trusted = TrustedManifests.from_settings(settings, clock=lambda: NOW)
    assert trusted.rollback is not None
    assert trusted.rollback.path == tmp_path / "h" / "state" / "manifest-versions.json" == settings.rollback_state
    data = manifest()
    assert trusted.verify(data, sign_manifest(data, keys[0])).signed
    assert RollbackStore(settings.rollback_state).highest("official") == 7
    # the user's trusted-keys directory comes from the settings too
    pem2, pub2 = generate_keypair()
    settings.user_keys_dir.mkdir(parents=True)
    (settings.user_keys_dir / "publisher.pub").write_text(pub2)
    data = manifest(version=8)
    assert TrustedManifests.from_settings(settings, clock=lambda: NOW).verify(data, sign_manifest(data, pem2)).signed


# -- envelope --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("over,field", [
    ({"format": ...}, "format"),
    ({"format": "something-else"}, "format"),
    ({"format_version": 2}, "format_version"),
    ({"format_version": "1"}, "format_version"),
    ({"format_version": True}, "format_version"),
    ({"source": ...}, "source"),
    ({"source": ""}, "source"),
    ({"source": 3}, "source"),
    ({"version": "7"}, "version"),
    ({"version": 7.0}, "version"),
    ({"version": False}, "version"),
    ({"version": -1}, "version"),
    ({"version": ...}, "version"),
    ({"expires": "tomorrow"}, "expires"),
    ({"expires": "2027-06-01T00:00:00"}, "expires"),  # no time zone
    ({"expires": 20270601}, "expires"),
    ({"kind": ...}, "kind"),
    ({"kind": 1}, "kind"),
])
def test_envelope_errors_name_the_field(keys, trust, over, field):
    data = manifest(**over)
    with pytest.raises(ManifestFormatError, match=f"^{field}:"):
        verify(data, sign_manifest(data, keys[0]), trust)


@pytest.mark.parametrize("data", [b"{not json", b"[1, 2]", b"\xff\xfe"])
def test_not_a_json_object(keys, trust, data):
    with pytest.raises(ManifestFormatError):
        verify(data, sign_manifest(data, keys[0]), trust)


def test_unknown_format_version_says_upgrade(keys, trust):
    data = manifest(format_version=2)
    with pytest.raises(ManifestFormatError) as info:
        verify(data, sign_manifest(data, keys[0]), trust)
    assert "upgrade" in info.value.hint and info.value.action is Action.UPDATE_ACCELSTACK


# -- trust store ---------------------------------------------------------------------------------------
def test_trust_store_sources(tmp_path, keys):
    user_dir = tmp_path / "xdg-config" / "accelstack" / "trusted-keys"
    user_dir.mkdir(parents=True)
    pem2, pub2 = generate_keypair()
    (user_dir / "publisher.pub").write_text(f"# a comment\n{pub2}\n")
    (user_dir / "ignored.txt").write_text("not a key")
    pkg_dir = tmp_path / "pkg-keys"
    pkg_dir.mkdir()
    pem3, pub3 = generate_keypair()
    (pkg_dir / "official.pub").write_text(pub3)
    explicit = tmp_path / "explicit.pub"
    explicit.write_text(keys[1])

    store = TrustStore([explicit], package_dir=pkg_dir, user_dir=user_dir)
    ids = {keyid_of(base64.b64decode(p)) for p in (keys[1], pub2, pub3)}
    assert set(store.keyids) == ids
    assert store.get(keyid_of(base64.b64decode(pub2))).origin.startswith("user:")
    assert store.get(keyid_of(base64.b64decode(pub3))).origin.startswith("package:")
    assert TrustStore(include_package=False).keyids == []
    assert TrustStore(package_dir=pkg_dir).keyids == [keyid_of(base64.b64decode(pub3))], "no user dir given: none read"
    data = manifest()
    trusted = TrustedManifests(keys=[str(explicit)], user_keys_dir=user_dir, include_package_keys=False, clock=lambda: NOW)
    assert trusted.verify(data, sign_manifest(data, pem2)).keyid == keyid_of(base64.b64decode(pub2))
    assert trusted.verify(data, sign_manifest(data, keys[0])).keyid == keyid_of(base64.b64decode(keys[1]))


def test_shipped_keys_directory_loads():
    store = TrustStore()  # whatever ships must parse
    for kid in store.keyids:
        assert len(kid) == 16


@pytest.mark.parametrize("text", ["not base64!!", base64.b64encode(b"short").decode()])
def test_bad_key_files_are_loud(tmp_path, text):
    bad = tmp_path / "bad.pub"
    bad.write_text(text)
    with pytest.raises(ManifestKeyError, match="bad.pub"):
        TrustStore([bad], include_package=False)
    with pytest.raises(ManifestKeyError, match="bad.pub"):
        TrustedManifests(keys=[str(bad)])


# -- CLI -----------------------------------------------------------------------------------------------
def test_cli_keygen_sign_verify(tmp_path, capsys):
    prefix = tmp_path / "keys" / "release"
    assert main(["manifest", "keygen", "--out", str(prefix), "--json"]) == 0
    info = result_of(capsys.readouterr().out)
    key, pub = Path(info["private_key"]), Path(info["public_key"])
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert key.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert main(["manifest", "keygen", "--out", str(prefix)]) == 2  # no silent overwrite
    capsys.readouterr()

    m = tmp_path / "manifest.json"
    m.write_bytes(manifest(expires=(datetime.now(timezone.utc) + timedelta(days=9)).strftime("%Y-%m-%dT%H:%M:%SZ")))
    assert main(["manifest", "sign", str(m), "--key", str(key)]) == 0
    assert (tmp_path / "manifest.json.sig").exists()
    assert info["keyid"] in capsys.readouterr().out

    assert main(["manifest", "verify", str(m), "--key", str(pub), "--json"]) == 0
    result = result_of(capsys.readouterr().out)
    assert result["ok"] and result["signed"] and result["keyid"] == info["keyid"] and result["version"] == 7

    # without the key it is untrusted; tampered it fails; unsigned needs the flag
    assert main(["manifest", "verify", str(m)]) == 1
    assert "not trusted" in capsys.readouterr().err
    m.write_bytes(m.read_bytes().replace(b'"version": 7', b'"version": 70'))
    assert main(["manifest", "verify", str(m), "--key", str(pub)]) == 1
    assert "modified after signing" in capsys.readouterr().err
    os.unlink(tmp_path / "manifest.json.sig")
    assert main(["manifest", "verify", str(m), "--key", str(pub)]) == 1
    capsys.readouterr()
    assert main(["manifest", "verify", str(m), "--insecure-unsigned"]) == 0
    assert "NO trusted signature" in capsys.readouterr().out


def test_cli_sign_refuses_broken_or_expired_manifests(tmp_path, capsys):
    prefix = tmp_path / "k"
    main(["manifest", "keygen", "--out", str(prefix)])
    bad = tmp_path / "bad.json"
    bad.write_bytes(manifest(version="x"))
    assert main(["manifest", "sign", str(bad), "--key", str(tmp_path / "k.key")]) == 1
    assert "version:" in capsys.readouterr().err
    old = tmp_path / "old.json"
    old.write_bytes(manifest(expires="2020-01-01T00:00:00Z"))
    assert main(["manifest", "sign", str(old), "--key", str(tmp_path / "k.key")]) == 1
    assert main(["manifest", "sign", str(old), "--key", str(tmp_path / "k.key"), "--allow-expired"]) == 0


def test_cli_verify_rollback_state(tmp_path, capsys, keys):
    key = tmp_path / "k.key"
    key.write_bytes(keys[0])
    pub = tmp_path / "k.pub"
    pub.write_text(keys[1])
    future = (datetime.now(timezone.utc) + timedelta(days=9)).strftime("%Y-%m-%dT%H:%M:%SZ")
    m = tmp_path / "m.json"
    for version in (5, 4):
        m.write_bytes(manifest(version=version, expires=future))
        main(["manifest", "sign", str(m), "--key", str(key)])
        rc = main(["manifest", "verify", str(m), "--key", str(pub), "--only-keys", "--record"])
        assert rc == (0 if version == 5 else 1)
    assert "rollback" in capsys.readouterr().err
    assert main(["manifest", "verify", str(m), "--key", str(pub), "--no-rollback"]) == 0
    # the same watermark install uses: the home's, from Settings (ACCELSTACK_HOME here)
    state = Settings.resolve().rollback_state
    assert state == tmp_path / "home" / "state" / "manifest-versions.json"
    assert RollbackStore(state).highest("official") == 5
    with pytest.raises(ManifestRollbackError):
        TrustedManifests.from_settings(Settings.resolve(trusted_keys=[str(pub)])).verify(
            m.read_bytes(), (tmp_path / "m.json.sig").read_bytes())
    # --home names another home, with its own watermark
    other = tmp_path / "other-home"
    assert main(["manifest", "verify", str(m), "--key", str(pub), "--record", "--home", str(other)]) == 0
    assert RollbackStore(Settings.resolve(home=other).rollback_state).highest("official") == 4


def test_verify_reports_the_key_and_refuses_another_kind(keys, trust):
    data = manifest()
    result = checked(data, sign_manifest(data, keys[0]), trust)
    assert result.signed and result.keyid == keyid_of(base64.b64decode(keys[1]))
    assert result.manifest.targets[0].id == "cpu"
    trusted = TrustedManifests(keys=trust, include_package_keys=False, clock=lambda: NOW)
    assert trusted.load(data, sign_manifest(data, keys[0]), "m.json").package == "stable-diffusion.cpp"
    torch = manifest(kind="torch")
    with pytest.raises(ManifestFormatError, match="^m.json: kind: expected a ggml manifest"):
        trusted.load(torch, sign_manifest(torch, keys[0]), "m.json")


def test_recording_into_an_unwritable_state_dir_is_a_typed_error(tmp_path):
    """A read-only home: recording a version fails with a clear error, not an OSError traceback."""
    import os
    import subprocess

    from accelstack.errors import Action
    from accelstack.manifests.errors import ManifestStateError
    from accelstack.manifests.rollback import RollbackStore

    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:  # root ignores permission bits: a read-only mount is what a read-only home is
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(ro)], capture_output=True)
        if res.returncode != 0:
            pytest.skip("cannot mount a read-only tmpfs here")
    else:
        ro.chmod(0o500)
    try:
        store = RollbackStore(ro / "state" / "manifest-versions.json")
        with pytest.raises(ManifestStateError) as info:
            store.check("src", 3)
        assert "cannot record manifest versions" in info.value.message and info.value.action == Action.CHOOSE_HOME
        store.check("src", 3, record=False)  # only reading still works
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", "-l", str(ro)])


# -- hostile signatures and publisher inputs (issue 10) -------------------------------------------------
@pytest.mark.parametrize("sig", [
    b'{"format": "accelstack-signature", "signatures": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # was RecursionError
    b'{"format": "accelstack-signature", "signatures": [' + b"[" * 10 + b"]" * 10 + b"]}",
    b" " * (64 * 1024 + 1),
    json.dumps({"format": "accelstack-signature",
                "signatures": [{"keyid": "0" * 16, "sig": "A" * 88}] * 65}).encode(),
    json.dumps({"format": "accelstack-signature", "signatures": [{"keyid": "../../x\u0000", "sig": "AA=="}]}).encode(),
    json.dumps({"format": "accelstack-signature", "signatures": [{"keyid": "0" * 16, "sig": "A" * 100_000}]}).encode(),
])
def test_hostile_signature_files_are_signature_errors(trust, sig):
    with pytest.raises(ManifestSignatureError):
        verify(manifest(), sig, trust)


def test_deep_signature_is_a_signature_error_even_when_unsigned_is_allowed(trust):
    deep = b'{"format": "accelstack-signature", "signatures": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert verify(manifest(), deep, trust, insecure_unsigned=True)["keyid"] is None


def test_oversized_manifest_is_refused_before_its_signature_is_checked(keys, trust):
    from accelstack.limits import MAX_JSON_BYTES

    data = b" " * (MAX_JSON_BYTES + 1)
    with pytest.raises(ManifestFormatError, match="more than"):
        verify(data, sign_manifest(data[:10], keys[0]), trust)


def test_cli_sign_refuses_expires_at_the_ends_of_the_datetime_range(tmp_path, capsys):
    main(["manifest", "keygen", "--out", str(tmp_path / "k")])
    for expires in ("9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59"):
        m = tmp_path / "m.json"
        m.write_bytes(manifest(expires=expires))
        for extra in ([], ["--allow-expired"]):  # was OverflowError in both
            capsys.readouterr()
            assert main(["manifest", "sign", str(m), "--key", str(tmp_path / "k.key"), *extra]) == 1
            assert "expires:" in capsys.readouterr().err
        assert not (tmp_path / "m.json.sig").exists()


def test_cli_sign_and_verify_refuse_non_regular_files(tmp_path, capsys):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this OS")
    main(["manifest", "keygen", "--out", str(tmp_path / "k")])
    fifo = tmp_path / "m.json"
    os.mkfifo(fifo)
    assert main(["manifest", "sign", str(fifo), "--key", str(tmp_path / "k.key")]) == 1
    assert "not a regular file" in capsys.readouterr().err
    assert main(["manifest", "verify", str(fifo)]) == 1
    good = tmp_path / "good.json"
    good.write_bytes(manifest())
    assert main(["manifest", "sign", str(good), "--key", str(fifo)]) == 2
    assert "cannot read private key" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--expires-days", "99999999999"], "--expires-days must be"),  # was OverflowError in timedelta
    (["--expires-days", "0"], "--expires-days must be"),
    (["--source", "a/b"], "--source"),
    (["--version", "-1"], "--version must be"),
])
def test_cli_build_refuses_out_of_range_options(tmp_path, capsys, args, message):
    assert main(["manifest", "build", str(tmp_path), "--base-url", "https://x/", "--version", "1", *args]) == 2
    assert message in capsys.readouterr().err
