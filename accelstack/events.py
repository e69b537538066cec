"""Progress events: how library code reports long work without printing.

A caller passes a ``ProgressCallback``; the CLI renders events as tqdm bars on a terminal or as
JSON lines with ``--json``. Library code never assumes anyone is listening.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional

from .domain import EventKind


@dataclass
class ProgressEvent:
    """One step of progress.

    ``kind`` is one of: ``start`` (a task with ``total`` units begins), ``advance`` (``done``
    units so far), ``end`` (the task finished; ``ok`` says how), ``message`` (a note for humans).
    ``task`` identifies the unit of work (a file name, a stage); ``stage`` groups tasks
    (``fetch``, ``install``, ``verify``...).
    """

    kind: EventKind
    stage: str
    task: str = ""
    done: int = 0
    total: Optional[int] = None
    ok: Optional[bool] = None
    message: str = ""
    extra: Dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"event": "progress", **dataclasses.asdict(self)}, sort_keys=True)


ProgressCallback = Callable[[ProgressEvent], None]


def null_progress(event: ProgressEvent) -> None:
    """The default callback: nobody is listening."""
