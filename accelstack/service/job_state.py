"""One job: its state, its events (kept for every client that follows them), and the images it wrote.

A job's images are served from what was recorded when the job ended: the path inside the job's
own directory *and* the file's device and inode. An image is read only if the file at that path,
opened without following a link and without blocking, is still that regular file: replacing it
with a link (or a FIFO, or another file) makes it unavailable, never a way to read another file.
"""
from __future__ import annotations

import asyncio
import os
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from ..events import ProgressCallback, ProgressEvent, iso_utc
from ..limits import read_fd
from ..serde import to_dict
from .errors import JobCancelled, NotFound

__all__ = ["FINAL_STATES", "MAX_EVENTS", "MAX_IMAGE_BYTES", "Call", "JobListener", "now_iso", "event_data", "JobImage",
           "images_of", "read_image", "Job"]

FINAL_STATES = ("succeeded", "failed", "cancelled")
MAX_EVENTS = 20_000  # per job; past it only non-"advance" events are kept (counted in events_dropped)
MAX_IMAGE_BYTES = 256 * 1024 * 1024  # a 2048x2048 RGB PNG is at most ~12 MiB
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)

Call = Callable[[ProgressCallback], Any]
JobListener = Callable[["Job"], None]  # told when a job starts and when it ends (the serve log)


@dataclass(frozen=True)
class JobImage:
    """An image a job wrote: where, and which file it was (device, inode) when the job ended."""

    path: Path
    device: int
    inode: int


def images_of(result: Any, outdir: Path) -> List[JobImage]:
    """The images a job's result names that lie in the job's own directory (verify's probe
    image, generate's PNGs), as regular files (not links); anything else it mentions is not served."""
    names: List[str] = []
    for holder in (result, getattr(result, "verification", None), getattr(getattr(result, "receipt", None), "verification", None)):
        if holder is None:
            continue
        if isinstance(getattr(holder, "image", None), str) and holder.image:
            names.append(holder.image)
        names += [p for p in getattr(holder, "images", None) or [] if isinstance(p, str)]
    root = outdir.resolve()
    out: List[JobImage] = []
    for n in names:
        p = Path(n)
        if p.parent.resolve() != root or any(i.path.name == p.name for i in out):
            continue
        try:
            st = os.lstat(root / p.name)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            out.append(JobImage(root / p.name, st.st_dev, st.st_ino))
    return out


def read_image(job_id: str, image: JobImage) -> bytes:
    """The bytes of ``image`` if its path still holds the very file the job wrote; else a 404."""
    gone = NotFound(f"the image of job {job_id} is no longer the file the job wrote",
                    hint="run the job again to make a new image", code="image-replaced")
    try:
        fd = os.open(str(image.path), _OPEN_FLAGS)
    except OSError:  # removed, or a link now (O_NOFOLLOW: ELOOP)
        raise gone from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (image.device, image.inode):
            raise gone
        return read_fd(fd, MAX_IMAGE_BYTES)
    finally:
        os.close(fd)


def now_iso() -> str:
    """Now, as the CLI writes times: ISO 8601 UTC with milliseconds and a ``Z``."""
    return iso_utc(time.time())


def event_data(event: ProgressEvent) -> Dict[str, Any]:
    """A progress event as the API sends it: its fields, ``ts`` as the CLI writes it (ISO 8601 UTC)."""
    data = to_dict(event)
    data["ts"] = iso_utc(event.ts)
    return data


@dataclass
class Job:
    """One job and everything a client may ask about it."""

    id: str
    kind: str
    options: Dict[str, Any]
    outdir: Path
    created_at: str = field(default_factory=now_iso)
    state: str = "queued"
    started_at: str = ""
    finished_at: str = ""
    result: Any = None  # to_dict of the core's return value
    error: Optional[Dict[str, Any]] = None  # the error document (errors.describe_error)
    images: List[JobImage] = field(default_factory=list)  # the files it wrote, as it wrote them
    events: List[Dict[str, Any]] = field(default_factory=list)
    events_dropped: int = 0
    call: Optional[Call] = None
    cancel_requested: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _waiters: Set[Tuple[asyncio.AbstractEventLoop, asyncio.Event]] = field(default_factory=set)

    @property
    def done(self) -> bool:
        return self.state in FINAL_STATES

    def summary(self, *, full: bool = True) -> Dict[str, Any]:
        """The job as JSON: state, times, counts, and (``full``) its result or error."""
        with self._lock:
            out: Dict[str, Any] = {
                "id": self.id, "kind": self.kind, "options": self.options, "state": self.state,
                "created_at": self.created_at, "started_at": self.started_at, "finished_at": self.finished_at,
                "cancel_requested": self.cancel_requested.is_set(), "events": len(self.events),
                "events_dropped": self.events_dropped, "images": len(self.images),
                "last_event": self.events[-1] if self.events else None,
                "links": {"self": f"/api/v1/jobs/{self.id}", "events": f"/api/v1/jobs/{self.id}/events",
                          **({"image": f"/api/v1/jobs/{self.id}/image"} if self.images else {})},
            }
            if full:
                out["result"] = self.result
                out["error"] = self.error
            return out

    # -- events: written by the runner thread, read by any number of async streams -------------
    def progress(self, event: ProgressEvent) -> None:
        """The job's progress callback. After a cancel, any event but an ``end`` (the ones
        emitted while the library cleans up) raises :class:`JobCancelled`."""
        if self.cancel_requested.is_set() and event.kind != "end":
            raise JobCancelled()
        data = event_data(event)
        with self._lock:
            if len(self.events) < MAX_EVENTS or event.kind != "advance":
                self.events.append(data)
            else:
                self.events_dropped += 1
        self._notify()

    def snapshot(self, start: int) -> Tuple[List[Dict[str, Any]], bool]:
        """Events from index ``start`` on, and whether the job had ended when they were taken."""
        with self._lock:
            return self.events[start:], self.done

    async def changed(self, seen: int, timeout: float) -> bool:
        """Wait until there are more than ``seen`` events or the job ends; False on timeout."""
        loop = asyncio.get_running_loop()
        ev = asyncio.Event()
        key = (loop, ev)
        with self._lock:
            if len(self.events) > seen or self.done:
                return True
            self._waiters.add(key)
        try:
            await asyncio.wait_for(ev.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            with self._lock:
                self._waiters.discard(key)

    def _notify(self) -> None:
        with self._lock:
            waiters = list(self._waiters)
        for loop, ev in waiters:
            try:
                loop.call_soon_threadsafe(ev.set)
            except RuntimeError:  # the loop is closed: the server is gone
                pass

    def _finish(self, state: str, result: Any = None, error: Optional[Dict[str, Any]] = None,
                images: Optional[List[JobImage]] = None) -> None:
        with self._lock:
            self.state, self.result, self.error = state, result, error
            self.images = images or []
            self.finished_at = now_iso()
            self.call = None
        self._notify()
