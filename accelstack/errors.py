"""The exception hierarchy. Every error a user can meet says what happened and what to do.

Library code raises these; only the CLI (or an embedding app) turns them into messages and exit
codes. Each error carries:

- ``code``: a stable, machine-readable name (``lock-held``, ``hash-mismatch``), derived from the
  class name unless a subclass or the raise site sets one;
- ``hint``: what a person can do, in words, never in CLI syntax (an app has no command line);
- ``action``: the same as a machine-readable :class:`Action` (``repair``, ``install``...), which
  the CLI renders as the command to run and an app as a button.
"""
from __future__ import annotations

import enum
import re
from typing import Optional

__all__ = ["Action", "AccelstackError", "UsageError", "NotPossibleHere", "Interrupted", "Terminated", "CaptureFormatError",
           "SerializationError", "SubprocessTimeout", "SIGINT_EXIT", "SIGTERM_EXIT"]

# The conventional statuses of a command ended by a signal (128 + its number), kept when it is
# turned into an error line: a shell, a service manager or an app's installer reads them.
SIGINT_EXIT = 130
SIGTERM_EXIT = 143


class Action(str, enum.Enum):
    """The next step an error or problem suggests. Values are stable: apps match on them."""

    NONE = ""
    INSTALL = "install"  # install a runtime (first run)
    REINSTALL = "reinstall"  # install again over a damaged or stale runtime
    REPAIR = "repair"  # restore damaged files / state of the installed runtime
    UPGRADE = "upgrade"  # re-plan for changed hardware or a newer build
    VERIFY = "verify"  # run the generation check for details
    EXPLAIN_PLAN = "explain-plan"  # look at the plan's candidates and reasons
    STATUS = "status"  # look at what is installed
    WAIT = "wait"  # another process holds the lock: wait or retry later
    RETRY = "retry"  # a transient failure: try again
    FREE_DISK = "free-disk"
    CHOOSE_HOME = "choose-home"  # use another (writable, local) runtime home
    ADD_MANIFEST = "add-manifest"  # name a manifest/channel with a build for this machine
    TRUST_KEY = "trust-key"  # trust the publisher's signing key
    ALLOW_UNSIGNED = "allow-unsigned"  # accept an unsigned manifest you control
    INSTALL_TOOLCHAIN = "install-toolchain"  # a compiler / CMake for a local build
    GIVE_SOURCE = "give-source"  # a local source distribution for a build
    CHECK_NETWORK = "check-network"
    GO_ONLINE = "go-online"  # leave offline mode
    FIX_CONFIG = "fix-config"  # the config file has a bad value
    FIX_INPUT = "fix-input"  # an argument or input file is wrong
    UPDATE_ACCELSTACK = "update-accelstack"
    UPDATE_DRIVER = "update-driver"
    REPORT_BUG = "report-bug"  # capture the machine and attach it to a bug report


def _code_of(cls: type) -> str:
    name = cls.__name__
    if name.endswith("Error") and name != "Error":
        name = name[: -len("Error")]
    return re.sub(r"(?<!^)(?=[A-Z])", "-", name).lower() or "error"


class AccelstackError(Exception):
    """Base of every error accelstack raises on purpose."""

    exit_code = 1
    default_action: Action = Action.NONE
    stack = ""  # the stack an install or reinstall action is for ("": the default one)

    def __init__(self, message: str, hint: Optional[str] = None, *,
                 action: Optional[Action] = None, code: Optional[str] = None,
                 exit_code: Optional[int] = None, stack: Optional[str] = None) -> None:
        super().__init__(message)
        if exit_code is not None:  # e.g. an input file the user named that cannot be read: a usage error (2)
            self.exit_code = exit_code
        if stack is not None:  # `accelstack install --stack X`, not the default stack's install
            self.stack = stack
        self.message = message
        self.hint: str = hint or ""
        self.action: Action = Action(action) if action is not None else self.default_action
        self._code = code

    @property
    def code(self) -> str:
        return self._code or _code_of(type(self))

    def to_dict(self) -> dict:
        return {"code": self.code, "type": type(self).__name__, "message": self.message,
                "hint": {"action": self.action.value, "detail": self.hint}}

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class UsageError(AccelstackError):
    """Bad arguments or options."""

    exit_code = 2
    default_action = Action.FIX_INPUT


class NotPossibleHere(AccelstackError):
    """The request is valid but this machine cannot meet it (a forced backend with no device,
    a build variant whose toolchain cannot exist here). Exit code 3: retrying will not help."""

    exit_code = 3
    default_action = Action.EXPLAIN_PLAN


class Terminated(KeyboardInterrupt):
    """SIGTERM (what ``Popen.terminate()``, ``kill`` and service managers send), raised where Ctrl-C
    would be, so every cleanup a Ctrl-C runs (staging, the lock, child processes) runs for it too."""


class Interrupted(AccelstackError):
    """The user interrupted (Ctrl-C) or the process was terminated (SIGTERM); ``message`` says what
    state the machine was left in."""

    exit_code = SIGINT_EXIT
    default_action = Action.NONE

    @classmethod
    def by(cls, signal: BaseException, state: str = "", *, action: Optional[Action] = None) -> Interrupted:
        """The error for ``signal`` (a KeyboardInterrupt, or :class:`Terminated`): "interrupted: STATE"
        with exit 130, or "terminated: STATE" with exit 143."""
        terminated = isinstance(signal, Terminated)
        word = "terminated" if terminated else "interrupted"
        err = cls(f"{word}: {state}" if state else word, action=action)
        if terminated:
            err.exit_code = SIGTERM_EXIT
        return err


class CaptureFormatError(AccelstackError):
    """A capture/replay directory is missing, of an unknown version, or malformed. Damaged input is
    a failure (exit 1); a folder that does not exist is a usage error (exit 2), set where raised."""

    default_action = Action.FIX_INPUT


class SerializationError(AccelstackError):
    """A JSON document does not match the dataclass it should load into."""

    default_action = Action.FIX_INPUT


class SubprocessTimeout(AccelstackError):
    """An external command (pip, a venv creation, a toolchain probe) ran past its time limit."""

    default_action = Action.RETRY
