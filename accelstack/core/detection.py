"""``detect``: the first step of the core, kept light (importing it loads only the detect stage)."""
from __future__ import annotations

from typing import Optional

from ..hardware import detect as _detect
from ..hardware.report import HardwareReport
from ..hardware.system import System
from ..settings import Settings


def detect(system: Optional[System] = None, *, settings: Optional[Settings] = None) -> HardwareReport:
    """What is in this machine (or in a replayed capture, with ``system=ReplaySystem(dir)``).

    Free disk is measured at the runtime home: ``settings.home`` when settings are given, else
    the home rule applied to the system's own environment (a replayed Windows capture measures
    its ``%LOCALAPPDATA%``)."""
    if settings is None:
        return _detect(system)
    return _detect(system, home=settings.home, timeout=settings.timeouts.detect)
