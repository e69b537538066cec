"""Checking the keys a user passes with ``--trusted-key`` before any work.

A key is only parsed when a manifest is verified against it, which may be never (no channel) or
after a long build; a typo there must be a usage error at once, naming the key.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..errors import Action, UsageError
from ..manifests.errors import ManifestError
from ..manifests.keys import TrustStore

__all__ = ["check_trusted_keys"]


def check_trusted_keys(keys: Sequence[str]) -> None:
    """Each key is a readable ``.pub`` file or base64 text of a 32-byte Ed25519 key; else UsageError (exit 2)."""
    store = TrustStore(include_package=False)
    for key in keys:
        arg = TrustStore.key_arg(key)
        try:
            if isinstance(arg, Path):
                store.add_file(arg)
            else:
                store.add(arg)
        except ManifestError as exc:
            raise UsageError(f"--trusted-key {key}: {exc.message}",
                             "give the publisher's .pub file, or its public key as base64 text",
                             action=Action.FIX_INPUT) from None
