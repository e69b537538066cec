"""Render :class:`~accelstack.events.ProgressEvent` for the CLI: tqdm bars, JSON lines, or nothing.

    with progress_renderer(json_mode=args.json) as progress:
        fetch(refs, progress=progress)

* ``--json``: every event is one JSON line on stdout (``{"event": "progress", ...}``), for GUIs.
* on a terminal: one tqdm bar per task (file) and, when a stage announces its batch with a
  ``start`` event of task ``""``, a total bar; bars start at the ``done`` of their ``start``
  event (a resumed download starts at its resumed offset); byte units when ``stage`` is
  ``fetch`` or ``extra["unit"] == "B"``. ``message`` events are printed above the bars.
* otherwise (piped, CI): silent.

The renderer is thread-safe; any command can reuse it.
"""
from __future__ import annotations

import contextlib
import sys
import threading
from typing import IO, Any, Dict, Iterator, Optional

from ..events import ProgressEvent

_BYTE_STAGES = {"fetch", "download"}


class ProgressRenderer:
    """A ``ProgressCallback``. ``mode`` is ``"json"``, ``"bars"``, ``"quiet"`` or ``"auto"``
    (bars when ``stream`` is a terminal, else quiet)."""

    def __init__(self, mode: str = "auto", *, stream: Optional[IO[str]] = None, json_stream: Optional[IO[str]] = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.json_stream = json_stream if json_stream is not None else sys.stdout
        if mode == "auto":
            isatty = getattr(self.stream, "isatty", None)
            mode = "bars" if isatty is not None and isatty() else "quiet"
        if mode not in ("json", "bars", "quiet"):
            raise ValueError(f"unknown progress mode {mode!r}")
        self.mode = mode
        self._lock = threading.Lock()
        self._bars: Dict[tuple, Any] = {}  # (stage, task) -> tqdm
        self._done: Dict[tuple, int] = {}  # (stage, task) -> last done, for the total bar
        self._totals: Dict[str, Any] = {}  # stage -> tqdm total bar

    def __call__(self, event: ProgressEvent) -> None:
        if self.mode == "quiet":
            return
        with self._lock:
            if self.mode == "json":
                self.json_stream.write(event.to_json() + "\n")
                self.json_stream.flush()
            else:
                self._bar_event(event)

    # -- bars ---------------------------------------------------------------------------------
    def _is_bytes(self, event: ProgressEvent) -> bool:
        return event.stage in _BYTE_STAGES or event.extra.get("unit") == "B"

    def _new_bar(self, event: ProgressEvent, desc: str):
        from tqdm import tqdm

        kw = dict(unit="B", unit_scale=True, unit_divisor=1024) if self._is_bytes(event) else dict(unit="it")
        return tqdm(
            total=event.total,
            initial=event.done or 0,
            desc=desc,
            file=self.stream,
            leave=False if event.task else True,
            dynamic_ncols=True,
            **kw,
        )

    def _bar_event(self, event: ProgressEvent) -> None:
        key = (event.stage, event.task)
        total_bar = self._totals.get(event.stage)
        if event.task == "":
            if event.kind == "start":
                if total_bar is not None:
                    total_bar.close()
                self._totals[event.stage] = self._new_bar(event, f"{event.stage} total")
            elif event.kind == "end" and total_bar is not None:
                if event.ok and total_bar.total is not None:
                    total_bar.n = total_bar.total
                total_bar.refresh()
                total_bar.close()
                del self._totals[event.stage]
            elif event.kind == "message" and event.message:
                self._write(event.message)
            return
        if event.kind == "message":
            if event.message:
                self._write(f"{event.task}: {event.message}")
            return
        bar = self._bars.get(key)
        if event.kind == "start":
            if bar is not None:
                bar.close()
            self._bars[key] = bar = self._new_bar(event, _short(event.task))
            self._move_total(key, event.done or 0)
            return
        if bar is None:
            return
        if event.kind == "advance":
            if event.total is not None and bar.total != event.total:
                bar.total = event.total
            bar.n = event.done
            bar.refresh()
            self._move_total(key, event.done)
        elif event.kind == "end":
            if event.ok:
                bar.n = event.total if event.total is not None else event.done
                self._move_total(key, bar.n)
                bar.refresh()
            else:
                self._write(f"{event.task}: failed: {event.message}")
            bar.close()
            del self._bars[key]

    def _move_total(self, key: tuple, done: int) -> None:
        before = self._done.get(key, 0)
        self._done[key] = done
        total_bar = self._totals.get(key[0])
        if total_bar is not None and done != before:
            total_bar.n = max(0, total_bar.n + done - before)
            total_bar.refresh()

    def _write(self, text: str) -> None:
        from tqdm import tqdm

        tqdm.write(text, file=self.stream)

    def close(self) -> None:
        with self._lock:
            for bar in list(self._bars.values()) + list(self._totals.values()):
                try:
                    bar.close()
                except Exception:
                    pass
            self._bars.clear()
            self._totals.clear()


def _short(name: str, width: int = 28) -> str:
    return name if len(name) <= width else "…" + name[-(width - 1):]


@contextlib.contextmanager
def progress_renderer(json_mode: bool = False, *, quiet: bool = False, stream: Optional[IO[str]] = None) -> Iterator[ProgressRenderer]:
    """The CLI's renderer for ``--json`` / a terminal / silence; closes its bars on exit."""
    mode = "json" if json_mode else ("quiet" if quiet else "auto")
    renderer = ProgressRenderer(mode, stream=stream)
    try:
        yield renderer
    finally:
        renderer.close()
