"""The hardware report a command works on: one saved earlier, a capture's, or this machine's.

The CLI's ``--hardware FILE`` / ``--replay DIR`` and the service's detector both come here, so a
saved report is read (and refused) one way.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..errors import UsageError
from ..hardware.report import HardwareReport
from ..hardware.system import ReplaySystem
from ..serde import loads
from ..settings import Settings
from .detection import detect

__all__ = ["saved_report", "report_for"]


def saved_report(path: str) -> HardwareReport:
    """A HardwareReport written by ``accelstack detect --json``; a usage error when unreadable."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {path} ({exc.strerror or exc})",
                         "write one with `accelstack detect --json > report.json`") from None
    return loads(HardwareReport, text, what=path)


def report_for(settings: Optional[Settings], *, hardware: Optional[str] = None,
               replay: Optional[str] = None, write_cache: bool = True) -> HardwareReport:
    """``hardware`` (a saved report), else a detection of the capture ``replay``, else of this
    machine (``write_cache=False``: a dry run, which keeps nothing new in the detection cache)."""
    if hardware:
        return saved_report(hardware)
    if replay:
        report = detect(ReplaySystem(replay), settings=settings)
        report.source = f"replay:{replay}"
        return report
    return detect(settings=settings, write_cache=write_cache)
