"""One file into the cache: locked, resumed, streamed through the hash, mirror after mirror.

Connection errors, timeouts and 5xx are retried with backoff (:class:`RetryPolicy`); 404/403 are
not; then the next mirror is tried. A hash mismatch deletes the part and tries the next mirror.
Each retry and mirror switch is a progress ``message`` for the user and a log record for
diagnostics (logger ``accelstack.artifacts.download``).
"""
from __future__ import annotations

import errno
import logging
import threading
import time
from pathlib import Path
from typing import Any, List, Optional, Sequence, Set

import filelock

from ..domain import EventKind
from ..errors import Action
from ..events import ProgressCallback, ProgressEvent
from ..refs import ArtifactRef
from ..serde import size_text
from .cache import Cache, remove_file
from .errors import (
    ArtifactError,
    DiskSpaceError,
    FetchCancelled,
    FetchError,
    HashMismatchError,
    SizeMismatchError,
)
from .partfile import PartFile
from .retry import RetryPolicy
from .transport import Stream, Transport

__all__ = ["PROGRESS_INTERVAL", "STAGE", "Downloader", "final_error", "write_error"]

log = logging.getLogger(__name__)
STAGE = "fetch"
PROGRESS_INTERVAL = 0.1  # seconds between ``advance`` events of one file


class Downloader:
    """Downloads the files of one :func:`~accelstack.artifacts.batch.fetch` call; its workers share it."""

    def __init__(
        self,
        cache: Cache,
        transport: Transport,
        retry: RetryPolicy,
        progress: Optional[ProgressCallback],
        verify_cached: bool,
        chunk_size: int,
        fsync: bool,
        deep: bool = False,
    ) -> None:
        self.fsync = fsync
        self.deep = deep
        self.cache = cache
        self.transport = transport
        self.retry = retry
        self.verify_cached = verify_cached
        self.chunk_size = chunk_size
        self._progress = progress
        self._emit_lock = threading.Lock()
        self.cancel = threading.Event()
        self._active: Set[Stream] = set()
        self._active_lock = threading.Lock()

    # -- progress -------------------------------------------------------------------------
    def emit(self, kind: EventKind, task: str, **kw: Any) -> None:
        if self._progress is None:
            return
        event = ProgressEvent(kind=kind, stage=STAGE, task=task, **kw)
        with self._emit_lock:
            self._progress(event)

    # -- cancellation -----------------------------------------------------------------------
    def check_cancel(self) -> None:
        if self.cancel.is_set():
            raise FetchCancelled("download cancelled; the partial file is kept and resumes next time")

    def cancel_all(self) -> None:
        self.cancel.set()
        with self._active_lock:
            streams = list(self._active)
        for stream in streams:
            try:
                stream.abort()  # wakes a worker blocked in a socket read
            except Exception:
                pass

    def sleep(self, seconds: float) -> None:
        if self.cancel.wait(seconds):
            self.check_cancel()

    # -- one file ---------------------------------------------------------------------------
    def fetch_ref(self, ref: ArtifactRef, task: str) -> Path:
        sha, size = ref.sha256, ref.size
        blob = self.cache.blob_path(sha)
        if self.cache.valid(sha, size, verify=self.verify_cached or self.deep, deep=self.deep):
            self._cached(task, ref, blob)
            return blob
        lock = self.cache.lock(sha)
        self._acquire(lock, task)
        try:
            # Another process may have finished it while we waited for the lock.
            if self.cache.valid(sha, size, verify=self.verify_cached or self.deep, deep=self.deep):
                self._cached(task, ref, blob)
                return blob
            self.cache.remove(sha)  # wrong size or hash: never serve it
            return self._download(ref, task)
        finally:
            lock.release()

    def _cached(self, task: str, ref: ArtifactRef, blob: Path) -> None:
        extra = {"sha256": ref.sha256, "cached": True, "resumed": 0}
        self.emit("start", task, done=ref.size, total=ref.size, extra=extra)
        self.emit("end", task, done=ref.size, total=ref.size, ok=True, extra={**extra, "path": str(blob)})

    def _acquire(self, lock: Any, task: str) -> None:
        try:
            lock.acquire(timeout=0)
            return
        except filelock.Timeout:
            pass
        self.emit("message", task, message=f"waiting for another process that is downloading {task}")
        while True:
            self.check_cancel()
            try:
                lock.acquire(timeout=0.25)
                return
            except filelock.Timeout:
                continue

    def _download(self, ref: ArtifactRef, task: str) -> Path:
        sha, size = ref.sha256, ref.size
        part = PartFile(self.cache.part_path(sha), size, self.chunk_size)
        ok = False
        try:
            resumed = part.offset
            self.emit(
                "start", task, done=resumed, total=size, extra={"sha256": sha, "cached": False, "resumed": resumed}
            )
            if part.offset == size and part.hexdigest() != sha:
                part.reset()  # a complete part that does not verify: worthless
                self.emit("advance", task, done=0, total=size)
            failures: List[FetchError] = []
            if part.offset < size or part.hexdigest() != sha:
                for url in ref.urls:
                    try:
                        self._from_mirror(ref, url, part, task)
                        break
                    except FetchCancelled:
                        raise
                    except FetchError as exc:
                        failures.append(exc)
                        if len(failures) < len(ref.urls):
                            log.warning("%s: %s; trying the next mirror", task, exc.message)
                            self.emit("message", task, message=f"{exc.message}; trying the next mirror")
                else:
                    raise final_error(ref, failures)
            part.flush(fsync=self.fsync)
            part.close()
            path = self.cache.place(part.path, sha, durable=self.fsync)
            ok = True
            self.emit(
                "end", task, done=size, total=size, ok=True,
                extra={"sha256": sha, "cached": False, "resumed": resumed, "path": str(path)},
            )
            return path
        except BaseException as exc:
            self.emit("end", task, done=part.offset, total=size, ok=False, message=str(exc))
            raise
        finally:
            if not ok:
                part.close()
                if part.offset == 0:
                    remove_file(part.path)  # nothing worth resuming (e.g. deleted after a mismatch)

    def _from_mirror(self, ref: ArtifactRef, url: str, part: PartFile, task: str) -> None:
        """Fill ``part`` from ``url`` until complete and verified, or raise ``FetchError``."""
        retry = self.retry
        fresh = part.offset == 0  # every byte in the part came from this mirror, this call
        stalls = 0
        attempts = 0
        while True:
            self.check_cancel()
            attempts += 1
            before = part.offset
            try:
                restarted = self._attempt(ref, url, part, task)
                fresh = fresh or restarted
            except FetchCancelled:
                raise
            except FetchError as exc:
                if not exc.transient or attempts >= retry.max_attempts:
                    raise
                stalls = 0 if part.offset > before else stalls + 1
                if stalls > retry.retries:
                    raise
                delay = retry.delay(max(1, stalls), exc.retry_after)
                log.info("%s: %s; retry %d in %.1fs", task, exc.message, attempts, delay)
                self.emit("message", task, message=f"{exc.message}; retrying in {delay:.1f}s")
                self.sleep(delay)
                continue
            digest = part.hexdigest()
            if digest == ref.sha256:
                return
            part.reset()
            self.emit("advance", task, done=0, total=ref.size)
            if not fresh:
                # The bytes came partly from an earlier run or another mirror: give this
                # mirror one clean try from the start before blaming it.
                fresh = True
                log.warning("%s: resumed download from %s did not verify; restarting from zero", task, url)
                self.emit("message", task, message="resumed download did not verify; restarting from zero")
                continue
            raise HashMismatchError(
                f"{task}: sha256 mismatch from {url}: expected {ref.sha256}, got {digest}",
                expected=ref.sha256,
                actual=digest,
                url=url,
            )

    def _attempt(self, ref: ArtifactRef, url: str, part: PartFile, task: str) -> bool:
        """One request. Returns True if the part was restarted from zero (server ignored Range)."""
        size = ref.size
        offset = part.offset
        restarted = False
        # The whole file's size sets the deadline; a 206's announced rest tightens it (Transport.open).
        stream = self.transport.open(url, offset, expect=size)
        with self._active_lock:
            self._active.add(stream)
        try:
            if stream.start == 0 and offset > 0:
                # 200 to a Range request: the server sends everything; start over cleanly.
                part.reset()
                restarted = True
                log.info("%s: %s does not support resuming; restarting from zero", task, url)
                self.emit("message", task, message=f"{url} does not support resuming; restarting from zero")
                self.emit("advance", task, done=0, total=size)
            elif stream.start != offset:
                raise FetchError(
                    f"{url}: asked for bytes from {offset}, got bytes from {stream.start}", transient=True, url=url
                )
            if stream.total is not None and stream.total != size:
                raise SizeMismatchError(
                    f"{task}: {url} serves {_exact(stream.total)}, expected {_exact(size)}",
                    "the mirror has another file under this name; report it to the publisher",
                    url=url,
                )
            if stream.length is not None and part.offset + stream.length != size:
                raise SizeMismatchError(
                    f"{task}: {url} announces {_exact(part.offset + stream.length)}, expected {_exact(size)}",
                    "the mirror has another file under this name; report it to the publisher",
                    url=url,
                )
            self._stream_into(stream, ref, url, part, task)
            if part.offset < size:
                raise FetchError(
                    f"{url}: connection closed after {size_text(part.offset)} of {size_text(size)}", transient=True, url=url
                )
            self.emit("advance", task, done=part.offset, total=size)
            return restarted
        except FetchError:
            if self.cancel.is_set():
                self.check_cancel()
            raise
        finally:
            try:
                part.flush()
            except OSError:
                pass
            with self._active_lock:
                self._active.discard(stream)
            stream.close()

    def _stream_into(self, stream: Stream, ref: ArtifactRef, url: str, part: PartFile, task: str) -> None:
        """Copy the body into ``part`` until it ends: each buffer filled by as many socket reads as
        it takes, then written and hashed once (see :mod:`.partfile`). Bytes received before an
        error are kept, so a resume asks only for the rest."""
        size = ref.size
        cancel = self.cancel
        emit = self._progress is not None
        last = time.monotonic()
        while True:
            if cancel.is_set():
                self.check_cancel()
            buf = part.buffer()
            owned = True  # until the part takes the buffer
            try:
                view = memoryview(buf)
                # One byte more than still missing: a body longer than declared shows itself.
                want = min(len(view), size - part.offset + 1)
                filled, eof = 0, False
                error: Optional[FetchError] = None
                try:
                    while filled < want:
                        n = stream.readinto(view[filled:want])
                        if not n:
                            eof = True
                            break
                        filled += n
                except FetchError as exc:
                    error = exc
                if filled > size - part.offset:
                    part.reset()
                    self.emit("advance", task, done=0, total=size)
                    raise SizeMismatchError(
                        f"{task}: {url} sent more than the declared {_exact(size)}",
                        "the mirror has another file under this name; report it to the publisher",
                        url=url,
                    )
                if filled:
                    owned = False
                    try:
                        part.write(view[:filled], buffer=buf)
                    except OSError as exc:
                        raise write_error(exc, part.path) from None
            finally:
                if owned:
                    part.give_back(buf)
            if error is not None:
                raise error
            if emit:
                now = time.monotonic()
                if now - last >= PROGRESS_INTERVAL:
                    last = now
                    self.emit("advance", task, done=part.offset, total=size)
            if eof:
                return


def _exact(n: int) -> str:
    """A size where the exact count matters (two sizes that differ by a byte): both forms."""
    return f"{size_text(n)} ({n} bytes)" if n >= 1024 else f"{n} bytes"


def write_error(exc: OSError, path: Path) -> ArtifactError:
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        return DiskSpaceError(
            f"the disk filled up while writing {path}",
            "free some space; the download resumes where it stopped",
        )
    return ArtifactError(f"cannot write {path} ({exc.strerror or exc})")


def final_error(ref: ArtifactRef, failures: Sequence[FetchError]) -> FetchError:
    if not failures:
        return FetchError(f"{ref.name}: no URL to download it from", "the manifest lists no mirror for this file: report it to its publisher",
                          action=Action.NONE)
    mismatches = [f for f in failures if isinstance(f, HashMismatchError)]
    if len(failures) == 1:
        return failures[0]
    detail = "; ".join(f.message for f in failures)
    if mismatches:
        last = mismatches[-1]
        return HashMismatchError(
            f"{ref.name}: no mirror served the expected file (expected sha256 {ref.sha256}, got {last.actual}): {detail}",
            expected=ref.sha256,
            actual=last.actual,
            hint="the file changed on the mirrors or was tampered with; report it to the publisher",
        )
    return FetchError(f"{ref.name}: all {len(failures)} mirrors failed: {detail}", failures[-1].hint,
                      action=failures[-1].action)
