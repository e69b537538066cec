"""Ctrl-C (or SIGTERM) during `install`, `upgrade` or `repair`: say what state it left, not a traceback.

The previous runtime stays active until the new one has passed its check, and a partial
download is resumed by the next run; the message says which of these happened.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator

from ..core import disk_state
from ..errors import Action, Interrupted
from ..serde import size_text
from ..settings import Settings

__all__ = ["InterruptWatch", "interruptible"]


class InterruptWatch:
    """Says, after Ctrl-C, what state an install, upgrade or repair left: which runtime is active
    (the previous one unless the switch had happened) and how much of a download is kept."""

    def __init__(self, settings: Settings, stack: str = "ggml") -> None:
        self.s = settings
        self.stack = stack
        self.before = self._active()
        self.blobs: Dict[str, int] = {}  # sha256 -> size, from the fetch stage's events

    def _active(self) -> str:
        return disk_state.active_runtime_id(self.s, self.stack)

    def progress(self, inner: Callable[[Any], None]) -> Callable[[Any], None]:
        """``inner`` that also notes every artifact the fetch stage starts on."""
        def callback(event: Any) -> None:
            sha = event.extra.get("sha256") if isinstance(event.extra, dict) else None
            if event.stage == "fetch" and isinstance(sha, str) and len(sha) == 64:
                self.blobs[sha] = int(event.total or 0)
            inner(event)
        return callback

    def state(self) -> str:
        now = self._active()
        if now == self.before:
            state = f"nothing changed, previous runtime {now} still active" if now else "nothing changed, no runtime is active"
        else:
            state = f"runtime {now} had been verified and activated" + (
                f" ({self.before} is kept for `accelstack rollback`)" if self.before else "")
        partial, done = disk_state.kept_downloads(self.s, self.blobs)
        if partial:
            state += f"; downloaded {size_text(partial)} kept, re-run to resume"
        elif done:
            state += f"; the download ({size_text(done)}) is kept in the cache for the next run"
        return state

    def message(self) -> str:
        return f"interrupted: {self.state()}"


@contextlib.contextmanager
def interruptible(settings: Settings, stack: str = "ggml") -> Iterator[InterruptWatch]:
    """Turn Ctrl-C (exit 130) or SIGTERM (:class:`~accelstack.errors.Terminated`, exit 143) into
    :class:`~accelstack.errors.Interrupted` saying what state the machine is in."""
    watch = InterruptWatch(settings, stack)
    try:
        yield watch
    except KeyboardInterrupt as exc:  # RETRY renders as "run the same command again"
        raise Interrupted.by(exc, watch.state(), action=Action.RETRY) from None
