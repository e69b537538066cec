"""Errors of the generation engine. Each says what happened and what a person can do.

Hints are plain sentences (an app embedding the engine has no command line); the machine-readable
next step is the error's ``action`` (see :class:`accelstack.errors.Action`), set per class below
and overridden where a raise site knows better.
"""
from __future__ import annotations

from typing import List, Optional

from ..errors import AccelstackError, Action, NotPossibleHere

__all__ = ["EngineError", "ConfigError", "ProbeModelError", "RuntimeNotFoundError", "WorkerStartError", "WorkerCrashedError",
           "ModelLoadError", "ModelNotFoundError", "GenerationError", "InvalidRequestError", "OutputPathError",
           "OutputWriteError", "InsufficientMemoryError", "CancelledError"]


class EngineError(AccelstackError):
    """Base of every engine problem."""


class ConfigError(EngineError):
    """config.yaml or an engine option has an invalid key or value."""

    exit_code = 2
    default_action = Action.FIX_CONFIG


class ProbeModelError(EngineError):
    """The probe model could not be synthesized (disk full, unwritable cache)."""

    default_action = Action.FREE_DISK


class RuntimeNotFoundError(EngineError):
    """No runtime is known, or the runtime directory does not hold the bindings."""

    default_action = Action.INSTALL


class WorkerStartError(EngineError):
    """The worker process did not become ready (it crashed, or missed its deadline)."""

    default_action = Action.REINSTALL

    def __init__(self, message: str, hint: Optional[str] = None, *, action: Optional[Action] = None,
                 code: Optional[str] = None, log_tail: Optional[List[str]] = None) -> None:
        super().__init__(message, hint, action=action, code=code)
        self.log_tail = list(log_tail or [])


class WorkerCrashedError(EngineError):
    """The worker died or hung, and the restart budget is spent (or restarts are off)."""

    default_action = Action.VERIFY


class ModelLoadError(EngineError):
    """A model file could not be loaded; the message names the file and the reason."""

    default_action = Action.FIX_INPUT


class ModelNotFoundError(ModelLoadError):
    """The model path names nothing: a missing input file, a usage error (exit 2) like a bad value."""

    exit_code = 2


class GenerationError(EngineError):
    """A generation request was invalid or failed inside the worker."""

    default_action = Action.FIX_INPUT


class InvalidRequestError(GenerationError):
    """A generation request's value is out of range (size, steps, sampler...): a usage error, exit 2."""

    exit_code = 2


class OutputPathError(GenerationError):
    """An output path an image cannot be written to (a folder, a FIFO, a link, a folder that cannot
    be written): a usage error (exit 2), refused before any work starts."""

    exit_code = 2


class OutputWriteError(GenerationError):
    """Writing an image failed after the work (the disk filled up, the folder went away)."""

    default_action = Action.FREE_DISK


class InsufficientMemoryError(GenerationError, NotPossibleHere):
    """The estimate of a generation's memory exceeds what the machine has (nothing was started):
    this size cannot be done on this machine (exit 3), whatever is retried."""

    exit_code = 3
    default_action = Action.FIX_INPUT


class CancelledError(EngineError):
    """The generation was cancelled on request."""

    exit_code = 130
