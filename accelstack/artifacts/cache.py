"""The content-addressed download cache.

Layout under the cache root (``Settings.cache``: ``ACCELSTACK_CACHE``, else the user cache dir)::

    blobs/sha256/<hex>        a verified file, read-only, named by its sha256
    blobs/sha256/<hex>.part   bytes downloaded so far (resumed with an HTTP Range request)
    blobs/sha256/<hex>.lock   the per-blob lock file (held while downloading or placing)

A blob only ever appears at its final path by an atomic rename of a ``.part`` whose hash was
checked, so a file at ``blobs/sha256/<hex>`` is either complete or absent. Lock files stay behind
(that is normal for file locks) and are tiny.
"""
from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path
from typing import Any, Optional, Union

from ..settings import Settings
from .errors import CacheError

HASH_CHUNK = 1 << 20
_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")  # \Z: "$" would accept a trailing newline


def check_sha256(value: str) -> str:
    """Return ``value`` if it is 64 lowercase hex digits, else raise ``ValueError``."""
    if not isinstance(value, str) or not _HEX64.match(value):
        raise ValueError(f"not a sha256 (64 lowercase hex digits): {value!r}")
    return value


def hash_file(path: Union[str, Path], limit: Optional[int] = None) -> hashlib._Hash:
    """The sha256 object of the first ``limit`` bytes (all when ``None``) of ``path``."""
    h = hashlib.sha256()
    remaining = limit
    with open(path, "rb") as fh:
        while remaining is None or remaining > 0:
            want = HASH_CHUNK if remaining is None else min(HASH_CHUNK, remaining)
            data = fh.read(want)
            if not data:
                break
            h.update(data)
            if remaining is not None:
                remaining -= len(data)
    return h


def remove_file(path: Path) -> None:
    """Delete ``path`` if it exists, read-only or not."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except PermissionError:
        # Windows refuses to delete read-only files.
        try:
            os.chmod(path, stat.S_IWRITE | stat.S_IREAD)
            os.unlink(path)
        except FileNotFoundError:
            pass


class Cache:
    """A content-addressed blob store rooted at ``root`` (default: ``Settings.resolve().cache``)."""

    def __init__(self, root: Union[str, Path, None] = None) -> None:
        self.root = Path(root).expanduser() if root is not None else Settings.resolve().cache

    def __repr__(self) -> str:
        return f"Cache({str(self.root)!r})"

    @property
    def blob_dir(self) -> Path:
        return self.root / "blobs" / "sha256"

    def ensure(self) -> None:
        try:
            self.blob_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(
                f"cannot create the download cache at {self.blob_dir} ({exc.strerror or exc})",
                "use a writable directory for the download cache",
            ) from None

    def blob_path(self, sha256: str) -> Path:
        return self.blob_dir / check_sha256(sha256)

    def part_path(self, sha256: str) -> Path:
        return self.blob_dir / (check_sha256(sha256) + ".part")

    def lock_path(self, sha256: str) -> Path:
        return self.blob_dir / (check_sha256(sha256) + ".lock")

    def lock(self, sha256: str) -> Any:
        """The per-blob inter-process lock (a ``filelock.FileLock``; use as a context manager)."""
        import filelock

        self.ensure()
        return filelock.FileLock(str(self.lock_path(sha256)))

    def part_size(self, sha256: str) -> int:
        try:
            return self.part_path(sha256).stat().st_size
        except OSError:
            return 0

    def valid(self, sha256: str, size: int, *, verify: bool = True) -> bool:
        """True if the blob is present with ``size`` bytes (and, with ``verify``, the right hash).

        Has no side effects, so it is safe under the blob's lock; a blob that fails is replaced by
        the next download of it (see :mod:`.download`).
        """
        path = self.blob_path(sha256)
        try:
            st = path.stat()
        except OSError:
            return False
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            return False
        if not verify:
            return True
        try:
            return hash_file(path).hexdigest() == sha256
        except OSError:
            return False

    def place(self, part: Path, sha256: str, *, durable: bool = True) -> Path:
        """Atomically move a verified ``.part`` into place, read-only. Call under the blob's lock.

        ``durable`` also syncs the directory so the rename survives a power cut.
        """
        final = self.blob_path(sha256)
        try:
            os.chmod(part, 0o444)
        except OSError:
            pass
        try:
            os.replace(part, final)
        except PermissionError:
            remove_file(final)
            os.replace(part, final)
        if durable:
            _fsync_dir(final.parent)
        return final


def _fsync_dir(path: Path) -> None:
    """Make a rename durable (POSIX); a no-op where directories cannot be opened."""
    if os.name != "posix":
        return
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
