"""Writing archive members safely: names, links, sizes and counts checked before anything is written.

Used by :func:`accelstack.artifacts.archive.unpack`, which reads the archive formats; this module
only decides whether a member may be written and writes it (see that module's docstring for the
rules).
"""
from __future__ import annotations

import errno
import lzma
import os
import posixpath
import re
import shutil
import stat
import tarfile
import zipfile
import zlib
from pathlib import Path
from typing import IO, Callable, List, NoReturn, Optional, Set, Tuple, Type, TypeVar

from ..serde import plural, size_text
from .errors import ArchiveFormatError, ArtifactError, DiskSpaceError, UnsafeArchiveError

try:  # optional: only .tar.zst archives need it (unpack says so when it is missing)
    import zstandard
except ImportError:
    zstandard = None  # type: ignore[assignment]

__all__ = ["MAX_LINK_TARGET", "Extractor", "corrupt_errors"]

T = TypeVar("T")
_COPY_CHUNK = 1 << 20
_DRIVE = re.compile(r"^[A-Za-z]:")
MAX_LINK_TARGET = 4096  # bytes of a symlink target stored in an archive


def corrupt_errors() -> Tuple[Type[BaseException], ...]:
    """The exceptions the archive readers raise for corrupt input."""
    errors: List[Type[BaseException]] = [tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, lzma.LZMAError]
    if zstandard is not None:
        errors.append(zstandard.ZstdError)
    return tuple(errors)


def _mkdir(path: Path) -> Optional[os.stat_result]:
    """Create the directory ``path``: ``None`` when made, else what is already there (not followed)."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        os.mkdir(path, 0o755)
        return None


class Extractor:
    """Writes archive members under ``root``, refusing anything unsafe; knows no archive format."""

    def __init__(self, root: Path, archive: Path, *, max_bytes: int, max_files: int) -> None:
        self.root = Path(os.path.realpath(root))
        self.archive = archive
        self.max_bytes = max_bytes
        self.max_files = max_files
        self.total = 0
        self.count = 0
        self.links: List[Path] = []
        self.files: Set[str] = set()  # relative names of regular files extracted (hard-link targets)

    # -- names ----------------------------------------------------------------------------
    def relname(self, name: str) -> Optional[str]:
        """The normalised relative name, ``None`` for the archive root; raise if unsafe."""
        if "\x00" in name:
            raise UnsafeArchiveError(f"{self.archive}: member name with a NUL byte: {name!r}")
        clean = name.replace("\\", "/")
        if clean.startswith("/") or _DRIVE.match(clean):
            raise UnsafeArchiveError(f"{self.archive}: absolute path in archive: {name!r}")
        parts = [p for p in clean.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise UnsafeArchiveError(f"{self.archive}: path escapes the target with '..': {name!r}")
        return "/".join(parts) if parts else None

    def count_member(self, name: str) -> None:
        self.count += 1
        if self.count > self.max_files:
            raise UnsafeArchiveError(
                f"{self.archive}: more than {plural(self.max_files, 'member')} (archive bomb?)",
                "accelstack refuses archives with this many files as likely archive bombs; if it is genuine, report it to its publisher",
            )

    def add_bytes(self, n: int) -> None:
        self.total += n
        if self.total > self.max_bytes:
            raise UnsafeArchiveError(
                f"{self.archive}: expands to more than {size_text(self.max_bytes)} (archive bomb?)",
                "accelstack refuses archives this large as likely archive bombs; if it is genuine, report it to its publisher",
            )

    def _parent(self, rel: str) -> Path:
        """Create the parent directories of ``rel`` inside root; refuse to go through links."""
        current = self.root
        for part in rel.split("/")[:-1]:
            current = current / part
            st = _mkdir(current)
            if st is not None and not stat.S_ISDIR(st.st_mode):
                kind = "a link" if stat.S_ISLNK(st.st_mode) else "not a directory"
                raise UnsafeArchiveError(
                    f"{self.archive}: {rel!r} would be written through {current.relative_to(self.root)} ({kind})"
                )
        return current

    def _clear(self, path: Path, rel: str) -> None:
        """Make room for a member at ``path``: a duplicate regular file is replaced, nothing else."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if stat.S_ISREG(st.st_mode):
            os.unlink(path)
            self.files.discard(rel)
            return
        raise UnsafeArchiveError(f"{self.archive}: duplicate member {rel!r} over a directory or link")

    # -- members --------------------------------------------------------------------------
    def directory(self, rel: Optional[str]) -> None:
        if rel is None:
            return
        self._parent(rel)
        st = _mkdir(self.root / rel)
        if st is not None and not stat.S_ISDIR(st.st_mode):
            raise UnsafeArchiveError(f"{self.archive}: directory {rel!r} collides with a file or link")

    def file(self, rel: Optional[str], src: IO[bytes], mode: int, mtime: Optional[float], declared: Optional[int]) -> None:
        if rel is None:
            raise UnsafeArchiveError(f"{self.archive}: a file member without a name")
        if declared is not None and self.total + declared > self.max_bytes:
            self.add_bytes(declared)  # raises
        self._parent(rel)
        path = self.root / rel
        self._clear(path, rel)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
        fd = os.open(str(path), flags, 0o600)
        with os.fdopen(fd, "wb") as out:
            written = 0
            while True:
                data = src.read(_COPY_CHUNK)
                if not data:
                    break
                written += len(data)
                if declared is not None and written > declared:
                    raise UnsafeArchiveError(f"{self.archive}: {rel!r} is larger than its header says")
                self.add_bytes(len(data))
                out.write(data)
        os.chmod(path, 0o755 if mode & 0o111 else 0o644)
        if mtime is not None:
            try:
                os.utime(path, (mtime, mtime))
            except (OSError, OverflowError, ValueError):
                pass
        self.files.add(rel)

    def symlink(self, rel: Optional[str], target: str) -> None:
        if rel is None:
            raise UnsafeArchiveError(f"{self.archive}: a link member without a name")
        if not target or "\x00" in target:
            raise UnsafeArchiveError(f"{self.archive}: link {rel!r} has an empty or invalid target")
        clean = target.replace("\\", "/")
        if clean.startswith("/") or _DRIVE.match(clean):
            raise UnsafeArchiveError(f"{self.archive}: link {rel!r} points to an absolute path {target!r}")
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(rel), clean))
        if resolved == ".." or resolved.startswith("../"):
            raise UnsafeArchiveError(f"{self.archive}: link {rel!r} -> {target!r} points outside the target")
        self._parent(rel)
        path = self.root / rel
        self._clear(path, rel)
        os.symlink(clean, path)
        self.links.append(path)

    def hardlink(self, rel: Optional[str], target: str) -> None:
        if rel is None:
            raise UnsafeArchiveError(f"{self.archive}: a link member without a name")
        target_rel = self.relname(target)
        if target_rel is None or target_rel not in self.files:
            raise UnsafeArchiveError(
                f"{self.archive}: hard link {rel!r} -> {target!r} does not point at a file extracted before it"
            )
        src = self.root / target_rel
        st = os.lstat(src)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeArchiveError(f"{self.archive}: hard link {rel!r} -> {target!r} is not a regular file")
        self.add_bytes(st.st_size)
        self._parent(rel)
        path = self.root / rel
        self._clear(path, rel)
        try:
            os.link(src, path, follow_symlinks=False)
        except (OSError, NotImplementedError):
            shutil.copy2(src, path, follow_symlinks=False)
        self.files.add(rel)

    def check_links(self) -> None:
        """After extraction: every symlink must resolve inside the root (chains included)."""
        for link in self.links:
            real = os.path.realpath(link)
            if real != str(self.root) and not real.startswith(str(self.root) + os.sep):
                raise UnsafeArchiveError(
                    f"{self.archive}: link {link.relative_to(self.root)} resolves outside the target ({real})"
                )

    def refuse_count(self, n: int) -> NoReturn:
        raise UnsafeArchiveError(
            f"{self.archive}: {n} members, more than the limit of {self.max_files} (archive bomb?)",
            "accelstack refuses archives with this many files as likely archive bombs; if it is genuine, report it to its publisher",
        )

    def guard(self, fn: Callable[[], T], corrupt: Tuple[Type[BaseException], ...]) -> T:
        try:
            return fn()
        except (UnsafeArchiveError, ArtifactError):
            raise
        except corrupt as exc:
            raise ArchiveFormatError(f"{self.archive}: corrupt archive ({exc})") from None
        except RuntimeError as exc:  # zipfile: encrypted members
            raise ArchiveFormatError(f"{self.archive}: cannot extract ({exc})") from None
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
                raise DiskSpaceError(f"the disk filled up while extracting {self.archive}") from None
            if exc.errno == getattr(errno, "ELOOP", -1):
                raise UnsafeArchiveError(f"{self.archive}: a member would be written through a link") from None
            if exc.errno is None:  # gzip.BadGzipFile and other decoder errors
                raise ArchiveFormatError(f"{self.archive}: corrupt archive ({exc})") from None
            raise
