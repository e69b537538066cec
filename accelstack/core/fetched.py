"""An injected fetcher's files, checked again by the core before the installer touches them.

A fetcher an app hands the core (``Services(fetcher=...)``) is a way to the bytes, never a source
of trust: python-tuf's ``Updater`` re-verifies whatever its fetcher returns, and so does the core.
Each returned path must be a regular file (not a link, FIFO or device) of the size and sha256 the
signed manifest gives; anything else is a typed error and nothing is installed. The core's own
fetcher (``NetworkFetcher``) hashes while it streams into the content-addressed cache, so it is
not checked twice.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Sequence

from ..artifacts.cache import hash_file
from ..artifacts.errors import FetchError, HashMismatchError, SizeMismatchError
from ..errors import Action
from ..events import ProgressCallback, null_progress
from ..refs import ArtifactRef
from .sources import Fetcher

__all__ = ["CheckedFetcher", "NotAFileError", "check_fetched"]

_HINT = "the fetcher the app passed to accelstack returned it; report this to the app's makers"


class NotAFileError(FetchError):
    """An injected fetcher returned no file, a link, a FIFO or a device for a reference."""

    default_action = Action.REPORT_BUG


def check_fetched(ref: ArtifactRef, path: Optional[Path]) -> Path:
    """``path`` when it is a regular file of ``ref``'s size and sha256, else the typed error."""
    what = f"the fetcher returned {path} for {ref.name}" if path is not None else f"the fetcher returned no file for {ref.name}"
    try:
        st = os.lstat(path) if path is not None else None
    except OSError as exc:
        raise NotAFileError(f"{what}: {exc.strerror or exc}", _HINT) from None
    if st is None or not stat.S_ISREG(st.st_mode):
        raise NotAFileError(f"{what}: not a regular file" if st is not None else what, _HINT)
    assert path is not None
    if st.st_size != ref.size:
        raise SizeMismatchError(f"{what}: {st.st_size} bytes where the signed manifest says {ref.size}", _HINT)
    try:
        actual = hash_file(path).hexdigest()
    except OSError as exc:
        raise NotAFileError(f"{what}: {exc.strerror or exc}", _HINT) from None
    if actual != ref.sha256:
        raise HashMismatchError(f"{what}: its sha256 is {actual}, the signed manifest's {ref.sha256}",
                                expected=ref.sha256, actual=actual, hint=_HINT)
    return path


@dataclass
class CheckedFetcher:
    """``inner`` (an app's fetcher) with every file it returns checked by :func:`check_fetched`."""

    inner: Fetcher

    def files(self, refs: Sequence[ArtifactRef], *, progress: ProgressCallback = null_progress,
              deep: bool = False, offline: Optional[bool] = None) -> Dict[str, Path]:
        paths = self.inner.files(refs, progress=progress, deep=deep, offline=offline)
        return {ref.sha256: check_fetched(ref, Path(paths[ref.sha256]) if ref.sha256 in paths else None)
                for ref in refs}

    def document(self, url: str) -> bytes:
        return self.inner.document(url)  # documents are checked by their signatures

    def optional_document(self, url: str) -> Optional[bytes]:
        return self.inner.optional_document(url)
