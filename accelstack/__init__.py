"""accelstack: find the accelerator, pick the runtime that runs on it, install it safely, prove it works.

The public API is small and typed; every stage returns data that round-trips through JSON:

    from accelstack import detect, LiveSystem
    report = detect(LiveSystem())
"""
from __future__ import annotations

__version__ = "0.1.0"

from .errors import AccelstackError  # noqa: E402
from .detect import detect, HardwareReport  # noqa: E402
from .detect.system import LiveSystem, ReplaySystem, CapturingSystem  # noqa: E402

__all__ = [
    "__version__",
    "AccelstackError",
    "detect",
    "HardwareReport",
    "LiveSystem",
    "ReplaySystem",
    "CapturingSystem",
]
