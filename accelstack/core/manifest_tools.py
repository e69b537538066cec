"""The publisher's signing tools: an Ed25519 key pair, a manifest's signature, and the check a
user's accelstack makes before it trusts a manifest (``accelstack manifest keygen | sign | verify``).

Keys and signatures are written whole (:mod:`accelstack.fsio`): the private key is created
readable by its owner only, and an interrupted write leaves the old file.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from ..errors import UsageError
from ..fsio import write_bytes, write_text
from ..limits import MAX_SIGNATURE_BYTES
from ..manifests.envelope import Envelope, check_envelope
from ..manifests.errors import ManifestError, ManifestKeyError
from ..manifests.fields import check_id, decode, read_document
from ..manifests.keys import generate_keypair, keyid_of, parse_public_key, public_raw_of_private
from ..manifests.signatures import read_manifest_files, sign_manifest, signature_path
from ..manifests.trust import TrustedManifests, VerifiedManifest
from ..settings import Settings

__all__ = ["KeyPair", "Signed", "Verified", "keygen", "read_private_key", "check_source", "sign", "verify"]


@dataclass
class KeyPair:
    keyid: str
    private_key: Path  # PKCS#8 PEM, mode 0600
    public_key: Path  # base64 of the raw 32-byte key, with a comment line


@dataclass
class Signed:
    manifest: Path
    signature: Path
    keyid: str
    envelope: Envelope


@dataclass
class Verified:
    manifest: Path
    result: VerifiedManifest
    signer: str  # "key ID (origin)", or that no trusted key signed it


def keygen(prefix: Path, *, force: bool = False) -> KeyPair:
    """Write ``PREFIX.key`` (secret, mode 0600) and ``PREFIX.pub``; existing files only with ``force``."""
    key_path = prefix.with_name(prefix.name + ".key")
    pub_path = prefix.with_name(prefix.name + ".pub")
    for path in (key_path, pub_path):
        if path.exists() and not force:
            raise UsageError(f"{path} already exists", "pass --force to overwrite it, or choose another --out")
    key_path.parent.mkdir(parents=True, exist_ok=True)
    private_pem, public_b64 = generate_keypair()
    write_bytes(key_path, private_pem, mode=0o600)
    kid = keyid_of(parse_public_key(public_b64))
    write_text(pub_path, f"# accelstack manifest signing key {kid}\n{public_b64}\n", encoding="ascii")
    return KeyPair(kid, key_path, pub_path)


def read_private_key(path: str) -> bytes:
    """The PEM private key at ``path``; a usage error when it cannot be read."""
    try:
        return read_document(path, MAX_SIGNATURE_BYTES)
    except (OSError, ManifestError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) else exc.message
        raise UsageError(f"cannot read private key {path} ({detail or exc})") from None


def check_source(name: str, option: str = "--source") -> str:
    """A manifest source (the channel name users' rollback protection tracks), or a usage error."""
    try:
        return check_id(name, option, "source (channel name)")
    except ManifestError as exc:
        raise UsageError(exc.message) from None


def sign(manifest: Path, key: str, *, out: Optional[Path] = None, replace: bool = False,
         allow_expired: bool = False) -> Signed:
    """Check ``manifest``'s envelope, then write its signature by the private key file ``key``
    (other keys' signatures in an existing one are kept unless ``replace``)."""
    data, _ = read_manifest_files(manifest)
    envelope = check_envelope(decode(data), check_expiry=not allow_expired)
    private_pem = read_private_key(key)
    target = out if out is not None else signature_path(manifest)
    existing: Optional[bytes] = None
    if target.exists() and not replace:
        try:
            existing = read_document(target, MAX_SIGNATURE_BYTES)
        except (OSError, ManifestError):
            existing = None  # an unreadable old .sig is replaced
    try:
        sig = sign_manifest(data, private_pem, existing)
    except ManifestError:
        if existing is None:
            raise
        sig = sign_manifest(data, private_pem)  # an unreadable old .sig is replaced
    write_bytes(target, sig)
    return Signed(manifest, target, keyid_of(public_raw_of_private(private_pem)), envelope)


def verify(manifest: Path, settings: Settings, *, sig: Optional[str] = None, keys: Sequence[str] = (),
           only_keys: bool = False, insecure_unsigned: bool = False, rollback: bool = True,
           record: bool = False) -> Verified:
    """Check ``manifest`` as an install would: its signature (the shipped keys, the user's
    trusted-keys directory and ``keys``; only ``keys`` with ``only_keys``), envelope, expiry and,
    with ``rollback``, that its version is not older than one already seen (``record`` raises
    that watermark)."""
    data, signature = read_manifest_files(manifest)
    if sig:
        try:
            signature = read_document(sig, MAX_SIGNATURE_BYTES)
        except OSError as exc:
            raise UsageError(f"cannot read signature {sig} ({exc.strerror or exc})") from None
    if only_keys and not keys:
        raise UsageError("--only-keys needs at least one --key")
    key_paths: List[Path] = [Path(k) for k in keys]
    try:
        trusted = TrustedManifests(
            keys=key_paths,
            user_keys_dir=None if only_keys else settings.user_keys_dir,
            include_package_keys=not only_keys,
            rollback_state=settings.rollback_state if rollback else None,
            insecure_unsigned=insecure_unsigned,
        )
    except ManifestKeyError as exc:
        raise UsageError(exc.message, exc.hint) from None
    result = trusted.verify(data, signature, str(manifest), record=record)
    key = trusted.trust.get(result.keyid) if result.keyid else None
    signer = f"key {result.keyid} ({key.origin})" if key else "NO trusted signature (--insecure-unsigned)"
    return Verified(manifest, result, signer)
