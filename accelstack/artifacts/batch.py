"""Fetch artifacts into the content-addressed cache: resumable, hashed while streaming, locked.

    from accelstack.artifacts import ArtifactRef, fetch
    paths = fetch([ArtifactRef("model.gguf", sha256, size, [url, mirror])])
    paths[sha256]  # -> Path of the verified, read-only blob in the cache

Guarantees:

* Nothing reaches ``blobs/sha256/<hex>`` unless its sha256 and size were checked; it gets there
  by an atomic rename, under a per-blob file lock, so two processes never corrupt each other and
  the second reuses what the first fetched.
* The hash is computed while streaming (one pass over the network bytes), the size is enforced
  while streaming (never more than declared is written).
* An interrupted download resumes with an HTTP Range request from the ``.part`` file, across
  retries and across runs; a server that answers a range request with the whole file (200)
  restarts the part cleanly.
* Connection errors, timeouts and 5xx are retried with exponential backoff and jitter; 404/403
  are not; then the next mirror is tried. A hash mismatch deletes the part and tries the next
  mirror; the final error names both hashes.
* Free disk space for the whole batch is checked before anything is downloaded.
* Progress is reported as :class:`~accelstack.events.ProgressEvent` (stage ``fetch``): the batch
  is the task ``""`` (its ``total`` the batch's bytes), each file the task named after it.
  ``start`` events of a resumed file carry ``done`` = the resumed offset. Callbacks are called
  from worker threads, one at a time (never concurrently).
"""
from __future__ import annotations

import hashlib
import os
import queue
import random
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Set, Union

from ..events import ProgressCallback, ProgressEvent
from .cache import Cache, check_sha256, remove_file
from .errors import (
    ArtifactError,
    DiskSpaceError,
    FetchCancelled,
    FetchError,
    HashMismatchError,
    OfflineError,
    SizeMismatchError,
)
from ..refs import ArtifactRef
from .transport import DEFAULT_CHUNK_SIZE, Stream, Transport, check_url

OFFLINE_ENV = "ACCELSTACK_OFFLINE"
STAGE = "fetch"
DISK_HEADROOM = 16 << 20  # keep this much free beyond what the batch needs
PROGRESS_INTERVAL = 0.1  # seconds between ``advance`` events of one file


def offline_from_env() -> bool:
    """True if ``ACCELSTACK_OFFLINE`` is set to 1/true/yes/on."""
    return os.environ.get(OFFLINE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass
class RetryPolicy:
    """How hard to try one mirror before moving on to the next.

    ``retries`` counts failures in a row that made no progress (an attempt that received bytes
    resets the count, since resuming costs nothing); ``max_attempts`` caps all attempts on one
    mirror. The delay before retry ``n`` is ``min(backoff_max, backoff_base * 2**(n-1))`` times a
    random factor in ``[1 - jitter, 1]`` (a server's ``Retry-After`` is honoured up to
    ``backoff_max``).
    """

    retries: int = 4
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    jitter: float = 0.5
    max_attempts: int = 50

    def delay(self, failures: int, retry_after: Optional[float] = None) -> float:
        base = min(self.backoff_max, self.backoff_base * (2 ** max(0, failures - 1)))
        base *= 1.0 - self.jitter * random.random()
        if retry_after is not None:
            base = max(base, min(retry_after, self.backoff_max))
        return base


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


class _HashBehind:
    """A sha256 updated by a helper thread that trails the writes by at most ``depth`` chunks.

    Still one pass over the bytes as they stream in; hashing just runs beside the socket reads
    and disk writes (hashlib releases the GIL), so a fast download is not slowed by it.
    """

    def __init__(self, initial: "hashlib._Hash", depth: int = 8) -> None:
        self._hash = initial
        self._queue: "queue.Queue[Optional[bytes]]" = queue.Queue(depth)
        self._thread = threading.Thread(target=self._run, name="accelstack-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._hash.update(item)
            finally:
                self._queue.task_done()

    def update(self, data: bytes) -> None:
        self._queue.put(data)

    def hexdigest(self) -> str:
        self._queue.join()
        return self._hash.hexdigest()

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()


HASH_BEHIND_MIN = 16 << 20  # files smaller than this are hashed inline


class _PartFile:
    """``<blob>.part``: the bytes so far and their running sha256, kept in step."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        fd = os.open(str(path), os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o644)
        self._fh = os.fdopen(fd, "r+b")
        existing = os.fstat(fd).st_size
        prefix = hashlib.sha256()
        self.offset = 0
        if 0 < existing <= size:
            # Resume: re-hash what is already on disk (a local read, not a network one).
            while True:
                data = self._fh.read(1 << 20)
                if not data:
                    break
                prefix.update(data)
                self.offset += len(data)
        else:
            self._fh.truncate(0)
        self._fh.seek(self.offset)
        self._fh.truncate(self.offset)
        self._hash = self._hasher(prefix)

    def _hasher(self, initial: "hashlib._Hash"):
        if self.size - self.offset >= HASH_BEHIND_MIN:
            return _HashBehind(initial)
        return initial

    def write(self, data: bytes) -> None:
        self._fh.write(data)
        self._hash.update(data)
        self.offset += len(data)

    def reset(self) -> None:
        self._fh.seek(0)
        self._fh.truncate(0)
        self._close_hash()
        self.offset = 0
        self._hash = self._hasher(hashlib.sha256())

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def flush(self, fsync: bool = False) -> None:
        self._fh.flush()
        if fsync:
            os.fsync(self._fh.fileno())

    def _close_hash(self) -> None:
        if isinstance(self._hash, _HashBehind):
            self._hash.close()

    def close(self) -> None:
        self._close_hash()
        if not self._fh.closed:
            try:
                self._fh.flush()
            finally:
                self._fh.close()


class _Batch:
    """State shared by the workers of one :func:`fetch` call."""

    def __init__(
        self,
        cache: Cache,
        transport: Transport,
        retry: RetryPolicy,
        progress: Optional[ProgressCallback],
        verify_cached: bool,
        chunk_size: int,
        fsync: bool,
    ) -> None:
        self.fsync = fsync
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
    def emit(self, kind: str, task: str, **kw) -> None:
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
        if self.cache.valid(sha, size, verify=self.verify_cached):
            self._cached(task, ref, blob)
            return blob
        lock = self.cache.lock(sha)
        self._acquire(lock, task)
        try:
            # Another process may have finished it while we waited for the lock.
            if self.cache.valid(sha, size, verify=self.verify_cached):
                self._cached(task, ref, blob)
                return blob
            remove_file(blob)  # wrong size or hash: never serve it
            return self._download(ref, task)
        finally:
            lock.release()

    def _cached(self, task: str, ref: ArtifactRef, blob: Path) -> None:
        extra = {"sha256": ref.sha256, "cached": True, "resumed": 0}
        self.emit("start", task, done=ref.size, total=ref.size, extra=extra)
        self.emit("end", task, done=ref.size, total=ref.size, ok=True, extra={**extra, "path": str(blob)})

    def _acquire(self, lock, task: str) -> None:
        import filelock

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
        part = _PartFile(self.cache.part_path(sha), size)
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
                            self.emit("message", task, message=f"{exc.message}; trying the next mirror")
                else:
                    raise _final_error(ref, failures)
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

    def _from_mirror(self, ref: ArtifactRef, url: str, part: _PartFile, task: str) -> None:
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
                self.emit("message", task, message="resumed download did not verify; restarting from zero")
                continue
            raise HashMismatchError(
                f"{task}: sha256 mismatch from {url}: expected {ref.sha256}, got {digest}",
                expected=ref.sha256,
                actual=digest,
                url=url,
            )

    def _attempt(self, ref: ArtifactRef, url: str, part: _PartFile, task: str) -> bool:
        """One request. Returns True if the part was restarted from zero (server ignored Range)."""
        size = ref.size
        offset = part.offset
        restarted = False
        stream = self.transport.open(url, offset)
        with self._active_lock:
            self._active.add(stream)
        try:
            if stream.start == 0 and offset > 0:
                # 200 to a Range request: the server sends everything; start over cleanly.
                part.reset()
                restarted = True
                self.emit("message", task, message=f"{url} does not support resuming; restarting from zero")
                self.emit("advance", task, done=0, total=size)
            elif stream.start != offset:
                raise FetchError(
                    f"{url}: asked for bytes from {offset}, got bytes from {stream.start}", transient=True, url=url
                )
            if stream.total is not None and stream.total != size:
                raise SizeMismatchError(
                    f"{task}: {url} serves {stream.total} bytes, expected {size}",
                    "the mirror has another file under this name; report it to the publisher",
                    url=url,
                )
            if stream.length is not None and part.offset + stream.length != size:
                raise SizeMismatchError(
                    f"{task}: {url} announces {part.offset + stream.length} bytes, expected {size}",
                    "the mirror has another file under this name; report it to the publisher",
                    url=url,
                )
            last = time.monotonic()
            emit = self._progress is not None
            for chunk in stream.chunks(self.chunk_size):
                if self.cancel.is_set():
                    self.check_cancel()
                if len(chunk) > size - part.offset:
                    part.reset()
                    self.emit("advance", task, done=0, total=size)
                    raise SizeMismatchError(
                        f"{task}: {url} sent more than the declared {size} bytes",
                        "the mirror has another file under this name; report it to the publisher",
                        url=url,
                    )
                try:
                    part.write(chunk)
                except OSError as exc:
                    raise _write_error(exc, part.path) from None
                if emit:
                    now = time.monotonic()
                    if now - last >= PROGRESS_INTERVAL:
                        last = now
                        self.emit("advance", task, done=part.offset, total=size)
            if part.offset < size:
                raise FetchError(
                    f"{url}: connection closed after {part.offset} of {size} bytes", transient=True, url=url
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


def _write_error(exc: OSError, path: Path) -> ArtifactError:
    import errno

    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        return DiskSpaceError(
            f"the disk filled up while writing {path}",
            "free some space; the download resumes where it stopped",
        )
    return ArtifactError(f"cannot write {path} ({exc.strerror or exc})")


def _final_error(ref: ArtifactRef, failures: Sequence[FetchError]) -> FetchError:
    if not failures:
        return FetchError(f"{ref.name}: no URL to download it from", "the manifest lists no mirror for this file")
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
    return FetchError(f"{ref.name}: all {len(failures)} mirrors failed: {detail}", failures[-1].hint)


def _validate(ref: ArtifactRef, need_urls: bool) -> None:
    try:
        check_sha256(ref.sha256)
    except ValueError as exc:
        raise ArtifactError(f"{ref.name}: {exc}") from None
    if isinstance(ref.size, bool) or not isinstance(ref.size, int) or ref.size < 0:
        raise ArtifactError(f"{ref.name}: size must be a non-negative integer, got {ref.size!r}")
    if need_urls:
        if not ref.urls:
            raise FetchError(f"{ref.name}: no URL to download it from", "the manifest lists no mirror for this file")
        for url in ref.urls:
            check_url(url)


def check_disk_space(cache: Cache, needed: int, *, headroom: Optional[int] = None) -> None:
    """Raise :class:`DiskSpaceError` unless ``needed`` bytes (plus headroom) fit in the cache."""
    import psutil

    if headroom is None:
        headroom = DISK_HEADROOM
    if needed <= 0:
        return
    cache.ensure()
    free = psutil.disk_usage(str(cache.root)).free
    if free < needed + headroom:
        raise DiskSpaceError(
            f"not enough free disk space in {cache.root}: the download needs {_fmt_bytes(needed)} "
            f"({needed} bytes), {_fmt_bytes(free)} is free",
            f"free at least {_fmt_bytes(needed + headroom - free)}, or point ACCELSTACK_CACHE at a bigger disk",
        )


def fetch(
    refs: Iterable[ArtifactRef],
    *,
    cache: Union[Cache, str, Path, None] = None,
    progress: Optional[ProgressCallback] = None,
    offline: Optional[bool] = None,
    max_workers: int = 4,
    transport: Optional[Transport] = None,
    retry: Optional[RetryPolicy] = None,
    verify_cached: bool = True,
    check_disk: bool = True,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    fsync: Optional[bool] = None,
) -> Dict[str, Path]:
    """Make every ref available in the cache; return ``{sha256: path}``.

    ``cache``: a :class:`Cache`, a directory, or ``None`` for the default (``ACCELSTACK_CACHE`` or
    the user cache dir). ``offline``: ``None`` reads ``ACCELSTACK_OFFLINE``; when on, no network
    is used and a missing file raises :class:`OfflineError`. ``verify_cached`` re-hashes cached
    blobs before trusting them (a blob that fails is fetched again). ``transport`` and ``retry``
    set timeouts, redirects and backoff. At most ``max_workers`` files download at once.
    ``fsync`` flushes each file to disk before its rename into place; by default only when
    ``verify_cached`` is off (with it on, a blob torn by a power cut is caught by the re-hash on
    its next use and fetched again, so the flush would only cost time).

    Raises :class:`FetchError` (or a subclass) for a file that no mirror could serve correctly,
    after the other files of the batch have finished; several failures are reported together.
    """
    refs = list(refs)
    store = cache if isinstance(cache, Cache) else Cache(cache)
    if offline is None:
        offline = offline_from_env()

    # One task per distinct blob.
    unique: Dict[str, ArtifactRef] = {}
    for ref in refs:
        _validate(ref, need_urls=False)
        seen = unique.get(ref.sha256)
        if seen is None:
            unique[ref.sha256] = ref
        elif seen.size != ref.size:
            raise ArtifactError(
                f"{ref.name} and {seen.name} have the same sha256 but different sizes ({ref.size} vs {seen.size})"
            )
        else:
            # Same content under several names: pool the mirrors.
            extra = [u for u in ref.urls if u not in seen.urls]
            if extra:
                unique[ref.sha256] = ArtifactRef(seen.name, seen.sha256, seen.size, list(seen.urls) + extra)
    names: Dict[str, int] = {}
    for ref in unique.values():
        names[ref.name] = names.get(ref.name, 0) + 1
    tasks = {
        sha: (ref.name if names[ref.name] == 1 else f"{ref.name} ({sha[:12]})") for sha, ref in unique.items()
    }

    if offline:
        missing = [r for r in unique.values() if not store.valid(r.sha256, r.size, verify=verify_cached)]
        if missing:
            listed = ", ".join(r.name for r in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            raise OfflineError(
                f"offline mode: {len(missing)} file(s) are not in the cache ({store.root}): {listed}",
                f"run once with network access, or unset {OFFLINE_ENV} / drop --offline",
            )
        result = {}
        for sha, ref in unique.items():
            path = store.blob_path(sha)
            if progress is not None:
                extra = {"sha256": sha, "cached": True, "resumed": 0}
                progress(ProgressEvent("start", STAGE, tasks[sha], done=ref.size, total=ref.size, extra=extra))
                progress(ProgressEvent("end", STAGE, tasks[sha], done=ref.size, total=ref.size, ok=True,
                                       extra={**extra, "path": str(path)}))
            result[sha] = path
        return result

    todo = list(unique.values())
    needed = 0
    for ref in todo:
        for url in ref.urls:
            check_url(url)
        if not store.valid(ref.sha256, ref.size, verify=False):  # cached ones are re-verified by the worker
            _validate(ref, need_urls=True)
            needed += max(0, ref.size - min(store.part_size(ref.sha256), ref.size))
    if check_disk:
        check_disk_space(store, needed)
    store.ensure()

    own_transport = transport is None
    if transport is None:
        transport = Transport()
    if fsync is None:
        fsync = not verify_cached
    batch = _Batch(store, transport, retry or RetryPolicy(), progress, verify_cached, chunk_size, fsync)
    total = sum(r.size for r in todo)
    batch.emit("start", "", done=0, total=total, extra={"files": len(todo)})
    results: Dict[str, Path] = {}
    errors: Dict[str, BaseException] = {}
    try:
        if len(todo) <= 1 or max_workers <= 1:
            for ref in todo:
                try:
                    results[ref.sha256] = batch.fetch_ref(ref, tasks[ref.sha256])
                except Exception as exc:  # noqa: BLE001 - collected and re-raised below
                    errors[ref.sha256] = exc
        else:
            _run_pool(batch, todo, tasks, max_workers, results, errors)
    except BaseException:
        batch.emit("end", "", done=0, total=total, ok=False, message="cancelled")
        raise
    finally:
        if own_transport:
            transport.close()
    batch.emit("end", "", done=total, total=total, ok=not errors,
               message="" if not errors else f"{len(errors)} file(s) failed")
    if errors:
        ordered = [errors[r.sha256] for r in todo if r.sha256 in errors]
        if len(ordered) == 1:
            raise ordered[0]
        for exc in ordered:
            if not isinstance(exc, ArtifactError):
                raise exc  # a bug, or an exception from the progress callback
        detail = "; ".join(f"{tasks[r.sha256]}: {getattr(errors[r.sha256], 'message', errors[r.sha256])}"
                           for r in todo if r.sha256 in errors)
        raise FetchError(f"{len(ordered)} files could not be fetched: {detail}", getattr(ordered[0], "hint", None))
    return {sha: results[sha] for sha in unique}


def _run_pool(
    batch: _Batch,
    todo: List[ArtifactRef],
    tasks: Dict[str, str],
    max_workers: int,
    results: Dict[str, Path],
    errors: Dict[str, BaseException],
) -> None:
    pool = ThreadPoolExecutor(max_workers=min(max_workers, len(todo)), thread_name_prefix="accelstack-fetch")
    futures = {pool.submit(batch.fetch_ref, ref, tasks[ref.sha256]): ref for ref in todo}
    try:
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            for fut in done:
                ref = futures[fut]
                exc = fut.exception()
                if exc is None:
                    results[ref.sha256] = fut.result()
                else:
                    errors[ref.sha256] = exc
    except BaseException:
        # Ctrl-C: stop the workers at their next chunk; partial files stay for the next run.
        batch.cancel_all()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def fetch_one(ref: ArtifactRef, **kwargs) -> Path:
    """:func:`fetch` for a single ref; returns its path."""
    return fetch([ref], **kwargs)[ref.sha256]
