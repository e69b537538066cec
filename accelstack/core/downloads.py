"""One file into the verified download cache, by URL and sha256 (``accelstack fetch``: publishers
and debugging), with the cache and the offline switch of the caller's settings."""
from __future__ import annotations

from pathlib import Path

from ..artifacts import Cache, RetryPolicy, Transport, fetch
from ..artifacts.cache import check_sha256
from ..events import ProgressCallback, null_progress
from ..refs import ArtifactRef
from ..settings import Settings

__all__ = ["check_sha256", "fetch_file"]


def fetch_file(ref: ArtifactRef, settings: Settings, *, connect_timeout: float, read_timeout: float, retries: int,
               deep: bool = False, progress: ProgressCallback = null_progress) -> Path:
    """The cached path of ``ref``: downloaded (resumed, hashed while streaming, mirrors in order)
    unless a verified copy is there; ``deep`` re-hashes that copy. Offline as the settings say."""
    transport = Transport(connect_timeout=connect_timeout, read_timeout=read_timeout, min_rate=settings.timeouts.min_rate)
    with transport:
        paths = fetch([ref], cache=Cache(settings.cache), progress=progress, offline=settings.offline,
                      transport=transport, retry=RetryPolicy(retries=retries), deep=deep)
    return paths[ref.sha256]
