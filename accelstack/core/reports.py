"""The hardware report a command works on: one saved earlier, a capture's, or this machine's.

The CLI's ``--hardware FILE`` / ``--replay DIR`` and the service's detector both come here, so a
saved report is read (and refused) one way.
"""
from __future__ import annotations

from typing import Any, Optional

from ..errors import UsageError
from ..hardware.report import HardwareReport
from ..hardware.system import ReplaySystem
from ..limits import MAX_JSON_BYTES, MalformedInput, parse_json, read_capped
from ..serde import from_dict
from ..settings import Settings
from .detection import detect

__all__ = ["saved_report", "report_for"]


def saved_report(path: str) -> HardwareReport:
    """A HardwareReport saved from ``accelstack detect --json``: its JSON Lines output (the result
    line, after any progress lines) or the bare report; a usage error when it is neither. The file
    is read as someone else's input: size- and depth-capped, a regular file only. A document that
    is not a report is a failure naming the field (exit 1), as before."""
    hint = "write one with `accelstack detect --json > report.json`"
    try:
        data = read_capped(path, MAX_JSON_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {path} ({exc.strerror or exc})", hint) from None
    return from_dict(HardwareReport, _report_document(data, path))


def _report_document(data: bytes, path: str) -> Any:
    """The report inside ``data``: the whole file as one JSON document, else its last JSON line;
    a result line (``{"event": "result", ...}``) is unwrapped, and must be detect's."""
    try:
        doc = parse_json(data, what=path)
    except MalformedInput:
        lines = [line for line in data.splitlines() if line.strip()]
        if len(lines) < 2:
            raise
        doc = parse_json(lines[-1], what=f"{path}, its last line")
    if not isinstance(doc, dict) or "event" not in doc:
        return doc  # a bare report (or not one: loading it says which field is wrong)
    command = str(doc.get("command", "?"))[:40]
    if doc.get("event") == "error":
        raise UsageError(f"{path} holds the error line of `accelstack {command}`, not a hardware report",
                         "run `accelstack detect --json > report.json` again and check that it succeeds")
    if doc.get("event") != "result" or command != "detect":
        raise UsageError(f"{path} holds the output of `accelstack {command}`, not of `accelstack detect`",
                         "write one with `accelstack detect --json > report.json`")
    return doc.get("result")


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
