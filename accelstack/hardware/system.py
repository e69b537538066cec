"""One object for all OS access: the only door detection uses to look at a machine.

``LiveSystem`` (``live.py``) looks at this machine. ``CapturingSystem`` (``capture.py``) wraps
another System and records every answer; ``save(dir)`` writes them in the capture format
(docs/capture-format.md). ``ReplaySystem`` (``replay.py``) answers from such a directory, on any
OS. This module gathers them under the import path callers have always used.
"""
from __future__ import annotations

from .capture import CAPTURE_VERSION, CapturingSystem
from .live import LiveSystem
from .protocol import DEFAULT_TIMEOUT, CommandResult, System
from .replay import ReplaySystem

__all__ = ["CAPTURE_VERSION", "DEFAULT_TIMEOUT", "CapturingSystem", "CommandResult", "LiveSystem", "ReplaySystem", "System"]
