"""Signatures of manifests: the ``.sig`` document beside a manifest, made and checked.

The signed bytes are the manifest file's exact bytes. The signature travels beside it as
``<manifest>.sig``::

    {"format": "accelstack-signature",
     "signatures": [{"keyid": "<16 hex>", "sig": "<base64 Ed25519 signature of the manifest bytes>"}]}

Several publishers may co-sign one manifest; any trusted key's valid signature is enough.
"""
from __future__ import annotations

import base64
import binascii
import json
import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

from ..errors import Action
from ..limits import MAX_JSON_BYTES, MAX_SIGNATURE_BYTES, MAX_SIGNATURES, MalformedInput, parse_json
from .errors import ManifestError, ManifestSignatureError
from .fields import read_document
from .keys import TrustStore, keyid_of, load_private_key, public_raw_of_private

__all__ = ["KEYID", "MAX_SIG_TEXT", "SIGNATURE_FORMAT", "SIG_SUFFIX", "parse_signature", "read_manifest_files",
           "sign_manifest", "signature_path", "trusted_signers", "verify_signature"]

SIGNATURE_FORMAT = "accelstack-signature"
SIG_SUFFIX = ".sig"
KEYID = re.compile(r"^[0-9a-f]{16}\Z")
MAX_SIG_TEXT = 256  # base64 of a 64-byte Ed25519 signature is 88 characters


def sign_manifest(data: bytes, private_pem: bytes, existing: Optional[bytes] = None) -> bytes:
    """The ``.sig`` document for ``data`` signed with ``private_pem``.

    With ``existing`` (a current ``.sig``), its other keys' entries are kept and this key's entry
    is replaced: several publishers can co-sign one manifest.
    """
    key = load_private_key(private_pem)
    kid = keyid_of(public_raw_of_private(private_pem))
    entries: List[Dict[str, str]] = []
    if existing:
        entries = [e for e in parse_signature(existing) if e["keyid"] != kid]
    entries.append({"keyid": kid, "sig": base64.b64encode(key.sign(data)).decode("ascii")})
    doc = {"format": SIGNATURE_FORMAT, "signatures": entries}
    return (json.dumps(doc, indent=2) + "\n").encode("utf-8")


def parse_signature(signature: bytes) -> List[Dict[str, str]]:
    """The entries of a ``.sig`` document; raise :class:`ManifestSignatureError` if malformed."""
    # Anyone who serves the manifest can serve its .sig, no key needed: bounded before parsing.
    try:
        doc = parse_json(signature, what="signature file", max_bytes=MAX_SIGNATURE_BYTES, max_depth=4)
    except MalformedInput as exc:
        raise ManifestSignatureError(exc.message, "download the manifest and its signature again") from None
    if not isinstance(doc, dict) or doc.get("format") != SIGNATURE_FORMAT:
        raise ManifestSignatureError(f"signature file: 'format' must be {SIGNATURE_FORMAT!r}")
    entries = doc.get("signatures")
    if not isinstance(entries, list):
        raise ManifestSignatureError("signature file: 'signatures' must be a list")
    if len(entries) > MAX_SIGNATURES:
        raise ManifestSignatureError(f"signature file: {len(entries)} signatures, more than the {MAX_SIGNATURES} accepted")
    out = []
    for i, entry in enumerate(entries):
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("keyid"), str)
            or not isinstance(entry.get("sig"), str)
        ):
            raise ManifestSignatureError(f"signature file: signatures[{i}] needs string 'keyid' and 'sig'")
        if not KEYID.match(entry["keyid"]):
            raise ManifestSignatureError(f"signature file: signatures[{i}].keyid is not 16 lowercase hex digits")
        if len(entry["sig"]) > MAX_SIG_TEXT:
            raise ManifestSignatureError(f"signature file: signatures[{i}].sig is too long for an Ed25519 signature")
        out.append({"keyid": entry["keyid"], "sig": entry["sig"]})
    return out


def verify_signature(data: bytes, signature: Optional[bytes], trust: TrustStore) -> str:
    """The key id of a trusted key whose valid signature of ``data`` is in ``signature``.

    Raise :class:`ManifestSignatureError` if the manifest is unsigned, signed only by untrusted
    keys, or if no trusted signature matches the bytes (tampering).
    """
    if signature is None:
        raise ManifestSignatureError(
            "the manifest is not signed (no .sig file beside it)",
            "get the manifest from its publisher; accept unsigned manifests only from a mirror you control",
            action=Action.ALLOW_UNSIGNED,
        )
    entries = parse_signature(signature)
    if not entries:
        raise ManifestSignatureError("the signature file holds no signature")
    tried: List[str] = []
    for entry in entries:
        key = trust.get(entry["keyid"])
        if key is None:
            continue
        tried.append(entry["keyid"])
        try:
            sig = base64.b64decode(entry["sig"], validate=True)
        except (binascii.Error, ValueError):
            continue
        if key.verifies(sig, data):
            return key.keyid
    if tried:
        raise ManifestSignatureError(
            f"the manifest does not match its signature by trusted key {', '.join(tried)}: "
            "it was modified after signing, or is corrupt",
            "download the manifest again from its publisher",
            action=Action.RETRY,
        )
    signed_by = ", ".join(e["keyid"] for e in entries)
    raise ManifestSignatureError(
        f"the manifest is signed by key {signed_by}, which is not trusted (trusted: {', '.join(trust.keyids) or 'none'})",
        "trust the publisher's public key (put it in the trusted-keys directory) if you trust the publisher",
        action=Action.TRUST_KEY,
    )


def trusted_signers(data: bytes, signature: Optional[bytes], trust: TrustStore) -> List[str]:
    """Every trusted key whose valid signature of ``data`` is in ``signature`` (a co-signed
    manifest raises the rollback watermark of each of its signers, so dropping one key during a
    rotation keeps what the other saw)."""
    if signature is None:
        return []
    out: List[str] = []
    for entry in parse_signature(signature):
        key = trust.get(entry["keyid"])
        if key is None or key.keyid in out:
            continue
        try:
            sig = base64.b64decode(entry["sig"], validate=True)
        except (binascii.Error, ValueError):
            continue
        if key.verifies(sig, data):
            out.append(key.keyid)
    return out


def signature_path(manifest_path: Union[str, Path]) -> Path:
    """Where a manifest's signature lives: ``<manifest file name>.sig`` beside it."""
    p = Path(manifest_path)
    return p.with_name(p.name + SIG_SUFFIX)


def read_manifest_files(manifest_path: Union[str, Path]) -> Tuple[bytes, Optional[bytes]]:
    """The manifest's bytes and its signature's (``None`` if there is no ``.sig``)."""
    p = Path(manifest_path)
    try:
        data = read_document(p, MAX_JSON_BYTES)
    except OSError as exc:
        raise ManifestError(f"cannot read manifest {p} ({exc.strerror or exc})", "check the path",
                            action=Action.FIX_INPUT, exit_code=2) from None
    try:
        sig: Optional[bytes] = read_document(signature_path(p), MAX_SIGNATURE_BYTES)
    except FileNotFoundError:
        sig = None
    except OSError as exc:
        raise ManifestError(f"cannot read signature {signature_path(p)} ({exc.strerror or exc})") from None
    return data, sig
