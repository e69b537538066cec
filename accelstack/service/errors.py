"""The errors the service adds to the library's: each maps to one HTTP status.

Every failure, the library's or the service's, goes over the wire as one document of the shape
the CLI's final ``error`` line has (``{"event": "error", "format_version", "command", "ok":
false, "error": TYPE, "code", "message", "hint", "action", "run"}``, docs/json.md), so an app
reads a failed request, a failed job and a failed ``accelstack ... --json`` one way.
``accelstack serve`` hands the service the CLI's own writer of that line (:data:`Describe`);
:func:`error_document` writes the same keys for an app that runs the service without the CLI.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

from ..errors import AccelstackError, Action, UsageError
from . import words

__all__ = ["FORMAT_VERSION", "Describe", "error_document", "describe_error", "ServiceError", "BadRequest",
           "Unauthorized", "Forbidden", "NotFound", "JobConflict", "JobFinished", "PayloadTooLarge", "QueueFull",
           "Busy", "JobCancelled", "InternalError", "RemoteBindRefused"]

FORMAT_VERSION = 1  # docs/json.md: the version of the JSON Lines contract the documents follow

# (command, error) -> the error document; the CLI's is ``json.loads(commands.common.error_line(...))``
Describe = Callable[[str, AccelstackError], Dict[str, Any]]


def error_document(command: str, exc: AccelstackError) -> Dict[str, Any]:
    """The CLI's error line as a dict, without the CLI's words for the action (no ``run``)."""
    return {"event": "error", "format_version": FORMAT_VERSION, "command": command, "ok": False,
            "error": type(exc).__name__, "code": exc.code, "message": exc.message, "hint": exc.hint,
            "action": exc.action.value}


def describe_error(describe: Describe, command: str, exc: AccelstackError) -> Dict[str, Any]:
    """``describe``'s document, with what a service error adds (the job that holds the home)."""
    doc = dict(describe(command, exc))
    if not isinstance(exc, ServiceError):  # the core's and engine's words for the CLI: the service's own (its JSON fields)
        doc = words.translate(doc, exc)
    if isinstance(exc, ServiceError):
        doc.update(exc.extra())
    return doc


class ServiceError(AccelstackError):
    """A request the service refuses; ``status`` is the HTTP status it is answered with."""

    status = 400
    default_action = Action.FIX_INPUT

    def extra(self) -> Dict[str, Any]:
        """Fields of this error beyond the common ones."""
        return {}


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

    def extra(self) -> Dict[str, Any]:
        return {"job": self.job}


class JobFinished(ServiceError):
    """Cancelling a job that has already ended."""

    status = 409
    default_action = Action.NONE


class PayloadTooLarge(ServiceError):
    status = 413


class QueueFull(ServiceError):
    """A job of a kind whose queue is full: the client waits for one to end, then asks again."""

    status = 429
    default_action = Action.WAIT


class Busy(ServiceError):
    """Every connection the service can hold is serving the token holder: a new one is refused."""

    status = 503
    default_action = Action.WAIT


class JobCancelled(AccelstackError):
    """Raised inside a job at its next progress event once the job is cancelled (DELETE or shutdown).

    The library undoes what it started on any exception (a staged runtime is removed, the lock
    released), so a cancelled install leaves the home as it was."""

    default_action = Action.RETRY

    def __init__(self, message: str = "the job was cancelled") -> None:
        super().__init__(message, "nothing was changed; start the job again when you want it", code="cancelled")


class InternalError(AccelstackError):
    """An exception that is no ``AccelstackError`` (a bug), as one: its type and text in the message."""

    default_action = Action.REPORT_BUG

    def __init__(self, exc: BaseException, where: str) -> None:
        super().__init__(f"{type(exc).__name__}: {str(exc)[:500]}", f"this is a bug in accelstack; {where}",
                         code="internal-error")


class RemoteBindRefused(UsageError):
    """A non-loopback address without ``--allow-remote``."""
