"""Detection: System -> HardwareReport. Reports facts and problems; never decides what to install.

    report = detect(home=Path("/data/accelstack"))      # this machine; free disk measured where runtimes go
    report = detect(ReplaySystem("captures/laptop"), home=None)   # a captured machine, on any OS
    report = detect(home=home, cache=settings.detect_cache)       # the Vulkan enumeration kept between runs

``accelstack.detect`` (the core) passes the home, the cache folder and the timeout from ``Settings``;
nothing here resolves a setting of its own.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:  # the lazy names below, for type checkers: at run time each loads on first use
    from .capture import CapturingSystem as CapturingSystem
    from .detection import HomeRule as HomeRule
    from .detection import detect as detect
    from .live import LiveSystem as LiveSystem
    from .protocol import System as System
    from .replay import ReplaySystem as ReplaySystem
    from .report import GPU as GPU
    from .report import HardwareReport as HardwareReport
    from .report import Problem as Problem


__all__ = ["detect", "HomeRule", "HardwareReport", "GPU", "Problem", "System", "LiveSystem", "ReplaySystem",
           "CapturingSystem"]

# Loaded on first use: a command that only reads a saved report (``plan --hardware``) imports
# ``accelstack.hardware.report`` without the probes, the Systems or their subprocess machinery.
_EXPORTS = {
    "detect": ".detection", "HomeRule": ".detection",
    "HardwareReport": ".report", "GPU": ".report", "Problem": ".report",
    "System": ".protocol", "LiveSystem": ".live", "ReplaySystem": ".replay", "CapturingSystem": ".capture",
}

if not TYPE_CHECKING:  # a type checker sees the names above, and no others
    __getattr__ = lazy_exports(__name__, _EXPORTS, globals())
