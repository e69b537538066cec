"""The errors of the publisher tooling: a build or a manifest that cannot be made.

Hints are sentences for a person; the machine-readable next step is the ``action`` (an app that
embeds the builder has no command line to point at).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..errors import AccelstackError, Action, SubprocessTimeout

__all__ = ["BuildError", "BuildTimeout", "CudaToolkitMissing", "PublishError"]


class BuildError(AccelstackError):
    """A ggml build could not be made; the message names the missing tool or the failing step.

    ``log`` is the full output of the failing step when there is one.
    """

    def __init__(self, message: str, hint: Optional[str] = None, *, action: Optional[Action] = None,
                 code: Optional[str] = None, log: Optional[Path] = None) -> None:
        super().__init__(message, hint, action=action, code=code)
        self.log = log

    def to_dict(self) -> dict:
        out = super().to_dict()
        if self.log is not None:
            out["log"] = str(self.log)
        return out


class BuildTimeout(BuildError, SubprocessTimeout):
    """A step of a build (the source download, the compile) ran past its time limit; it was stopped
    with every process it started."""

    default_action = Action.RETRY


class CudaToolkitMissing(BuildError):
    """A CUDA build needs a system CUDA toolkit of one major version (CUDA 12: PyPI has no nvcc
    for it) and this machine has none; the message says what was found instead."""

    default_action = Action.INSTALL_TOOLCHAIN


class PublishError(AccelstackError):
    """The build directory cannot be turned into a manifest."""

    default_action = Action.FIX_INPUT
