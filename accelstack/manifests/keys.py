"""Ed25519 keys and the trust store: which publishers' signatures accelstack accepts.

``keyid`` is the first 16 hex digits of the sha256 of the raw 32-byte public key. A public key
file (``*.pub``) holds the base64 of the raw 32-byte key (lines starting with ``#`` are
comments). A private key is PEM (PKCS#8), kept with mode 0600.

``cryptography`` (9 ms to import) is imported in one place, :func:`_crypto`, when a key is first
used, so reading or making a plan without a signed manifest never loads it.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

from .errors import ManifestFormatError, ManifestKeyError
from .fields import read_document

__all__ = ["MAX_KEY_FILE_BYTES", "PACKAGE_KEYS_DIR", "TrustStore", "TrustedKey", "generate_keypair", "keyid_of",
           "load_private_key", "parse_public_key", "public_raw_of_private"]

PACKAGE_KEYS_DIR = Path(__file__).resolve().parent / "keys"
MAX_KEY_FILE_BYTES = 16 * 1024  # a .pub file is one base64 line and a few comments


def _crypto() -> Any:
    """The ``cryptography`` package with its Ed25519, serialization and exceptions modules loaded:
    the one import of a heavy library only signing and signature checks need."""
    import cryptography.exceptions
    import cryptography.hazmat.primitives.asymmetric.ed25519
    import cryptography.hazmat.primitives.serialization

    return cryptography


def _ed25519() -> Any:
    return _crypto().hazmat.primitives.asymmetric.ed25519


def _serialization() -> Any:
    return _crypto().hazmat.primitives.serialization


def keyid_of(public_raw: bytes) -> str:
    """The key id: first 16 hex digits of sha256 of the raw 32-byte public key."""
    return hashlib.sha256(public_raw).hexdigest()[:16]


def generate_keypair() -> Tuple[bytes, str]:
    """A new Ed25519 key pair: (private key as PKCS#8 PEM, public key as base64 of the raw 32 bytes)."""
    serialization = _serialization()
    private = _ed25519().Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return pem, base64.b64encode(raw).decode("ascii")


def load_private_key(private_pem: bytes) -> Any:
    try:
        key = _serialization().load_pem_private_key(private_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise ManifestKeyError(f"not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, _ed25519().Ed25519PrivateKey):
        raise ManifestKeyError(f"the private key is {type(key).__name__}, not Ed25519")
    return key


def public_raw_of_private(private_pem: bytes) -> bytes:
    serialization = _serialization()
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


@dataclass
class TrustedKey:
    keyid: str
    raw: bytes
    origin: str  # "package", "user:<path>", "explicit"

    def verifier(self) -> Any:
        return _ed25519().Ed25519PublicKey.from_public_bytes(self.raw)

    def verifies(self, signature: bytes, data: bytes) -> bool:
        """Whether ``signature`` is this key's valid Ed25519 signature of ``data``."""
        try:
            self.verifier().verify(signature, data)
        except _crypto().exceptions.InvalidSignature:
            return False
        return True


class TrustStore:
    """The public keys whose signatures are accepted.

    The keys shipped in ``accelstack/manifests/keys/*.pub`` (unless ``include_package`` is false:
    tests, or a publisher checking against one key), the ``*.pub`` files in ``user_dir`` (the
    user's trusted-keys directory, ``Settings.user_keys_dir``; ``None``: none), and ``keys`` given
    here: base64 text, the raw 32 bytes, or ``Path``s of ``.pub`` files.
    """

    def __init__(
        self,
        keys: Iterable[Union[str, bytes, Path]] = (),
        *,
        user_dir: Union[str, Path, None] = None,
        include_package: bool = True,
        package_dir: Union[str, Path, None] = None,
    ) -> None:
        self._keys: Dict[str, TrustedKey] = {}
        if include_package:
            self.add_dir(Path(package_dir) if package_dir is not None else PACKAGE_KEYS_DIR, "package")
        if user_dir is not None:
            self.add_dir(Path(user_dir), "user")
        for key in keys:
            if isinstance(key, Path):
                self.add_file(key, "explicit")
            else:
                self.add(key, "explicit")

    @staticmethod
    def key_arg(text: str) -> Union[str, Path]:
        """A key as the user wrote it: a path when it names a ``.pub`` file, else base64 text."""
        return Path(text) if text.endswith(".pub") else text

    def add(self, key: Union[str, bytes], origin: str = "explicit") -> str:
        """Trust ``key`` (base64 text, or the raw 32 bytes); return its key id."""
        raw = key if isinstance(key, bytes) and len(key) == 32 else parse_public_key(key)
        kid = keyid_of(raw)
        self._keys.setdefault(kid, TrustedKey(kid, raw, origin))
        return kid

    def add_file(self, path: Union[str, Path], origin: str = "explicit") -> str:
        path = Path(path)
        try:
            text = read_document(path, MAX_KEY_FILE_BYTES).decode("ascii")
        except (OSError, UnicodeDecodeError, ManifestFormatError) as exc:
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
