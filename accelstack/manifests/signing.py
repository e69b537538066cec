"""The publisher's signing API in one import: keys, ``.sig`` documents, the rollback store.

Verification for use lives in :class:`accelstack.manifests.trust.TrustedManifests`; the pieces
are in :mod:`.keys`, :mod:`.signatures` and :mod:`.rollback`.
"""
from __future__ import annotations

from .keys import TrustedKey, TrustStore, generate_keypair, keyid_of, parse_public_key, public_raw_of_private
from .rollback import RollbackStore
from .signatures import SIG_SUFFIX, SIGNATURE_FORMAT, read_manifest_files, sign_manifest, signature_path

__all__ = ["SIG_SUFFIX", "SIGNATURE_FORMAT", "RollbackStore", "TrustStore", "TrustedKey", "generate_keypair",
           "keyid_of", "parse_public_key", "public_raw_of_private", "read_manifest_files", "sign_manifest",
           "signature_path"]
