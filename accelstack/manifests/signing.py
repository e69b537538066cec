"""Signed manifests: Ed25519 signatures, a trust store, rollback and expiry protection.

A manifest is a JSON file; the signed bytes are the file's exact bytes. Its envelope (checked
here; the body is the schema's business)::

    {"format": "accelstack-manifest", "format_version": 1, "source": "official",
     "version": 42, "expires": "2027-06-01T00:00:00Z", "kind": "ggml", ...}

The signature travels beside it as ``<manifest>.sig``::

    {"format": "accelstack-signature",
     "signatures": [{"keyid": "<16 hex>", "sig": "<base64 Ed25519 signature of the manifest bytes>"}]}

``keyid`` is the first 16 hex digits of the sha256 of the raw 32-byte public key. A public key
file (``*.pub``) holds the base64 of the raw 32-byte key (lines starting with ``#`` are comments).
A private key is PEM (PKCS#8), kept with mode 0600.

:func:`verify_manifest` is the one entry point: signature, then envelope, then expiry, then
rollback. See ``docs/artifacts.md`` for the publisher workflow.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import tempfile
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple, Union

from .errors import (
    ManifestError,
    ManifestExpiredError,
    ManifestFormatError,
    ManifestKeyError,
    ManifestRollbackError,
    ManifestSignatureError,
)

MANIFEST_FORMAT = "accelstack-manifest"
SIGNATURE_FORMAT = "accelstack-signature"
STATE_FORMAT = "accelstack-manifest-versions"
SUPPORTED_FORMAT_VERSIONS = (1,)
SIG_SUFFIX = ".sig"
HOME_ENV = "ACCELSTACK_HOME"
PACKAGE_KEYS_DIR = Path(__file__).resolve().parent / "keys"



# -- keys -----------------------------------------------------------------------------------
def _ed25519():
    from cryptography.hazmat.primitives.asymmetric import ed25519

    return ed25519


def keyid_of(public_raw: bytes) -> str:
    """The key id: first 16 hex digits of sha256 of the raw 32-byte public key."""
    return hashlib.sha256(public_raw).hexdigest()[:16]


def generate_keypair() -> Tuple[bytes, str]:
    """A new Ed25519 key pair: (private key as PKCS#8 PEM, public key as base64 of the raw 32 bytes)."""
    from cryptography.hazmat.primitives import serialization

    private = _ed25519().Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return pem, base64.b64encode(raw).decode("ascii")


def load_private_key(private_pem: bytes):
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_private_key(private_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise ManifestKeyError(f"not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, _ed25519().Ed25519PrivateKey):
        raise ManifestKeyError(f"the private key is {type(key).__name__}, not Ed25519")
    return key


def public_raw_of_private(private_pem: bytes) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return load_private_key(private_pem).public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )


def parse_public_key(text: Union[str, bytes], where: str = "public key") -> bytes:
    """The raw 32 bytes of a public key written as base64 (``#`` lines are comments)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("ascii")
        except UnicodeDecodeError:
            raise ManifestKeyError(f"{where}: not base64 text") from None
    body = "".join(line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#"))
    try:
        raw = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise ManifestKeyError(f"{where}: not valid base64") from None
    if len(raw) != 32:
        raise ManifestKeyError(f"{where}: an Ed25519 public key has 32 bytes, this one has {len(raw)}")
    return raw


def default_user_keys_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_config_dir("accelstack")) / "trusted-keys"


@dataclass
class TrustedKey:
    keyid: str
    raw: bytes
    origin: str  # "package", "user:<path>", "explicit"

    def verifier(self):
        return _ed25519().Ed25519PublicKey.from_public_bytes(self.raw)


class TrustStore:
    """The public keys whose signatures are accepted.

    By default: the keys shipped in ``accelstack/manifests/keys/*.pub``, plus the user's in
    ``<user config dir>/trusted-keys/*.pub``, plus ``keys`` given here (base64 text, raw 32
    bytes, or ``Path``s of ``.pub`` files). ``include_package`` / ``include_user`` turn the first
    two off (tests, or a publisher checking against one key).
    """

    def __init__(
        self,
        keys: Iterable[Union[str, bytes, Path]] = (),
        *,
        include_package: bool = True,
        include_user: bool = True,
        user_dir: Union[str, Path, None] = None,
        package_dir: Union[str, Path, None] = None,
    ) -> None:
        self._keys: Dict[str, TrustedKey] = {}
        if include_package:
            self.add_dir(Path(package_dir) if package_dir is not None else PACKAGE_KEYS_DIR, "package")
        if include_user:
            self.add_dir(Path(user_dir) if user_dir is not None else default_user_keys_dir(), "user")
        for key in keys:
            if isinstance(key, Path):
                self.add_file(key, "explicit")
            else:
                self.add(key, "explicit")

    def add(self, key: Union[str, bytes], origin: str = "explicit") -> str:
        """Trust ``key`` (base64 text, or the raw 32 bytes); return its key id."""
        raw = key if isinstance(key, bytes) and len(key) == 32 else parse_public_key(key)
        kid = keyid_of(raw)
        self._keys.setdefault(kid, TrustedKey(kid, raw, origin))
        return kid

    def add_file(self, path: Union[str, Path], origin: str = "explicit") -> str:
        path = Path(path)
        try:
            text = path.read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError) as exc:
            raise ManifestKeyError(f"cannot read public key {path} ({exc})") from None
        raw = parse_public_key(text, str(path))
        kid = keyid_of(raw)
        self._keys.setdefault(kid, TrustedKey(kid, raw, f"{origin}:{path}"))
        return kid

    def add_dir(self, directory: Path, origin: str) -> None:
        if not directory.is_dir():
            return
        for path in sorted(directory.glob("*.pub")):
            self.add_file(path, origin)

    def get(self, keyid: str) -> Optional[TrustedKey]:
        return self._keys.get(keyid)

    def __contains__(self, keyid: object) -> bool:
        return keyid in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def keyids(self) -> List[str]:
        return sorted(self._keys)

    def describe(self) -> str:
        return ", ".join(f"{k.keyid} ({k.origin})" for k in self._keys.values()) or "none"


# -- signing ---------------------------------------------------------------------------------
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
    try:
        doc = json.loads(signature.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestSignatureError(f"signature file is not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != SIGNATURE_FORMAT:
        raise ManifestSignatureError(f"signature file: 'format' must be {SIGNATURE_FORMAT!r}")
    entries = doc.get("signatures")
    if not isinstance(entries, list):
        raise ManifestSignatureError("signature file: 'signatures' must be a list")
    out = []
    for i, entry in enumerate(entries):
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("keyid"), str)
            or not isinstance(entry.get("sig"), str)
        ):
            raise ManifestSignatureError(f"signature file: signatures[{i}] needs string 'keyid' and 'sig'")
        out.append({"keyid": entry["keyid"], "sig": entry["sig"]})
    return out


def verify_signature(data: bytes, signature: Optional[bytes], trust: TrustStore) -> str:
    """The key id of a trusted key whose valid signature of ``data`` is in ``signature``.

    Raise :class:`ManifestSignatureError` if the manifest is unsigned, signed only by untrusted
    keys, or if no trusted signature matches the bytes (tampering).
    """
    from cryptography.exceptions import InvalidSignature

    if signature is None:
        raise ManifestSignatureError(
            "the manifest is not signed (no .sig file beside it)",
            "get the manifest from its publisher; for a local mirror you control, pass --insecure-unsigned",
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
        try:
            key.verifier().verify(sig, data)
            return key.keyid
        except InvalidSignature:
            continue
    if tried:
        raise ManifestSignatureError(
            f"the manifest does not match its signature by trusted key {', '.join(tried)}: "
            "it was modified after signing, or is corrupt",
            "download the manifest again from its publisher",
        )
    signed_by = ", ".join(e["keyid"] for e in entries)
    raise ManifestSignatureError(
        f"the manifest is signed by key {signed_by}, which is not trusted (trusted: {', '.join(trust.keyids) or 'none'})",
        "add the publisher's public key to the trusted-keys directory if you trust it",
    )


# -- envelope -----------------------------------------------------------------------------------
_ISO = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:\d{2})$")


def parse_expires(value: str) -> datetime:
    """Parse an ISO-8601 date-time with a time zone (``Z`` or an offset) into aware UTC."""
    if not isinstance(value, str) or not _ISO.match(value):
        raise ValueError(f"{value!r} is not an ISO-8601 date-time with a time zone, e.g. 2027-06-01T00:00:00Z")
    text = value[:-1] + "+00:00" if value.endswith("Z") else value
    return datetime.fromisoformat(text).astimezone(timezone.utc)


def _require(doc: dict, name: str, kind: type, what: str):
    if name not in doc:
        raise ManifestFormatError(f"manifest field '{name}' is missing")
    value = doc[name]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ManifestFormatError(f"manifest field '{name}' must be {what}, got {value!r}")
    if kind is str and not isinstance(value, str):
        raise ManifestFormatError(f"manifest field '{name}' must be {what}, got {value!r}")
    return value


def parse_envelope(data: bytes) -> dict:
    """Parse the manifest and check its envelope (not signature, expiry or rollback)."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ManifestFormatError(f"manifest is not UTF-8 ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ManifestFormatError(f"manifest is not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ManifestFormatError(f"manifest must be a JSON object, got {type(doc).__name__}")
    fmt = _require(doc, "format", str, "a string")
    if fmt != MANIFEST_FORMAT:
        raise ManifestFormatError(f"manifest field 'format' must be {MANIFEST_FORMAT!r}, got {fmt!r}")
    fv = _require(doc, "format_version", int, "an integer")
    if fv not in SUPPORTED_FORMAT_VERSIONS:
        raise ManifestFormatError(
            f"manifest field 'format_version' is {fv}; this accelstack reads "
            f"{', '.join(map(str, SUPPORTED_FORMAT_VERSIONS))}",
            "upgrade accelstack" if fv > max(SUPPORTED_FORMAT_VERSIONS) else None,
        )
    source = _require(doc, "source", str, "a non-empty string")
    if not source.strip():
        raise ManifestFormatError("manifest field 'source' must be a non-empty string")
    version = _require(doc, "version", int, "an integer")
    if version < 0:
        raise ManifestFormatError(f"manifest field 'version' must be >= 0, got {version}")
    expires = _require(doc, "expires", str, "an ISO-8601 UTC date-time string")
    try:
        parse_expires(expires)
    except ValueError as exc:
        raise ManifestFormatError(f"manifest field 'expires': {exc}") from None
    kind = _require(doc, "kind", str, "a string")
    if not kind:
        raise ManifestFormatError("manifest field 'kind' must be a non-empty string")
    return doc


def check_expiry(doc: dict, now: Optional[datetime] = None) -> None:
    now = now or datetime.now(timezone.utc)
    if now.tzinfo is None:
        now = now.replace(tzinfo=timezone.utc)
    expires = parse_expires(doc["expires"])
    if now >= expires:
        raise ManifestExpiredError(
            f"manifest '{doc['source']}' version {doc['version']} expired on {doc['expires']}",
            "fetch a current manifest from the publisher (an expired one may hide known-bad files); "
            "check the system clock",
        )


# -- rollback -----------------------------------------------------------------------------------
def default_state_path() -> Path:
    """``$ACCELSTACK_HOME/state/manifest-versions.json``, else in the user data dir."""
    home = os.environ.get(HOME_ENV)
    if home:
        base = Path(home).expanduser()
    else:
        import platformdirs

        base = Path(platformdirs.user_data_dir("accelstack"))
    return base / "state" / "manifest-versions.json"


class RollbackStore:
    """The highest manifest version seen per source, in a small JSON file (atomic writes, locked)."""

    _thread_lock = threading.Lock()

    def __init__(self, path: Union[str, Path, None] = None) -> None:
        self.path = Path(path) if path is not None else default_state_path()

    def __repr__(self) -> str:
        return f"RollbackStore({str(self.path)!r})"

    def _read(self) -> Dict[str, int]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise ManifestError(f"cannot read manifest version state {self.path} ({exc})") from None
        try:
            doc = json.loads(text)
            versions = doc["sources"]
            if doc.get("format") != STATE_FORMAT or not isinstance(versions, dict):
                raise ValueError("unexpected layout")
            out = {}
            for source, entry in versions.items():
                v = entry["version"] if isinstance(entry, dict) else entry
                if isinstance(v, bool) or not isinstance(v, int):
                    raise ValueError(f"version of {source!r} is not an integer")
                out[source] = v
            return out
        except (ValueError, KeyError, TypeError) as exc:
            # Refusing is safer than silently forgetting what was seen (that would allow a rollback).
            raise ManifestError(
                f"manifest version state {self.path} is corrupt ({exc})",
                "delete the file to start over (rollback protection restarts from the next manifest)",
            ) from None

    def _write(self, versions: Dict[str, int]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"format": STATE_FORMAT, "sources": {s: {"version": v} for s, v in sorted(versions.items())}}
        fd, tmp = tempfile.mkstemp(prefix=".manifest-versions.", suffix=".tmp", dir=str(self.path.parent))
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(doc, fh, indent=2)
                fh.write("\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def _lock(self):
        import filelock

        self.path.parent.mkdir(parents=True, exist_ok=True)
        return filelock.FileLock(str(self.path) + ".lock")

    def highest(self, source: str) -> Optional[int]:
        return self._read().get(source)

    def check(self, source: str, version: int, *, record: bool = True) -> None:
        """Refuse ``version`` if lower than the highest seen for ``source``; with ``record``,
        remember it as the highest if it is."""
        with self._thread_lock, self._lock():
            versions = self._read()
            seen = versions.get(source)
            if seen is not None and version < seen:
                raise ManifestRollbackError(
                    f"manifest '{source}' version {version} is older than version {seen} already seen (rollback)",
                    "someone may be serving an outdated manifest; get the current one from the publisher",
                )
            if record and (seen is None or version > seen):
                versions[source] = version
                self._write(versions)


# -- the entry point ---------------------------------------------------------------------------
@dataclass
class VerifiedManifest:
    data: dict
    keyid: Optional[str]  # the trusted key that signed it; None when accepted unsigned
    signed: bool


def check_manifest(
    data: bytes,
    signature: Optional[bytes],
    *,
    trust: TrustStore,
    rollback: Optional[RollbackStore] = None,
    insecure_unsigned: bool = False,
    now: Optional[datetime] = None,
    record: bool = True,
) -> VerifiedManifest:
    """:func:`verify_manifest`, also saying which key signed it."""
    keyid: Optional[str] = None
    if insecure_unsigned:
        # Accepted on the user's word: still check what can be checked. The signature is
        # reported when it happens to be valid, but an unverified manifest never raises the
        # rollback watermark (it could otherwise lock out genuine updates).
        if signature is not None:
            try:
                keyid = verify_signature(data, signature, trust)
            except ManifestSignatureError:
                keyid = None
    else:
        keyid = verify_signature(data, signature, trust)
    doc = parse_envelope(data)
    check_expiry(doc, now)
    if rollback is not None:
        rollback.check(doc["source"], doc["version"], record=record and keyid is not None)
    return VerifiedManifest(doc, keyid, keyid is not None)


def verify_manifest(
    data: bytes,
    signature: Optional[bytes],
    *,
    trust: TrustStore,
    rollback: Optional[RollbackStore] = None,
    insecure_unsigned: bool = False,
    now: Optional[datetime] = None,
    record: bool = True,
) -> dict:
    """Verify a manifest and return it parsed.

    In order: a trusted Ed25519 signature (unless ``insecure_unsigned``, for a local mirror);
    the envelope (``format``, ``format_version``, ``source``, ``version``, ``expires``, ``kind``);
    not expired at ``now``; not older than the highest version seen from its ``source``
    (``rollback``), which is then raised to this version (unless ``record`` is false, or the
    manifest was accepted without a valid signature).

    Raises :class:`ManifestSignatureError`, :class:`ManifestFormatError`,
    :class:`ManifestExpiredError` or :class:`ManifestRollbackError`.
    """
    return check_manifest(
        data, signature, trust=trust, rollback=rollback, insecure_unsigned=insecure_unsigned, now=now, record=record
    ).data


def signature_path(manifest_path: Union[str, Path]) -> Path:
    """Where a manifest's signature lives: ``<manifest file name>.sig`` beside it."""
    p = Path(manifest_path)
    return p.with_name(p.name + SIG_SUFFIX)


def read_manifest_files(manifest_path: Union[str, Path]) -> Tuple[bytes, Optional[bytes]]:
    """The manifest's bytes and its signature's (``None`` if there is no ``.sig``)."""
    p = Path(manifest_path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ManifestError(f"cannot read manifest {p} ({exc.strerror or exc})") from None
    try:
        sig: Optional[bytes] = signature_path(p).read_bytes()
    except FileNotFoundError:
        sig = None
    except OSError as exc:
        raise ManifestError(f"cannot read signature {signature_path(p)} ({exc.strerror or exc})") from None
    return data, sig
