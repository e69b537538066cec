"""Render :class:`~accelstack.events.ProgressEvent` for the CLI: bars, plain lines, JSON lines, or nothing.

    with progress_renderer(json_mode=args.json) as progress:
        fetch(refs, progress=progress)

* ``--json`` (mode ``json``): every event is one JSON line on stdout (``{"event": "progress",
  "ts": ..., "stage_index": ...}``), for GUIs; ``stage_index`` counts the stages in the order
  this run met them. ``advance`` lines of one task come at most every ``json_interval`` seconds,
  except those that reach the total or bring a new ``message`` (a check done); starts, ends and
  messages all come.
* on a terminal (``bars``): one tqdm bar per task, named, with its elapsed time; a known total
  gives a determinate bar with an ETA (byte units when ``stage`` is ``fetch`` or
  ``extra["unit"] == "B"``), an unknown one a spinner whose elapsed time keeps moving, so no
  step ever looks frozen. When a stage announces its batch with a ``start`` event of task
  ``""``, a total bar sums its tasks. Bars start at the ``done`` of their ``start`` event (a
  resumed download starts at its offset). Messages, failures and the duration of every task
  that took a while are printed above the bars.
* not a terminal (``lines``: CI logs, ``| tee``, an app reading stderr): plain timestamped lines
  on stderr for every start, end and message, progress at most every ``line_interval`` seconds
  per task, and, when nothing at all was printed for ``heartbeat`` seconds, a "still working"
  line for the innermost running task (the one started last).
* ``quiet``: nothing.

:func:`configure` takes the CLI's verbosity: -1 quiet, 0 normal, 1+ also messages marked
``extra["level"] == "debug"``. ``extra["eta"] = False`` on a start says the units are too uneven
for a time estimate (verify's checks). The renderer is thread-safe; any command can reuse it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
import time
from typing import IO, Any, Callable, Dict, Iterator, List, Optional

from ..events import ProgressEvent
from .common import printable
from .progress_format import Task, amount, bar_format, duration, eta_of, first_line, label_of, short, spinner_text
from .progress_format import terminal_columns as _columns

__all__ = ["ProgressRenderer", "configure", "verbosity", "progress_renderer", "TICK", "LINE_INTERVAL", "HEARTBEAT",
           "JSON_INTERVAL", "SHOW_DURATION"]

_BYTE_STAGES = {"fetch", "download"}
SPINNER = "|/-\\"
TICK = 0.25  # terminal: how often spinners turn and elapsed times move
LINE_INTERVAL = 5.0  # not a terminal: least seconds between two progress lines of one task
HEARTBEAT = 15.0  # not a terminal: after this long with no line at all, a "still working" line
JSON_INTERVAL = 0.25  # --json: least seconds between two advance lines of one task
SHOW_DURATION = 2.0  # terminal: tasks that took at least this long print their duration at the end

_verbosity = 0


def configure(verbosity: int) -> None:
    """The CLI's ``-q``/``-v``: -1 no progress at all, 0 normal, 1+ debug messages too."""
    global _verbosity
    _verbosity = int(verbosity)


def verbosity() -> int:
    return _verbosity


class ProgressRenderer:
    """A ``ProgressCallback``. ``mode`` is ``"json"``, ``"bars"``, ``"lines"``, ``"quiet"`` or
    ``"auto"`` (bars when ``stream`` is a terminal, else lines). ``clock`` (monotonic seconds)
    and ``ticker=False`` (call :meth:`tick` yourself) are for tests."""

    def __init__(self, mode: str = "auto", *, stream: Optional[IO[str]] = None, json_stream: Optional[IO[str]] = None,
                 verbosity: Optional[int] = None, clock: Callable[[], float] = time.monotonic,
                 line_interval: float = LINE_INTERVAL, heartbeat: float = HEARTBEAT, json_interval: float = JSON_INTERVAL,
                 ticker: bool = True) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.json_stream = json_stream if json_stream is not None else sys.stdout
        if mode == "auto":
            isatty = getattr(self.stream, "isatty", None)
            mode = "bars" if isatty is not None and isatty() else "lines"
        if mode not in ("json", "bars", "lines", "quiet"):
            raise ValueError(f"unknown progress mode {mode!r}")
        self.mode = mode
        self.verbosity = _verbosity if verbosity is None else verbosity
        self.clock = clock
        self.line_interval = line_interval
        self.heartbeat = heartbeat
        self.json_interval = json_interval
        self._last_line = clock()  # clock() of the last line printed (lines mode)
        self._use_ticker = ticker
        self._lock = threading.RLock()
        self._stages: List[str] = []  # in the order this run met them: their stage_index
        self._tasks: Dict[tuple, Task] = {}  # (stage, task) -> running task
        self._bars: Dict[tuple, Any] = {}  # (stage, task) -> tqdm
        self._done: Dict[tuple, int] = {}  # (stage, task) -> last done, for the total bar
        self._totals: Dict[str, Any] = {}  # stage -> tqdm total bar
        self._spin = 0
        self._last_refresh = 0.0
        self._ticker: Optional[threading.Thread] = None
        self._closed = threading.Event()

    def stage_index(self, stage: str) -> int:
        """The stage's index in this run (counted from 0 in the order the stages first appeared)."""
        with self._lock:
            if stage not in self._stages:
                self._stages.append(stage)
            return self._stages.index(stage)

    def __call__(self, event: ProgressEvent) -> None:
        if self.mode == "quiet":
            return
        with self._lock:
            index = self.stage_index(event.stage)
            if self.mode == "json":
                if self._json_due(event):
                    self.json_stream.write(event.to_json(stage_index=index) + "\n")
                    self.json_stream.flush()
                return
            if event.kind == "message" and event.extra.get("level") == "debug" and self.verbosity < 1:
                return
            if not (event.task.isprintable() and event.message.isprintable()):  # file names: anyone's (issue 47)
                event = dataclasses.replace(event, task=printable(event.task), message=printable(event.message, lines=True))
            self._track(event)
            if self.mode == "bars":
                self._bar_event(event)
            if self._use_ticker and self._tasks and self._ticker is None and not self._closed.is_set():
                self._ticker = threading.Thread(target=self._tick_loop, name="progress-ticker", daemon=True)
                self._ticker.start()

    def _json_due(self, event: ProgressEvent) -> bool:
        """Whether an event goes out now: advances of one task are thinned to one per ``json_interval``."""
        key = (event.stage, event.task)
        if event.kind == "start":
            self._tasks[key] = Task(event.stage, event.task, self.clock(), event.total, event.done, event.done, "", 0.0)
        elif event.kind == "end":
            self._tasks.pop(key, None)
        if event.kind != "advance":
            return True
        task = self._tasks.get(key)
        now = self.clock()
        if task is None:
            task = self._tasks[key] = Task(event.stage, event.task, now, event.total, event.done, event.done, "", 0.0)
        final = event.total is not None and event.done >= event.total
        if now - task.json_at < self.json_interval and not final and event.message == task.message:
            return False
        task.json_at, task.message = now, event.message
        return True

    # -- what is running --------------------------------------------------------------------------
    def _unit(self, event: ProgressEvent) -> str:
        return "B" if event.stage in _BYTE_STAGES or event.extra.get("unit") == "B" else str(event.extra.get("unit", ""))

    def _track(self, event: ProgressEvent) -> None:
        """Keep the running tasks up to date; in lines mode, print what is due."""
        key = (event.stage, event.task)
        now = self.clock()
        task = self._tasks.get(key)
        if event.kind == "start" or (event.kind == "advance" and task is None):
            task = Task(event.stage, event.task, now, event.total, event.done or 0, event.done or 0,
                         self._unit(event), now, (event.done or 0, event.message), event.message,
                         eta=event.extra.get("eta", True) is not False)
            self._tasks.pop(key, None)  # a restarted task is the newest again
            self._tasks[key] = task
            if self.mode == "lines":
                size = f" ({amount(task.total, task.unit, of=False)})" if task.total is not None else ""
                self._line(event.ts, task.label, f"started{size}" + (f": {event.message}" if event.message else ""))
            if event.kind == "start":
                return
        if event.kind == "advance":
            assert task is not None
            if event.total is not None:
                task.total = event.total
            if event.extra.get("unit") and not task.unit:
                task.unit = str(event.extra["unit"])
            task.done, task.message = event.done, event.message or task.message
            if self.mode == "lines":
                # a change, at most every line_interval; no change: tick() keeps the log alive
                if (task.done, task.message) != task.printed and now - task.last_line >= self.line_interval:
                    self._progress_line(task, now, event.ts)
        elif event.kind == "end":
            self._tasks.pop(key, None)
            if self.mode != "lines":
                return
            took = f" in {duration(now - task.started)}" if task is not None else ""
            label = label_of(event.stage, event.task)
            if event.ok is False:
                self._line(event.ts, label, f"failed{took.replace(' in ', ' after ')}" + (f": {event.message}" if event.message else ""))
            else:
                self._line(event.ts, label, f"done{took}" + (f": {event.message}" if event.message else ""))
        elif event.kind == "message" and event.message:
            if task is not None:
                task.message = event.message  # the task's current step (its spinner shows it)
            if self.mode == "lines":
                self._line(event.ts, label_of(event.stage, event.task), event.message)

    def _progress_line(self, task: Task, now: float, ts: float) -> None:
        elapsed = now - task.started
        if task.total:
            text = f"{min(100, int(task.done * 100 / task.total))}% ({amount(task.done, task.unit)} of " \
                   f"{amount(task.total, task.unit, of=False)}), {duration(elapsed)}"
            eta = eta_of(task, elapsed) if task.eta else None
            if eta is not None:
                text += f", about {duration(eta)} left"
        elif task.done:
            text = f"{amount(task.done, task.unit, of=False)} so far, {duration(elapsed)}"
        else:
            text = f"still working, {duration(elapsed)}"
        if task.message:
            text += f" ({task.message})"
        self._line(ts, task.label, text)
        task.last_line, task.printed = now, (task.done, task.message)

    def _line(self, ts: float, label: str, text: str) -> None:
        self._last_line = self.clock()
        sep = " " if label.endswith("]") else ": "  # "[plan] no published build ..." when there is no task
        self.stream.write(f"{time.strftime('%H:%M:%S', time.localtime(ts))} {label}{sep}{text}\n")
        self.stream.flush()

    # -- ticking ----------------------------------------------------------------------------------
    def _tick_loop(self) -> None:
        while not self._closed.wait(TICK):
            with self._lock:
                if not self._tasks:
                    self._ticker = None
                    return
                self.tick()

    def tick(self) -> None:
        """Move what moves with time alone: spinners and elapsed times (bars), "still working"
        lines for silent tasks (lines). Called by the ticker thread every ``TICK`` seconds."""
        with self._lock:
            now = self.clock()
            if self.mode == "lines":
                if self._tasks and now - self._last_line >= self.heartbeat:
                    innermost = list(self._tasks.values())[-1]  # started last (the dict keeps that order)
                    self._progress_line(innermost, now, time.time())
            elif self.mode == "bars":
                self._spin = (self._spin + 1) % len(SPINNER)
                refresh_all = now - self._last_refresh >= 1.0
                if refresh_all:
                    self._last_refresh = now
                for key, bar in list(self._bars.items()) + [((s, ""), b) for s, b in self._totals.items()]:
                    if bar.total is None:
                        self._spinner(bar, key)
                    elif refresh_all:
                        bar.refresh()

    # -- bars ---------------------------------------------------------------------------------
    def _new_bar(self, event: ProgressEvent, desc: str):
        unit = self._unit(event)
        kw = dict(unit="B", unit_scale=True, unit_divisor=1024) if unit == "B" else dict(unit=unit or "it")
        eta = event.extra.get("eta", True) is not False
        bar = _tqdm()(total=event.total, initial=event.done or 0, desc=desc, file=self.stream, leave=False if event.task else True,
                   dynamic_ncols=True, bar_format=bar_format(unit, eta) if event.total is not None else "{desc}", **kw)
        bar.accelstack_name, bar.accelstack_unit, bar.accelstack_eta = desc, unit, eta
        if event.total is None:
            self._spinner(bar, (event.stage, event.task))
        return bar

    def _spinner(self, bar: Any, key: tuple) -> None:
        """An indeterminate bar: its name, a turning spinner, the time so far and its last note."""
        task = self._tasks.get(key)
        elapsed = self.clock() - task.started if task is not None else bar.format_dict.get("elapsed", 0)
        done = f", {amount(task.done, task.unit, of=False)}" if task is not None and task.done else ""
        bar.set_description_str(spinner_text(SPINNER[self._spin], bar.accelstack_name, elapsed, done,
                                             task.message if task is not None else "", _columns(self.stream)), refresh=False)
        bar.refresh()

    def _bar_event(self, event: ProgressEvent) -> None:
        key = (event.stage, event.task)
        total_bar = self._totals.get(event.stage)
        if event.task == "":
            if event.kind == "start":
                if total_bar is not None:
                    total_bar.close()
                self._totals[event.stage] = self._new_bar(event, f"{event.stage} total")
            elif event.kind == "advance" and total_bar is not None:
                self._advance(total_bar, event, key)
            elif event.kind == "end" and total_bar is not None:
                if event.ok and total_bar.total is not None:
                    total_bar.n = total_bar.total
                if event.ok is False:
                    total_bar.leave = False  # a failed stage leaves its words, not a bar that looks current
                total_bar.refresh()
                total_bar.close()
                del self._totals[event.stage]
                if event.ok is False:
                    self._write(f"{event.stage}: failed" + (f": {event.message}" if event.message else ""))
            elif event.kind == "end" and event.ok is False:
                self._write(f"{event.stage}: failed" + (f": {event.message}" if event.message else ""))
            elif event.kind == "message" and event.message:
                self._write(event.message)
            return
        if event.kind == "message":
            spinning = self._bars.get(key)
            if spinning is not None and spinning.total is None:  # its spinner names the step now: said once
                self._spinner(spinning, key)
            elif event.message:
                self._write(f"{short(event.task)}: {event.message}")
            return
        bar = self._bars.get(key)
        if event.kind == "start" or (event.kind == "advance" and bar is None):
            if bar is not None:
                bar.close()
            self._bars[key] = bar = self._new_bar(event, short(event.task))
            self._move_total(key, event.done or 0)
            if event.kind == "start":
                return
        if event.kind == "advance":
            self._advance(bar, event, key)
            self._move_total(key, event.done)
        elif event.kind == "end":
            if bar is not None:
                started = bar.start_t
                if event.ok:
                    bar.n = event.total if event.total is not None else (event.done or bar.n)
                    self._move_total(key, bar.n)
                    bar.refresh()
                bar.close()
                del self._bars[key]
                took = bar._time() - started
            else:
                took = 0.0
            if event.ok is False:  # the reason's first line: the command itself reports the error in full
                self._write(f"{short(event.task)}: failed after {duration(took)}" + (f": {first_line(event.message)}" if event.message else ""))
            elif took >= SHOW_DURATION or (event.message and self.verbosity >= 1):
                self._write(f"{short(event.task)}: done in {duration(took)}" + (f" ({event.message})" if event.message else ""))

    def _advance(self, bar: Any, event: ProgressEvent, key: tuple) -> None:
        if event.extra.get("unit") and not bar.accelstack_unit:
            bar.accelstack_unit = str(event.extra["unit"])
            if bar.total is not None:
                bar.bar_format = bar_format(bar.accelstack_unit, bar.accelstack_eta)
        if event.total is not None and bar.total != event.total:
            bar.total = event.total
            bar.bar_format = bar_format(bar.accelstack_unit, bar.accelstack_eta)  # its size is known now: a bar with an ETA
            bar.set_description_str(bar.accelstack_name, refresh=False)
        bar.n = event.done
        if bar.total is None:
            self._spinner(bar, key)
        else:
            if event.message:
                bar.set_postfix_str(event.message, refresh=False)
            bar.refresh()

    def _move_total(self, key: tuple, done: int) -> None:
        before = self._done.get(key, 0)
        self._done[key] = done
        total_bar = self._totals.get(key[0])
        if total_bar is not None and done != before:
            total_bar.n = max(0, total_bar.n + done - before)
            total_bar.refresh()

    def _write(self, text: str) -> None:
        """A line above the bars, cut to the terminal's width (COLUMNS-1) so it never wraps: the
        command reports an error in full itself."""
        width = _columns(self.stream)
        if width:
            text = "\n".join(line if len(line) < width else line[:width - 2] + "…" for line in text.splitlines())
        _tqdm().write(text, file=self.stream)

    def end_open(self, message: str) -> None:
        """End each task still running (ok false, ``message``): an interrupted command leaves no bar open."""
        for stage, task in list(self._tasks):
            self(ProgressEvent("end", stage, task=task, ok=False, message=message))

    def close(self) -> None:
        """Stop; the bars still open (an error or Ctrl-C ends the work under them) are erased, so
        what the command prints next is not under a step that no longer runs."""
        self._closed.set()
        with self._lock:
            for bar in list(self._bars.values()) + list(self._totals.values()):
                try:
                    bar.leave = False
                    bar.close()
                except Exception:
                    pass
            self._bars.clear()
            self._totals.clear()
            self._tasks.clear()


def _tqdm() -> Any:
    """tqdm's bar class, imported when bars are drawn (a terminal) and not before: JSON lines,
    plain lines and commands that show no progress (``detect``) never pay for it."""
    from tqdm import tqdm

    return tqdm


@contextlib.contextmanager
def progress_renderer(json_mode: bool = False, *, quiet: bool = False, stream: Optional[IO[str]] = None) -> Iterator[ProgressRenderer]:
    """The CLI's renderer: JSON lines on stdout with ``json_mode`` (``--json``), else bars on a
    terminal or timestamped lines on stderr; nothing with ``quiet`` or ``-q`` (:func:`configure`)."""
    mode = "quiet" if quiet or _verbosity < 0 else ("json" if json_mode else "auto")
    renderer = ProgressRenderer(mode, stream=stream)
    try:
        yield renderer
    finally:
        renderer.close()
