"""The content-addressed download cache.

Layout under the cache root (``Settings.cache``: ``ACCELSTACK_CACHE``, else the user cache dir)::

    blobs/sha256/<hex>        a verified file, read-only, named by its sha256
    blobs/sha256/<hex>.part   bytes downloaded so far (resumed with an HTTP Range request)
    blobs/sha256/<hex>.lock   the per-blob lock file (held while downloading or placing)
    blobs/sha256/<hex>.verified  the blob's size, mtime_ns, inode and device when its sha256 was
                              last checked (a small JSON document, replaced atomically); only
                              ``{"sha256": <hex>}`` for a blob placed without a flush. Naming the
                              blob, it is also what makes the blob accelstack's to delete (gc, purge)

A blob only ever appears at its final path by an atomic rename of a ``.part`` whose hash was
checked, so a file at ``blobs/sha256/<hex>`` is either complete or absent. Lock files stay behind
(that is normal for file locks) and are tiny.

Re-hashing a multi-GB blob on every use costs seconds, so a blob whose stat still matches its
``.verified`` record is trusted without reading it; any change of size, mtime or inode (a
rewrite, a copy, a restore from backup) makes the next use hash it again. That catches accidents
(a torn write, a truncation, a file replaced), not a deliberate same-size edit that restores the
mtime: ``deep=True`` (``repair``, ``verify --deep``) re-hashes every blob whatever its record says.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Any, Dict, Optional, Union

from ..fsio import fsync_dir, try_write_bytes
from ..limits import MalformedInput, parse_json
from .errors import CacheError

__all__ = ["ENTRY_NAME", "HASH_CHUNK", "MAX_STAMP_BYTES", "STAMP_SUFFIX", "Cache", "check_sha256", "hash_file", "remove_file"]

HASH_CHUNK = 1 << 20
STAMP_SUFFIX = ".verified"
# what this cache writes in blobs/sha256: <hex>, <hex>.part (a resumable download), <hex>.verified (its stamp)
ENTRY_NAME = re.compile(r"^[0-9a-f]{64}(\.part|\.verified)?\Z")
MAX_STAMP_BYTES = 1024  # {"sha256": 64 hex, four integers}: ~200 bytes
_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")  # \Z: "$" would accept a trailing newline


def check_sha256(value: str) -> str:
    """Return ``value`` if it is 64 lowercase hex digits, else raise ``ValueError``."""
    if not isinstance(value, str) or not _HEX64.match(value):
        raise ValueError(f"not a sha256 (64 lowercase hex digits): {value!r}")
    return value


def hash_file(path: Union[str, Path], limit: Optional[int] = None) -> hashlib._Hash:
    """The sha256 object of the first ``limit`` bytes (all when ``None``) of ``path``, a regular
    file (``OSError`` for a FIFO or a device planted there: opened without blocking, never read)."""
    h = hashlib.sha256()
    remaining = limit
    fd = os.open(os.fspath(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    with os.fdopen(fd, "rb") as fh:
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
    """A content-addressed blob store rooted at ``root`` (``Settings.cache``)."""

    def __init__(self, root: Union[str, Path]) -> None:
        self.root = Path(root).expanduser()

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

    def stamp_path(self, sha256: str) -> Path:
        return self.blob_dir / (check_sha256(sha256) + STAMP_SUFFIX)

    def lock_path(self, sha256: str) -> Path:
        return self.blob_dir / (check_sha256(sha256) + ".lock")

    def lock(self, sha256: str) -> Any:
        """The per-blob inter-process lock (a ``filelock.FileLock``; use as a context manager)."""
        import filelock  # here: a cache only read (generate's runtime lookup) takes no lock

        self.ensure()
        return filelock.FileLock(str(self.lock_path(sha256)))

    def part_size(self, sha256: str) -> int:
        try:
            return self.part_path(sha256).stat().st_size
        except OSError:
            return 0

    def valid(self, sha256: str, size: int, *, verify: bool = True, deep: bool = False) -> bool:
        """True if the blob is present with ``size`` bytes (and, with ``verify``, the right hash).

        With ``verify``, a blob whose size, mtime and inode match its ``.verified`` record is
        trusted without reading it; otherwise (or with ``deep``) it is hashed, and a match is
        recorded. Safe under the blob's lock (the record is replaced atomically); a blob that
        fails is replaced by the next download of it (see :mod:`.download`).
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
        if not deep and self._stamp_matches(sha256, st):
            return True
        try:
            ok = hash_file(path).hexdigest() == sha256
        except OSError:
            return False
        if ok:
            self._write_stamp(sha256, st)
        else:
            self._remove_stamp(sha256)
        return ok

    def remove(self, sha256: str) -> None:
        """Delete the blob and its ``.verified`` record (a damaged blob, or garbage collection)."""
        self._remove_stamp(sha256)
        remove_file(self.blob_path(sha256))

    # -- the .verified record -----------------------------------------------------------------
    @staticmethod
    def _stamp_of(sha256: str, st: os.stat_result) -> Dict[str, Any]:
        return {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino,
                "device": st.st_dev}

    def _stamp_matches(self, sha256: str, st: os.stat_result) -> bool:
        return self._read_stamp(sha256) == self._stamp_of(sha256, st)

    def placed(self, sha256: str) -> bool:
        """Whether the file at the blob's path is one accelstack placed: its ``.verified`` record
        names it. ``gc`` deletes only such blobs, never a file that is only named like one."""
        record = self._read_stamp(sha256)
        return isinstance(record, dict) and record.get("sha256") == sha256

    def _read_stamp(self, sha256: str) -> Any:
        path = self.stamp_path(sha256)
        try:
            fd = os.open(str(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None  # never block on a FIFO planted as a record
            data = os.read(fd, MAX_STAMP_BYTES + 1)
        except OSError:
            return None
        finally:
            os.close(fd)
        try:
            return parse_json(data, what=str(path), max_bytes=MAX_STAMP_BYTES, max_depth=2)
        except MalformedInput:
            return None

    def _write_stamp(self, sha256: str, st: os.stat_result) -> None:
        """Record that the blob with stat ``st`` hashed to ``sha256``; best effort (a cache on a
        read-only disk just hashes again next time)."""
        try_write_bytes(self.stamp_path(sha256), json.dumps(self._stamp_of(sha256, st), sort_keys=True).encode())

    def _remove_stamp(self, sha256: str) -> None:
        try:
            remove_file(self.stamp_path(sha256))
        except OSError:
            pass

    def place(self, part: Path, sha256: str, *, durable: bool = True) -> Path:
        """Atomically move a verified ``.part`` into place, read-only. Call under the blob's lock.

        ``durable`` (the part was flushed to disk) also syncs the directory so the rename survives
        a power cut, and records the blob as verified.
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
            fsync_dir(final.parent)
            # Its hash was checked while it streamed in, and it is on disk: trusted from now on.
            # A blob placed without a flush is hashed once more on its first reuse instead, so
            # that a power cut before the writeback cannot leave a torn blob with a record.
            try:
                self._write_stamp(sha256, final.stat())
            except OSError:
                pass
        else:  # a record naming the blob without its stat: not trusted (hashed on reuse), but ours (gc, purge)
            try_write_bytes(self.stamp_path(sha256), json.dumps({"sha256": sha256}).encode())
        return final

