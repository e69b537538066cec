"""Artifacts: the only code that talks to the network.

Fetch files known by content (:class:`ArtifactRef`: name, sha256, size, mirror URLs) into a
content-addressed cache, verified, resumable and locked; unpack archives safely.

    from accelstack.artifacts import ArtifactRef, fetch, unpack
    paths = fetch(refs, progress=callback)      # {sha256: Path}
    unpack(paths[ref.sha256], target_dir)

See ``docs/artifacts.md``.
"""
from __future__ import annotations

from .cache import CACHE_ENV, Cache, default_cache_dir
from .errors import (
    ArchiveFormatError,
    ArtifactError,
    CacheError,
    DiskSpaceError,
    FetchCancelled,
    FetchError,
    HashMismatchError,
    InsecureURLError,
    OfflineError,
    SizeMismatchError,
    UnsafeArchiveError,
)
from .fetch import OFFLINE_ENV, RetryPolicy, check_disk_space, fetch, fetch_one, offline_from_env
from ..refs import ArtifactRef
from .transport import Transport, check_url
from .unpack import detect_format, unpack

__all__ = [
    "ArtifactRef",
    "fetch",
    "fetch_one",
    "unpack",
    "detect_format",
    "Cache",
    "default_cache_dir",
    "CACHE_ENV",
    "OFFLINE_ENV",
    "offline_from_env",
    "RetryPolicy",
    "Transport",
    "check_url",
    "check_disk_space",
    "ArtifactError",
    "FetchError",
    "HashMismatchError",
    "SizeMismatchError",
    "InsecureURLError",
    "OfflineError",
    "FetchCancelled",
    "DiskSpaceError",
    "CacheError",
    "UnsafeArchiveError",
    "ArchiveFormatError",
]
