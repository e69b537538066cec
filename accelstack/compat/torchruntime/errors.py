"""The compat interface's errors: accelstack errors that are also the built-in types torchruntime raises.

torchruntime raises ``NotImplementedError`` for a machine it has no torch for and ``ValueError`` for
a platform it does not know; its callers (Easy Diffusion) catch those, or nothing. Each error here
is both, so an ``except NotImplementedError`` keeps working and an accelstack-aware caller still
gets the ``code``, ``hint`` and ``action``.
"""
from __future__ import annotations

from ...errors import Action, NotPossibleHere, UsageError

__all__ = ["NoTorchRunsHere", "CompatUsageError"]


class NoTorchRunsHere(NotPossibleHere, NotImplementedError):
    """accelstack's plan finds no torch build that runs here as asked (torchruntime would pick one anyway)."""

    default_action = Action.EXPLAIN_PLAN


class CompatUsageError(UsageError, ValueError):
    """An argument torchruntime's interface does not take (a pip option accelstack cannot honour)."""
