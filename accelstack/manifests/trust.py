"""``TrustedManifests``: the one place a manifest from elsewhere becomes knowledge the resolver uses.

    trusted = TrustedManifests.from_settings(settings)
    data, sig = <fetched by the caller: accelstack.artifacts.documents>
    manifest = trusted.load(data, sig, url)          # a verified GgmlManifest

In order, for the exact bytes fetched: a trusted Ed25519 signature in the ``.sig`` document
(unless ``insecure_unsigned``, for a mirror the user controls); the envelope (format, format
version, source, version, kind); not expired by the clock; not older than the highest version
already seen (rollback: per channel and signing key, the channel bound to its source, see
:mod:`~accelstack.manifests.rollback`); then the body of its kind.

The rollback watermark of a source is raised to the manifest's version only when its signature
was verified by a trusted key and the caller asked to ``record`` (the default). A manifest
accepted without a valid signature is still checked against the watermark but never raises it:
an unsigned document could otherwise lock out genuine updates.

Fetching is the caller's job (this package may not import ``artifacts``): the class takes bytes,
so it is tested without a network, and a local file and a URL are checked the same way.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterable, Optional, Union

from ..domain import Stack
from ..limits import MAX_JSON_BYTES, too_large
from ..settings import Settings
from .envelope import Envelope, check_envelope, utcnow
from .errors import ManifestError, ManifestFormatError, ManifestSignatureError
from .fields import decode
from .ggml_manifest import GgmlManifest
from .keys import TrustStore
from .rollback import RollbackStore, source_channel
from .schema import AnyManifest, parse_body
from .signatures import trusted_signers, verify_signature

__all__ = ["Clock", "TrustedManifests", "VerifiedManifest"]

Clock = Callable[[], datetime]


@dataclass
class VerifiedManifest:
    """A manifest that passed every check, with who signed it."""

    manifest: AnyManifest
    url: str  # where it came from, as the caller named it
    keyid: Optional[str]  # the trusted key that signed it; None when accepted unsigned

    @property
    def signed(self) -> bool:
        return self.keyid is not None

    @property
    def envelope(self) -> Envelope:
        return self.manifest.envelope


class TrustedManifests:
    """Signature, envelope, expiry and rollback checks for manifests, with explicit trust inputs.

    ``keys``: extra trusted public keys (base64 text, raw bytes, or paths of ``.pub`` files; a
    string ending in ``.pub`` is read as a path). ``user_keys_dir``: the user's trusted-keys
    directory (``None``: none). The keys shipped with accelstack are trusted too unless
    ``include_package_keys`` is false. ``rollback_state``: the file of highest versions seen
    (``None``: no rollback check, e.g. for a publisher inspecting an old release).
    ``insecure_unsigned`` accepts manifests without a valid trusted signature (a mirror the user
    controls). ``clock`` gives the current time (tests set it). ``channel`` names the channel the
    manifest is read for: its rollback state is that channel's, per key (``None``: per source).

    Raises :class:`~accelstack.manifests.errors.ManifestKeyError` when a key is not valid.
    """

    def __init__(
        self,
        *,
        keys: Iterable[Union[str, bytes, Path]] = (),
        user_keys_dir: Union[str, Path, None] = None,
        rollback_state: Union[str, Path, None] = None,
        insecure_unsigned: bool = False,
        include_package_keys: bool = True,
        clock: Clock = utcnow,
        channel: Optional[str] = None,
        by_source: bool = False,
    ) -> None:
        self.channel = channel  # rollback state per channel and key (see manifests.rollback); None: per source
        self.by_source = by_source  # a manifest named by URL alone: the channel of its source, per key
        self.trust = TrustStore(
            [TrustStore.key_arg(k) if isinstance(k, str) else k for k in keys],
            user_dir=user_keys_dir,
            include_package=include_package_keys,
        )
        self.rollback: Optional[RollbackStore] = RollbackStore(rollback_state) if rollback_state is not None else None
        self.insecure_unsigned = insecure_unsigned
        self.clock = clock

    @classmethod
    def from_settings(cls, settings: Settings, *, clock: Clock = utcnow) -> TrustedManifests:
        """Trust as ``settings`` say (the caller's: nothing here resolves them): its extra keys, the
        user's trusted-keys directory, the home's rollback state, and ``insecure_unsigned``."""
        s = settings
        return cls(keys=s.trusted_keys, user_keys_dir=s.user_keys_dir, rollback_state=s.rollback_state,
                   insecure_unsigned=s.insecure_unsigned, clock=clock)

    def __repr__(self) -> str:
        return (f"TrustedManifests(keys=[{self.trust.describe()}], rollback={self.rollback!r}, "
                f"insecure_unsigned={self.insecure_unsigned})")

    def verify(self, data: bytes, signature: Optional[bytes], url: str = "", *,
               expect: Optional[Stack] = None, record: bool = True) -> VerifiedManifest:
        """Check ``data`` (the manifest's exact bytes) and ``signature`` (its ``.sig``, ``None`` if
        there is none); return it parsed. ``url`` names it in errors. ``expect`` refuses a manifest
        of another kind; ``record=False`` checks the rollback watermark without raising it.

        Raises ``ManifestSignatureError``, ``ManifestFormatError`` (``ExpiredManifestFormatError``
        when expired), or ``ManifestRollbackError``; each message starts with ``url``.
        """
        try:
            return self._verify(data, signature, url, expect, record)
        except ManifestError as exc:
            if url and not exc.message.startswith(url):
                exc.message = f"{url}: {exc.message}"
                exc.args = (exc.message,)
            raise

    def load(self, data: bytes, signature: Optional[bytes], url: str = "") -> GgmlManifest:
        """:meth:`verify` for a ggml variant manifest, returning it."""
        manifest = self.verify(data, signature, url, expect="ggml").manifest
        assert isinstance(manifest, GgmlManifest)
        return manifest

    def _verify(self, data: bytes, signature: Optional[bytes], url: str, expect: Optional[Stack],
                record: bool) -> VerifiedManifest:
        keyid: Optional[str] = None
        if len(data) > MAX_JSON_BYTES:  # before hashing it for the signature check
            raise ManifestFormatError(too_large("the manifest", len(data), MAX_JSON_BYTES),
                                      "it is not a manifest accelstack publishes; get it again from its publisher")
        if self.insecure_unsigned:
            # Accepted on the user's word: still check what can be checked. A valid signature is
            # reported, and only then may the watermark rise.
            if signature is not None:
                try:
                    keyid = verify_signature(data, signature, self.trust)
                except ManifestSignatureError:
                    keyid = None
        else:
            keyid = verify_signature(data, signature, self.trust)
        doc = decode(data)
        envelope = check_envelope(doc, now=self.clock(), expect=expect)
        if self.rollback is not None:
            signers = trusted_signers(data, signature, self.trust) if keyid is not None else []
            channel = source_channel(envelope.source) if self.by_source else self.channel
            self.rollback.check(envelope.source, envelope.version, record=record and keyid is not None,
                                channel=channel, keys=self.trust.keyids, signers=signers)
        return VerifiedManifest(parse_body(doc, envelope), url, keyid)
