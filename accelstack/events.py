"""Progress events: how library code reports long work without printing.

A caller passes a ``ProgressCallback``; the CLI renders events as bars on a terminal, as plain
timestamped lines when output is not a terminal, or as JSON lines with ``--json``. Library code
never assumes anyone is listening.
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Dict, Optional

from .domain import EventKind

__all__ = ["STAGE_ORDER", "iso_utc", "as_utc_z", "ProgressEvent", "default_stage_index", "ProgressCallback", "null_progress"]

# The order in which a full run (``accelstack install`` then ``generate``) meets the stages: the
# ``stage_index`` of a stage no renderer has counted (see :meth:`ProgressEvent.to_json`).
STAGE_ORDER = ("detect", "plan", "fetch", "download", "build", "install", "probe", "verify", "generate")


def iso_utc(ts: float) -> str:
    """``ts`` (seconds since the epoch) as ISO-8601 UTC with milliseconds: ``2026-12-02T01:08:38.123Z``."""
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def as_utc_z(text: str) -> str:
    """An ISO-8601 time with any zone (``+02:00``, ``+00:00``, ``Z``) in the one form --json prints:
    UTC ending in ``Z``, seconds (and a fraction when it has one). Text that is not such a time is
    returned as it is (the caller's checks report it)."""
    try:
        when = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except (TypeError, ValueError):
        return text
    if when.tzinfo is None:
        return text
    when = when.astimezone(timezone.utc)
    fraction = f".{when.microsecond:06d}".rstrip("0") if when.microsecond else ""
    return when.strftime("%Y-%m-%dT%H:%M:%S") + fraction + "Z"


@dataclass
class ProgressEvent:
    """One step of progress.

    ``kind`` is one of: ``start`` (a task with ``total`` units begins; ``total`` None: its size is
    not known, it only ticks), ``advance`` (``done`` units so far; sent also without change as a
    sign of life), ``end`` (the task finished; ``ok`` says how), ``message`` (a note for humans).
    ``task`` identifies the unit of work (a file name, a stage); ``stage`` groups tasks
    (``fetch``, ``install``, ``verify``...). ``ts`` is when it happened (``time.time()``), taken
    where the event is made, so a renderer on another thread still shows the true time.
    """

    kind: EventKind
    stage: str
    task: str = ""
    done: int = 0
    total: Optional[int] = None
    ok: Optional[bool] = None
    message: str = ""
    extra: Dict[str, Any] = field(default_factory=dict)
    ts: float = field(default_factory=time.time, compare=False, repr=False)

    def to_json(self, stage_index: Optional[int] = None) -> str:
        """One JSON line: the fields, ``ts`` as ISO-8601 UTC, and ``stage_index``, the stage's
        place in the run (a renderer counts the stages it met; alone, :data:`STAGE_ORDER`)."""
        data = dataclasses.asdict(self)
        data["ts"] = iso_utc(self.ts)
        data["stage_index"] = stage_index if stage_index is not None else default_stage_index(self.stage)
        return json.dumps({"event": "progress", **data}, sort_keys=True)


def default_stage_index(stage: str) -> int:
    """The stage's place in :data:`STAGE_ORDER` (unknown stages come after the known ones)."""
    return STAGE_ORDER.index(stage) if stage in STAGE_ORDER else len(STAGE_ORDER)


ProgressCallback = Callable[[ProgressEvent], None]


def null_progress(event: ProgressEvent) -> None:
    """The default callback: nobody is listening."""
