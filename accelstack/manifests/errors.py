"""Errors about manifests: their envelope, signature, freshness and version history."""
from __future__ import annotations

from ..errors import AccelstackError, Action

__all__ = ["ExpiredManifestFormatError", "ManifestError", "ManifestExpiredError", "ManifestFormatError",
           "ManifestKeyError", "ManifestRollbackError", "ManifestSignatureError", "ManifestStateError"]


class ManifestError(AccelstackError):
    """Base of every manifest problem."""


class ManifestFormatError(ManifestError):
    """The manifest is not valid JSON, or a field is missing, of the wrong type, or unknown."""


class ManifestSignatureError(ManifestError):
    """The manifest is unsigned, or no trusted key produced its signature."""


class ManifestExpiredError(ManifestError):
    """The manifest's ``expires`` date has passed."""


class ManifestRollbackError(ManifestError):
    """The manifest is older than one already seen from the same source."""


class ManifestStateError(ManifestError):
    """The file of manifest versions seen cannot be written (a read-only or full home)."""

    default_action = Action.CHOOSE_HOME


class ManifestKeyError(ManifestError):
    """A key file or key text is not a valid Ed25519 key."""


class ExpiredManifestFormatError(ManifestExpiredError, ManifestFormatError):
    """An expired manifest: both a format problem of its ``expires`` field and an expiry.

    Callers catching either ``ManifestExpiredError`` or ``ManifestFormatError`` see it.
    """
