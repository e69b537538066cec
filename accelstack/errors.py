"""The exception hierarchy. Every error a user can meet says what happened and what to do.

Library code raises these; only the CLI turns them into messages and exit codes.
"""
from __future__ import annotations

from typing import Optional


class AccelstackError(Exception):
    """Base of every error accelstack raises on purpose.

    ``hint`` is the action a person can take; the CLI prints it after the message.
    """

    exit_code = 1

    def __init__(self, message: str, hint: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class UsageError(AccelstackError):
    """Bad arguments or options."""

    exit_code = 2


class CaptureFormatError(AccelstackError):
    """A capture/replay directory is missing, of an unknown version, or malformed."""


class SerializationError(AccelstackError):
    """A JSON document does not match the dataclass it should load into."""
