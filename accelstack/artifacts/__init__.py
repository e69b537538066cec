"""Artifacts: the only code that talks to the network.

Fetch files known by content (:class:`~accelstack.refs.ArtifactRef`: name, sha256, size, mirror
URLs) into a content-addressed cache, verified, resumable and locked; unpack archives safely.

    from accelstack.artifacts import ArtifactRef, fetch, unpack
    paths = fetch(refs, cache=settings.cache, offline=settings.offline, progress=callback)  # {sha256: Path}
    unpack(paths[ref.sha256], target_dir)

Names are imported on first use, so ``import accelstack.artifacts.cache`` (the installer's
garbage collection) does not load the HTTP stack. See ``docs/artifacts.md``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:
    from ..refs import ArtifactRef
    from .archive import detect_format, unpack
    from .batch import check_disk_space, fetch, fetch_one
    from .cache import Cache
    from .documents import Page, fetch_document, fetch_optional_document, fetch_page
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
        SlowTransferError,
        UnsafeArchiveError,
    )
    from .reach import host_problem
    from .retry import RetryPolicy
    from .transport import Transport, check_url

_EXPORTS = {
    "ArtifactRef": "accelstack.refs",
    "Cache": "accelstack.artifacts.cache",
    "fetch_document": "accelstack.artifacts.documents",
    "fetch_optional_document": "accelstack.artifacts.documents",
    "fetch_page": "accelstack.artifacts.documents",
    "Page": "accelstack.artifacts.documents",
    "fetch": "accelstack.artifacts.batch",
    "fetch_one": "accelstack.artifacts.batch",
    "check_disk_space": "accelstack.artifacts.batch",
    "RetryPolicy": "accelstack.artifacts.retry",
    "Transport": "accelstack.artifacts.transport",
    "host_problem": "accelstack.artifacts.reach",
    "check_url": "accelstack.artifacts.transport",
    "unpack": "accelstack.artifacts.archive",
    "detect_format": "accelstack.artifacts.archive",
    **{name: "accelstack.artifacts.errors" for name in (
        "ArtifactError", "FetchError", "HashMismatchError", "SizeMismatchError", "InsecureURLError", "OfflineError",
        "FetchCancelled", "DiskSpaceError", "CacheError", "UnsafeArchiveError", "ArchiveFormatError",
        "SlowTransferError")},
}

__all__ = [
    "ArchiveFormatError", "ArtifactError", "ArtifactRef", "Cache", "CacheError", "DiskSpaceError", "FetchCancelled",
    "FetchError", "HashMismatchError", "InsecureURLError", "OfflineError", "Page", "RetryPolicy", "SizeMismatchError",
    "SlowTransferError",
    "Transport", "UnsafeArchiveError", "check_disk_space", "check_url", "detect_format", "fetch", "fetch_document",
    "fetch_one", "fetch_optional_document", "fetch_page", "host_problem", "unpack",
]


if not TYPE_CHECKING:  # a type checker sees the names above, and no others
    __getattr__ = lazy_exports(__name__, _EXPORTS, globals())


def __dir__() -> list:
    return sorted(set(globals()) | set(_EXPORTS))
