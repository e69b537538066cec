"""The errors the service adds to the library's: each maps to one HTTP status.

The library's own errors travel unchanged (``AccelstackError.to_dict``); a request the service
cannot take is one of these, with the same shape, so an app reads every failure one way.
"""
from __future__ import annotations

from typing import Optional

from ..errors import AccelstackError, Action, UsageError

__all__ = ["ServiceError", "BadRequest", "Unauthorized", "Forbidden", "NotFound", "JobConflict", "JobFinished",
           "PayloadTooLarge", "JobCancelled", "RemoteBindRefused"]


class ServiceError(AccelstackError):
    """A request the service refuses; ``status`` is the HTTP status it is answered with."""

    status = 400
    default_action = Action.FIX_INPUT


class BadRequest(ServiceError):
    status = 400


class Unauthorized(ServiceError):
    status = 401


class Forbidden(ServiceError):
    status = 403


class NotFound(ServiceError):
    status = 404


class JobConflict(ServiceError):
    """A second job that changes the runtime home while one is queued or running."""

    status = 409
    default_action = Action.WAIT

    def __init__(self, message: str, hint: Optional[str] = None, *, job: str = "") -> None:
        super().__init__(message, hint, code="job-conflict")
        self.job = job  # the job that holds the home

    def to_dict(self) -> dict:
        return {**super().to_dict(), "job": self.job}


class JobFinished(ServiceError):
    """Cancelling a job that has already ended."""

    status = 409
    default_action = Action.NONE


class PayloadTooLarge(ServiceError):
    status = 413


class JobCancelled(AccelstackError):
    """Raised inside a job at its next progress event once the job is cancelled (DELETE or shutdown).

    The library undoes what it started on any exception (a staged runtime is removed, the lock
    released), so a cancelled install leaves the home as it was."""

    default_action = Action.RETRY

    def __init__(self, message: str = "the job was cancelled") -> None:
        super().__init__(message, "nothing was changed; start the job again when you want it", code="cancelled")


class RemoteBindRefused(UsageError):
    """A non-loopback address without ``--allow-remote``."""
