"""Errors of the generation engine. Each says what happened and what a person can do."""
from __future__ import annotations

from typing import List, Optional

from ..errors import AccelstackError


class EngineError(AccelstackError):
    """Base of every engine problem."""


class ConfigError(EngineError):
    """config.yaml or an engine option has an invalid key or value."""

    exit_code = 2


class ProbeModelError(EngineError):
    """The probe model could not be synthesized (disk full, unwritable cache)."""


class RuntimeNotFoundError(EngineError):
    """No runtime is known, or the runtime directory does not hold the bindings."""


class WorkerStartError(EngineError):
    """The worker process did not become ready (it crashed, or missed its deadline)."""

    def __init__(self, message: str, hint: Optional[str] = None, *, log_tail: Optional[List[str]] = None) -> None:
        super().__init__(message, hint)
        self.log_tail = list(log_tail or [])


class WorkerCrashedError(EngineError):
    """The worker died or hung, and the restart budget is spent (or restarts are off)."""


class ModelLoadError(EngineError):
    """A model file could not be loaded; the message names the file and the reason."""

    exit_code = 3


class GenerationError(EngineError):
    """A generation request was invalid or failed inside the worker."""


class VerifyFailedError(EngineError):
    """verify ran and the runtime failed it (raised only by the installer's check)."""


class CancelledError(EngineError):
    """The generation was cancelled on request."""

    exit_code = 130
