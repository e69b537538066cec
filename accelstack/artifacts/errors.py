"""Errors raised while fetching, caching and unpacking artifacts.

Every one says what happened and, where a person can act, what to do: ``hint`` in words and
``action`` for programs (each class has a default; a raise site may set a better one).
"""
from __future__ import annotations

from typing import Optional

from ..errors import AccelstackError, Action

__all__ = ["ArchiveFormatError", "ArtifactError", "CacheError", "DiskSpaceError", "FetchCancelled", "FetchError",
           "HashMismatchError", "InsecureURLError", "OfflineError", "SizeMismatchError", "SlowTransferError", "UnsafeArchiveError"]


class ArtifactError(AccelstackError):
    """Base of every artifact problem."""


class FetchError(ArtifactError):
    """A file could not be fetched from any of its mirrors.

    ``transient`` tells the retry loop whether trying the same URL again may help
    (connection errors, timeouts, 5xx) or not (404, 403, a mirror serving another file).
    """

    default_action = Action.CHECK_NETWORK

    def __init__(
        self,
        message: str,
        hint: Optional[str] = None,
        *,
        transient: bool = False,
        status: Optional[int] = None,
        retry_after: Optional[float] = None,
        url: Optional[str] = None,
        action: Optional[Action] = None,
    ) -> None:
        super().__init__(message, hint, action=action)
        self.transient = transient
        self.status = status
        self.retry_after = retry_after
        self.url = url


class HashMismatchError(FetchError):
    """The bytes served do not hash to the expected sha256: the file, not this machine, is at fault,
    so it suggests another try (a proxy or a cut connection) and the publisher, never a hardware capture."""

    default_action = Action.RETRY
    default_hint = "try again; if it repeats, the file changed on its mirror or was altered on the way: report it to the publisher"

    def __init__(self, message: str, *, expected: str, actual: str, hint: Optional[str] = None, url: Optional[str] = None) -> None:
        super().__init__(message, hint or self.default_hint, url=url)
        self.expected = expected
        self.actual = actual


class SizeMismatchError(FetchError):
    """A mirror serves (or announces) a different number of bytes than the reference declares: the
    publisher's to fix (the hint says so), nothing to run here."""

    default_action = Action.NONE


class SlowTransferError(FetchError):
    """A fetch passed its overall deadline (a server that drips bytes never trips the read timeout).

    Not ``transient``: trying the same server again would only wait as long once more, so the
    download moves on to the next mirror (the bytes received are kept; the next run resumes)."""

    default_hint = ("try another mirror or a faster network; on a link slower than that, lower the minimum with "
                    "ACCELSTACK_MIN_RATE (bytes per second, 0 turns it off)")

    def __init__(self, message: str, *, received: int, seconds: float, min_rate: float, url: Optional[str] = None,
                 hint: Optional[str] = None) -> None:
        super().__init__(message, hint or self.default_hint, url=url)
        self.received = received
        self.seconds = seconds
        self.min_rate = min_rate


class InsecureURLError(FetchError):
    """A URL is not https (nor loopback http, nor file://)."""

    default_action = Action.FIX_INPUT


class OfflineError(FetchError):
    """Offline mode is on and a file is not in the cache."""

    default_action = Action.GO_ONLINE


class FetchCancelled(FetchError):
    """The batch was cancelled (Ctrl-C); partial files are kept for the next run."""

    default_action = Action.RETRY


class DiskSpaceError(ArtifactError):
    """Not enough free disk space for what is about to be written."""

    default_action = Action.FREE_DISK


class CacheError(ArtifactError):
    """The cache directory cannot be created, locked or written."""

    default_action = Action.FIX_CONFIG


class UnsafeArchiveError(ArtifactError):
    """An archive holds something that must not be extracted (traversal, escaping link, device, bomb)."""


class ArchiveFormatError(ArtifactError):
    """An archive is of an unknown or unsupported format, or is corrupt."""
