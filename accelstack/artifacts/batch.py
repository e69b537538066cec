"""Fetch artifacts into the content-addressed cache: resumable, hashed while streaming, locked.

    from accelstack.artifacts import ArtifactRef, fetch
    paths = fetch([ArtifactRef("model.gguf", sha256, size, [url, mirror])], cache=settings.cache,
                  offline=settings.offline)
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
  are not; then the next mirror is tried. Each request has an overall deadline from the file's
  size and the transport's minimum rate (a server that drips bytes is given up, not waited for:
  :class:`~.errors.SlowTransferError`, and the next mirror resumes from what arrived). A hash mismatch deletes the part and tries the next
  mirror; the final error names both hashes.
* Free disk space for the whole batch is checked before anything is downloaded.
* Progress is reported as :class:`~accelstack.events.ProgressEvent` (stage ``fetch``): the batch
  is the task ``""`` (its ``total`` the batch's bytes), each file the task named after it.
  ``start`` events of a resumed file carry ``done`` = the resumed offset. Callbacks are called
  from worker threads, one at a time (never concurrently).

This module runs a batch; one file's download is :mod:`.download`, the part file being written
:mod:`.partfile`, the retry policy :mod:`.retry`, and the network :mod:`.transport`.
"""
from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import psutil

from ..errors import Action
from ..events import ProgressCallback, ProgressEvent
from ..refs import ArtifactRef
from ..serde import plural, size_text
from ..settings import Timeouts
from .cache import Cache, check_sha256
from .download import STAGE, Downloader
from .errors import ArtifactError, DiskSpaceError, FetchError, OfflineError
from .retry import RetryPolicy
from .transport import DEFAULT_CHUNK_SIZE, Transport, check_url

__all__ = ["DISK_HEADROOM", "check_disk_space", "fetch", "fetch_one"]

DISK_HEADROOM = 16 << 20  # keep this much free beyond what the batch needs


def _validate(ref: ArtifactRef, need_urls: bool) -> None:
    try:
        check_sha256(ref.sha256)
    except ValueError as exc:
        raise ArtifactError(f"{ref.name}: {exc}") from None
    if isinstance(ref.size, bool) or not isinstance(ref.size, int) or ref.size < 0:
        raise ArtifactError(f"{ref.name}: size must be a non-negative integer, got {ref.size!r}")
    if need_urls:
        if not ref.urls:
            raise FetchError(f"{ref.name}: no URL to download it from", "the manifest lists no mirror for this file: report it to its publisher",
                             action=Action.NONE)
        for url in ref.urls:
            check_url(url)


def check_disk_space(cache: Cache, needed: int, *, headroom: Optional[int] = None) -> None:
    """Raise :class:`DiskSpaceError` unless ``needed`` bytes (plus headroom) fit in the cache."""
    if headroom is None:
        headroom = DISK_HEADROOM
    if needed <= 0:
        return
    cache.ensure()
    free = psutil.disk_usage(str(cache.root)).free
    if free < needed + headroom:
        raise DiskSpaceError(
            f"not enough free disk space in {cache.root}: the download needs {size_text(needed)} "
            f"({needed} bytes), {size_text(free)} is free",
            f"free at least {size_text(needed + headroom - free)}, or use a download cache on a bigger disk",
        )


def fetch(
    refs: Iterable[ArtifactRef],
    *,
    cache: Union[Cache, str, Path],
    offline: bool,
    progress: Optional[ProgressCallback] = None,
    max_workers: int = 4,
    transport: Optional[Transport] = None,
    retry: Optional[RetryPolicy] = None,
    verify_cached: bool = True,
    check_disk: bool = True,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    fsync: Optional[bool] = None,
    deep: bool = False,
    timeouts: Optional[Timeouts] = None,
) -> Dict[str, Path]:
    """Make every ref available in the cache; return ``{sha256: path}``.

    ``cache``: a :class:`Cache` or its directory (``Settings.cache``). ``offline``
    (``Settings.offline``): no network is used and a missing file raises :class:`OfflineError`.
    ``verify_cached`` re-hashes cached blobs before trusting them (a blob that fails is fetched
    again); a blob whose size, mtime and inode still match the record of its last check is
    trusted without reading it, unless ``deep`` (for
    ``repair`` and ``verify --deep``: every cached blob is re-hashed). ``transport`` and ``retry`` set timeouts,
    redirects and backoff (``timeouts``, ``Settings.timeouts``: those of a transport made here). At most ``max_workers`` files download at once. ``fsync`` flushes each
    file to disk before its rename into place; by default only when ``verify_cached`` is off
    (with it on, a blob placed without the flush is hashed once more on its first reuse before
    its size/mtime/inode record is written, so a blob torn by a power cut is caught and fetched
    again; the flush would only cost time).

    Raises :class:`FetchError` (or a subclass) for a file that no mirror could serve correctly,
    after the other files of the batch have finished; several failures are reported together.
    """
    store = cache if isinstance(cache, Cache) else Cache(cache)
    unique, tasks = _unique(refs)
    if offline:
        return _from_cache_only(store, unique, tasks, progress, verify_cached, deep)

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
        transport = Transport.from_timeouts(timeouts)
    if fsync is None:
        fsync = not verify_cached
    batch = Downloader(store, transport, retry or RetryPolicy(), progress, verify_cached, chunk_size, fsync, deep)
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
               message="" if not errors else f"{plural(len(errors), 'file')} failed")
    if errors:
        raise _batch_error([errors[r.sha256] for r in todo if r.sha256 in errors],
                           [tasks[r.sha256] for r in todo if r.sha256 in errors])
    return {sha: results[sha] for sha in unique}


def _unique(refs: Iterable[ArtifactRef]) -> Tuple[Dict[str, ArtifactRef], Dict[str, str]]:
    """One ref per distinct blob (mirrors pooled), and the task name of each in progress events."""
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
    tasks = {sha: (ref.name if names[ref.name] == 1 else f"{ref.name} ({sha[:12]})") for sha, ref in unique.items()}
    return unique, tasks


def _from_cache_only(store: Cache, unique: Dict[str, ArtifactRef], tasks: Dict[str, str],
                     progress: Optional[ProgressCallback], verify_cached: bool, deep: bool) -> Dict[str, Path]:
    """Offline mode: every file from the cache, or :class:`OfflineError` naming the missing ones."""
    missing = [r for r in unique.values()
               if not store.valid(r.sha256, r.size, verify=verify_cached or deep, deep=deep)]
    if missing:
        listed = ", ".join(r.name for r in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise OfflineError(
            f"offline mode: {plural(len(missing), 'file')} {'is' if len(missing) == 1 else 'are'} not in the cache "
            f"({store.root}): {listed}",
            "connect to the network once to download them, or leave offline mode",
        )
    result = {}
    for sha, ref in unique.items():
        path = store.blob_path(sha)
        if progress is not None:
            extra: Dict[str, Any] = {"sha256": sha, "cached": True, "resumed": 0}
            progress(ProgressEvent("start", STAGE, tasks[sha], done=ref.size, total=ref.size, extra=extra))
            progress(ProgressEvent("end", STAGE, tasks[sha], done=ref.size, total=ref.size, ok=True,
                                   extra={**extra, "path": str(path)}))
        result[sha] = path
    return result


def _batch_error(failures: List[BaseException], names: List[str]) -> BaseException:
    """The one exception that reports every failed file of a batch."""
    if len(failures) == 1:
        return failures[0]
    for exc in failures:
        if not isinstance(exc, ArtifactError):
            return exc  # a bug, or an exception from the progress callback
    detail = "; ".join(f"{name}: {getattr(exc, 'message', exc)}" for name, exc in zip(names, failures))
    first = failures[0]
    return FetchError(f"{plural(len(failures), 'file')} could not be fetched: {detail}", getattr(first, "hint", None),
                      action=getattr(first, "action", None))


def _run_pool(
    batch: Downloader,
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


def fetch_one(ref: ArtifactRef, **kwargs: Any) -> Path:
    """:func:`fetch` for a single ref (``cache`` and ``offline`` are required too); returns its path."""
    return fetch([ref], **kwargs)[ref.sha256]
