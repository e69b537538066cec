"""Errors of the installer: the home's state, a failed install, pip's causes and the torch checks.

One module for the layer, so a caller catches a kind of failure without knowing which module of
the installer raised it (the engine and the manifests keep theirs in their own ``errors``).
"""
from __future__ import annotations

from typing import Any, Optional

from ..errors import AccelstackError, Action
from ..verdict import VerifyReport

__all__ = ["StateError", "DiskFullError", "LockHeldError", "InstallError", "VerifyFailed", "TorchInstallError", "TorchEngineMissingError", "TorchMissingError",
           "PipError", "PipNetworkError", "PipNotFoundError", "PipConflictError", "PipDiskFullError",
           "PipHashMismatchError"]


class StateError(AccelstackError):
    """The runtime home is unusable (read-only, corrupt receipt, missing runtime)."""


class DiskFullError(StateError):
    """The runtime home's disk (or the user's quota or file size limit) has no room for a state file."""

    default_action = Action.FREE_DISK


class LockHeldError(StateError):
    """Another accelstack process is changing the runtime home."""

    default_action = Action.WAIT


class InstallError(AccelstackError):
    """The install could not complete; the previous runtime is still active."""


class VerifyFailed(InstallError):
    """The staged runtime did not pass its check, so it was not activated."""

    default_action = Action.EXPLAIN_PLAN

    def __init__(self, message: str, report: VerifyReport, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.report = report


class TorchInstallError(InstallError):
    """pip failed or the installed torch does not work; what was there before has been restored."""


class TorchEngineMissingError(InstallError):
    """The torch runtime lacks packages accelstack's torch engine imports (diffusers, transformers...)."""

    default_action = Action.REINSTALL
    stack = "torch"  # the install that adds them is the torch stack's, not the default one


class TorchMissingError(InstallError):
    """The interpreter a torch command would run in has no torch: the torch stack is not installed there."""

    default_action = Action.INSTALL
    stack = "torch"


class PipError(TorchInstallError):
    """pip failed; ``kind`` says why in one word and ``cause`` is pip's own line that says so."""

    def __init__(self, message: str, hint: Optional[str] = None, *, kind: str = "", cause: str = "",
                 action: Optional[Action] = None, code: Optional[str] = None) -> None:
        super().__init__(message, hint, action=action, code=code)
        self.kind = kind
        self.cause = cause


class PipNetworkError(PipError):
    """pip could not reach a package index or download a file (DNS, refused, proxy, TLS, HTTP error)."""

    default_action = Action.CHECK_NETWORK


class PipNotFoundError(PipError):
    """No package (or no version of it) that fits was on the indexes pip searched."""

    default_action = Action.FIX_INPUT


class PipConflictError(PipError):
    """The requirements cannot be installed together (pip's ResolutionImpossible)."""

    default_action = Action.FIX_INPUT


class PipDiskFullError(PipError):
    """The disk filled up while pip downloaded or unpacked."""

    default_action = Action.FREE_DISK


class PipHashMismatchError(PipError):
    """A downloaded file is not the one its hash names (a broken download, or a changed file)."""

    default_action = Action.RETRY
