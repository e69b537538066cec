"""Safe extraction of zip and tar (.gz, .xz, .bz2, .zst) archives.

Nothing in an archive is trusted:

* absolute names, drive letters and ``..`` components are refused;
* symbolic links must be relative and stay inside the target (checked by name when created,
  and by ``realpath`` once everything is extracted); nothing is ever written *through* a link;
* hard links must point at a file extracted earlier from the same archive;
* device files, FIFOs and other special members are refused;
* the total uncompressed size and the number of members are capped (zip/tar bombs);
* permissions are normalised: ``0755`` for directories and executables (any ``x`` bit in the
  archive), ``0644`` otherwise; no setuid/setgid/sticky bits, no ownership;
* everything is extracted into a fresh staging directory beside ``dest`` that is renamed to
  ``dest`` only when complete; a failure removes the staging directory and leaves ``dest`` as it
  was (absent, or the previous tree with ``replace=True``).

The format is found from the file's first bytes (cache blobs have no extension), or given.
``.tar.zst`` needs the ``zstandard`` module (``pip install zstandard``).
"""
from __future__ import annotations

import errno
import os
import posixpath
import re
import shutil
import stat
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import IO, Iterator, List, Optional, Tuple, Union

from .errors import ArchiveFormatError, ArtifactError, DiskSpaceError, UnsafeArchiveError

DEFAULT_MAX_BYTES = 64 << 30  # 64 GiB uncompressed
DEFAULT_MAX_FILES = 200_000
MAX_LINK_TARGET = 4096
_COPY_CHUNK = 1 << 20

FORMATS = ("zip", "tar", "tar.gz", "tar.xz", "tar.bz2", "tar.zst")
_DRIVE = re.compile(r"^[A-Za-z]:")


def detect_format(path: Union[str, Path]) -> str:
    """One of :data:`FORMATS`, from the file's magic bytes (or its name as a last resort)."""
    with open(path, "rb") as fh:
        head = fh.read(512)
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return "zip"
    if head.startswith(b"\x1f\x8b"):
        return "tar.gz"
    if head.startswith(b"\xfd7zXZ\x00"):
        return "tar.xz"
    if head.startswith(b"BZh"):
        return "tar.bz2"
    if head.startswith(b"\x28\xb5\x2f\xfd"):
        return "tar.zst"
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    name = str(path).lower()
    for fmt, suffixes in (
        ("tar.gz", (".tar.gz", ".tgz")),
        ("tar.xz", (".tar.xz", ".txz")),
        ("tar.bz2", (".tar.bz2", ".tbz2")),
        ("tar.zst", (".tar.zst", ".tzst")),
        ("zip", (".zip", ".whl")),
        ("tar", (".tar",)),
    ):
        if name.endswith(suffixes):
            return fmt
    raise ArchiveFormatError(f"{path}: not a zip or tar archive (unknown format)")


def unpack(
    archive: Union[str, Path],
    dest: Union[str, Path],
    *,
    fmt: Optional[str] = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_files: int = DEFAULT_MAX_FILES,
    replace: bool = False,
) -> Path:
    """Extract ``archive`` into the new directory ``dest`` (see the module docstring); return it.

    ``dest`` must not exist unless ``replace`` is true, in which case the old tree is swapped out
    only after the new one is complete. Raises :class:`UnsafeArchiveError` for anything unsafe,
    :class:`ArchiveFormatError` for a corrupt or unknown archive.
    """
    archive = Path(archive)
    dest = Path(dest)
    fmt = fmt or detect_format(archive)
    if fmt not in FORMATS:
        raise ArchiveFormatError(f"unsupported archive format {fmt!r} (known: {', '.join(FORMATS)})")
    if (dest.exists() or dest.is_symlink()) and not replace:
        raise ArtifactError(
            f"{dest} already exists; archives are only extracted into a new directory",
            "remove it first, or pass replace=True",
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.staging-", dir=str(dest.parent)))
    try:
        extractor = _Extractor(staging, archive, max_bytes=max_bytes, max_files=max_files)
        if fmt == "zip":
            extractor.zip()
        else:
            extractor.tar(fmt)
        extractor.check_links()
        os.chmod(staging, 0o755)
        _swap_into_place(staging, dest, replace)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return dest


def _swap_into_place(staging: Path, dest: Path, replace: bool) -> None:
    old: Optional[Path] = None
    if dest.exists() or dest.is_symlink():
        if not replace:
            raise ArtifactError(f"{dest} appeared while extracting; not overwriting it")
        old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=str(dest.parent)))
        os.rmdir(old)
        os.rename(dest, old)
    try:
        os.rename(staging, dest)
    except OSError:
        if old is not None:
            os.rename(old, dest)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _open_tar(archive: Path, fmt: str) -> Tuple[tarfile.TarFile, List[IO[bytes]]]:
    raw = open(archive, "rb")
    closers: List[IO[bytes]] = [raw]
    if fmt == "tar.zst":
        try:
            import zstandard
        except ImportError:
            raw.close()
            raise ArchiveFormatError(
                f"{archive} is zstd-compressed and the 'zstandard' module is not installed",
                "pip install zstandard",
            ) from None
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        closers.insert(0, reader)
        return tarfile.open(fileobj=reader, mode="r|"), closers
    mode = {"tar": "r|", "tar.gz": "r|gz", "tar.xz": "r|xz", "tar.bz2": "r|bz2"}[fmt]
    return tarfile.open(fileobj=raw, mode=mode), closers


def _corrupt_errors() -> Tuple[type, ...]:
    import lzma
    import zlib

    errors: List[type] = [tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, lzma.LZMAError]
    try:
        import zstandard

        errors.append(zstandard.ZstdError)
    except ImportError:
        pass
    return tuple(errors)


class _Extractor:
    def __init__(self, root: Path, archive: Path, *, max_bytes: int, max_files: int) -> None:
        self.root = Path(os.path.realpath(root))
        self.archive = archive
        self.max_bytes = max_bytes
        self.max_files = max_files
        self.total = 0
        self.count = 0
        self.links: List[Path] = []
        self.files: set = set()  # relative names of regular files extracted (hard-link targets)

    # -- names ----------------------------------------------------------------------------
    def _relname(self, name: str) -> Optional[str]:
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

    def _count(self, name: str) -> None:
        self.count += 1
        if self.count > self.max_files:
            raise UnsafeArchiveError(
                f"{self.archive}: more than {self.max_files} members (archive bomb?)",
                "if the archive is genuine, raise max_files",
            )

    def _add_bytes(self, n: int) -> None:
        self.total += n
        if self.total > self.max_bytes:
            raise UnsafeArchiveError(
                f"{self.archive}: expands to more than {self.max_bytes} bytes (archive bomb?)",
                "if the archive is genuine, raise max_bytes",
            )

    def _parent(self, rel: str) -> Path:
        """Create the parent directories of ``rel`` inside root; refuse to go through links."""
        current = self.root
        for part in rel.split("/")[:-1]:
            current = current / part
            try:
                st = os.lstat(current)
            except FileNotFoundError:
                os.mkdir(current, 0o755)
                continue
            if not stat.S_ISDIR(st.st_mode):
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
    def _dir(self, rel: Optional[str]) -> None:
        if rel is None:
            return
        self._parent(rel)
        path = self.root / rel
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            os.mkdir(path, 0o755)
            return
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafeArchiveError(f"{self.archive}: directory {rel!r} collides with a file or link")

    def _file(self, rel: Optional[str], src: IO[bytes], mode: int, mtime: Optional[float], declared: Optional[int]) -> None:
        if rel is None:
            raise UnsafeArchiveError(f"{self.archive}: a file member without a name")
        if declared is not None and self.total + declared > self.max_bytes:
            self._add_bytes(declared)  # raises
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
                self._add_bytes(len(data))
                out.write(data)
        os.chmod(path, 0o755 if mode & 0o111 else 0o644)
        if mtime is not None:
            try:
                os.utime(path, (mtime, mtime))
            except (OSError, OverflowError, ValueError):
                pass
        self.files.add(rel)

    def _symlink(self, rel: Optional[str], target: str) -> None:
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

    def _hardlink(self, rel: Optional[str], target: str) -> None:
        if rel is None:
            raise UnsafeArchiveError(f"{self.archive}: a link member without a name")
        target_rel = self._relname(target)
        if target_rel is None or target_rel not in self.files:
            raise UnsafeArchiveError(
                f"{self.archive}: hard link {rel!r} -> {target!r} does not point at a file extracted before it"
            )
        src = self.root / target_rel
        st = os.lstat(src)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeArchiveError(f"{self.archive}: hard link {rel!r} -> {target!r} is not a regular file")
        self._add_bytes(st.st_size)
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

    # -- formats --------------------------------------------------------------------------
    def tar(self, fmt: str) -> None:
        corrupt = _corrupt_errors()
        try:
            tf, closers = _open_tar(self.archive, fmt)
        except corrupt as exc:
            raise ArchiveFormatError(f"{self.archive}: not a readable {fmt} archive ({exc})") from None
        try:
            for member in _iter_tar(tf, self.archive, corrupt):
                self._count(member.name)
                rel = self._relname(member.name)
                if member.isdir():
                    self._dir(rel)
                elif member.isreg():
                    src = tf.extractfile(member)
                    assert src is not None
                    self._guard(lambda: self._file(rel, src, member.mode, member.mtime, member.size), corrupt)
                elif member.issym():
                    self._symlink(rel, member.linkname)
                elif member.islnk():
                    self._hardlink(rel, member.linkname)
                else:
                    kind = {
                        tarfile.CHRTYPE: "a character device",
                        tarfile.BLKTYPE: "a block device",
                        tarfile.FIFOTYPE: "a FIFO",
                    }.get(member.type, f"a special member (type {member.type!r})")
                    raise UnsafeArchiveError(f"{self.archive}: {member.name!r} is {kind}; refusing to extract it")
        finally:
            try:
                tf.close()
            finally:
                for closer in closers:
                    closer.close()

    def zip(self) -> None:
        corrupt = _corrupt_errors()
        try:
            zf = zipfile.ZipFile(self.archive)
        except (zipfile.BadZipFile, OSError) as exc:
            raise ArchiveFormatError(f"{self.archive}: not a readable zip archive ({exc})") from None
        with zf:
            infos = zf.infolist()
            if len(infos) > self.max_files:
                self._count_all(len(infos))
            declared = sum(i.file_size for i in infos)
            if declared > self.max_bytes:
                self._add_bytes(declared)  # raises before anything is written
            for info in infos:
                self._count(info.filename)
                rel = self._relname(info.filename)
                unix_mode = (info.external_attr >> 16) & 0xFFFF
                ftype = stat.S_IFMT(unix_mode) if info.create_system == 3 else 0
                if info.is_dir() or ftype == stat.S_IFDIR:
                    self._dir(rel)
                elif ftype == stat.S_IFLNK:
                    if info.file_size > MAX_LINK_TARGET:
                        raise UnsafeArchiveError(f"{self.archive}: link {info.filename!r} has an oversized target")
                    target = self._guard(lambda: zf.read(info), corrupt).decode("utf-8", "surrogateescape")
                    self._symlink(rel, target)
                elif ftype in (0, stat.S_IFREG):
                    mtime = _zip_mtime(info)

                    def extract() -> None:
                        with zf.open(info) as src:
                            self._file(rel, src, unix_mode, mtime, info.file_size)

                    self._guard(extract, corrupt)
                else:
                    raise UnsafeArchiveError(f"{self.archive}: {info.filename!r} is a special file; refusing to extract it")

    def _count_all(self, n: int) -> None:
        raise UnsafeArchiveError(
            f"{self.archive}: {n} members, more than the limit of {self.max_files} (archive bomb?)",
            "if the archive is genuine, raise max_files",
        )

    def _guard(self, fn, corrupt):
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


def _iter_tar(tf: tarfile.TarFile, archive: Path, corrupt) -> Iterator[tarfile.TarInfo]:
    while True:
        try:
            member = tf.next()
        except corrupt as exc:
            raise ArchiveFormatError(f"{archive}: corrupt archive ({exc})") from None
        except OSError as exc:  # gzip.BadGzipFile and friends
            raise ArchiveFormatError(f"{archive}: corrupt archive ({exc})") from None
        if member is None:
            return
        yield member


def _zip_mtime(info: zipfile.ZipInfo) -> Optional[float]:
    import time

    try:
        return time.mktime(info.date_time + (0, 0, -1))
    except (OverflowError, ValueError):
        return None
