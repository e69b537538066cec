"""The words and numbers of progress output: one task's state, durations, amounts, times left
and tqdm's bar formats (:mod:`.progress` renders them)."""
from __future__ import annotations

import io
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Optional, Tuple

from ..serde import size_text

__all__ = ["Task", "label_of", "first_line", "short", "bar_format", "duration", "amount", "eta_of", "local_time", "spinner_text",
           "terminal_columns"]


@dataclass
class Task:
    """What the renderer knows of one running task."""

    stage: str
    task: str
    started: float  # clock()
    total: Optional[int]
    done: int
    first: int  # done at the start (a resumed download): the rate counts from here
    unit: str
    last_line: float  # clock() of the last line printed for it (lines mode)
    printed: Tuple[int, str] = (0, "")  # (done, message) of that line
    message: str = ""
    eta: bool = True  # the units are even enough to estimate the time left from the rate
    json_at: float = float("-inf")  # clock() of its last advance line (json mode)

    @property
    def label(self) -> str:
        return label_of(self.stage, self.task)


def local_time(iso: str) -> str:
    """An ISO-8601 time from a receipt or result, for people: this computer's local time to the
    minute, with its zone (``2026-12-04 05:43 CET``); text that is not such a time is shown as it is."""
    try:
        when = datetime.fromisoformat(iso[:-1] + "+00:00" if iso.endswith("Z") else iso)
    except (TypeError, ValueError):
        return iso
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone().strftime("%Y-%m-%d %H:%M %Z").strip()


def label_of(stage: str, task: str) -> str:
    return f"[{stage}] {task}" if task else f"[{stage}]"


def first_line(text: str, width: int = 100) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[:width - 1] + "…"


def short(name: str, width: int = 40) -> str:
    return name if len(name) <= width else "…" + name[-(width - 1):]


def bar_format(unit: str, eta: bool = True) -> Optional[str]:
    """tqdm's own format for bytes (with the rate); else done/total, the unit named once, and the
    elapsed and (unless ``eta`` is False) the remaining time."""
    if unit == "B" and eta:
        return None
    named = f" {unit}" + ("s" if unit and not unit.endswith("s") else "") if unit and unit != "B" else ""
    return "{l_bar}{bar}| {n_fmt}/{total_fmt}" + named + (" [{elapsed}<{remaining}{postfix}]" if eta else " [{elapsed}{postfix}]")


def duration(seconds: float) -> str:
    """``0.4 s``, ``12 s``, ``3 min 05 s``, ``1 h 02 min``."""
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def amount(n: Optional[int], unit: str, of: bool = True) -> str:
    """``n`` in ``unit``: sizes for bytes (``1.5 MiB``), else the number and the unit's name."""
    if n is None:
        return "?"
    if unit == "B":
        return size_text(n)
    if of or not unit:
        return str(n)
    return f"{n} {unit}" + ("s" if n != 1 and not unit.endswith("s") else "")


def eta_of(task: Task, elapsed: float) -> Optional[float]:
    """Seconds left at the average rate since the task started (None before any progress)."""
    moved = task.done - task.first
    if task.total is None or moved <= 0 or elapsed <= 0 or task.done >= task.total:
        return None
    return max(0.0, (task.total - task.done) * elapsed / moved)


def spinner_text(spin: str, name: str, elapsed: float, done: str, note: str, width: int) -> str:
    """An indeterminate bar's line: its name, the spinner, the time so far and its current step,
    cut with "…" to the terminal's ``width`` (0: not known) so it never wraps onto a second row."""
    text = f"{spin} {name}: {duration(elapsed)}{done}" + (f" — {note}" if note else "")
    return text[:width - 2] + "…" if width and len(text) >= width else text


def terminal_columns(stream: Any) -> int:
    """The terminal's width (0: not a terminal, or it does not say), asked each time: a window resizes."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return 0
