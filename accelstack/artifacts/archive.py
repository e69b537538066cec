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

import functools
import os
import shutil
import stat
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from typing import IO, Dict, Iterator, List, Literal, Optional, Tuple, Type, Union

from .errors import ArchiveFormatError, ArtifactError, UnsafeArchiveError
from .extract import MAX_LINK_TARGET, Extractor, corrupt_errors

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_FILES", "FORMATS", "detect_format", "unpack"]

DEFAULT_MAX_BYTES = 64 << 30  # 64 GiB uncompressed
DEFAULT_MAX_FILES = 200_000

FORMATS = ("zip", "tar", "tar.gz", "tar.xz", "tar.bz2", "tar.zst")
_TAR_MODES: Dict[str, Literal["r|", "r|gz", "r|xz", "r|bz2"]] = {"tar": "r|", "tar.gz": "r|gz", "tar.xz": "r|xz", "tar.bz2": "r|bz2"}


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
        extractor = Extractor(staging, archive, max_bytes=max_bytes, max_files=max_files)
        if fmt == "zip":
            _extract_zip(extractor)
        else:
            _extract_tar(extractor, fmt)
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
                "install the 'zstandard' Python package",
            ) from None
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        closers.insert(0, reader)
        return tarfile.open(fileobj=reader, mode="r|"), closers
    return tarfile.open(fileobj=raw, mode=_TAR_MODES[fmt]), closers


def _extract_tar(ex: Extractor, fmt: str) -> None:
    corrupt = corrupt_errors()
    try:
        tf, closers = _open_tar(ex.archive, fmt)
    except corrupt as exc:
        raise ArchiveFormatError(f"{ex.archive}: not a readable {fmt} archive ({exc})") from None
    try:
        for member in _iter_tar(tf, ex.archive, corrupt):
            ex.count_member(member.name)
            rel = ex.relname(member.name)
            if member.isdir():
                ex.directory(rel)
            elif member.isreg():
                src = tf.extractfile(member)
                if src is None:
                    raise ArchiveFormatError(f"{ex.archive}: {member.name!r} has no data")
                ex.guard(functools.partial(ex.file, rel, src, member.mode, member.mtime, member.size), corrupt)
            elif member.issym():
                ex.symlink(rel, member.linkname)
            elif member.islnk():
                ex.hardlink(rel, member.linkname)
            else:
                kind = {
                    tarfile.CHRTYPE: "a character device",
                    tarfile.BLKTYPE: "a block device",
                    tarfile.FIFOTYPE: "a FIFO",
                }.get(member.type, f"a special member (type {member.type!r})")
                raise UnsafeArchiveError(f"{ex.archive}: {member.name!r} is {kind}; refusing to extract it")
    finally:
        try:
            tf.close()
        finally:
            for closer in closers:
                closer.close()


def _extract_zip(ex: Extractor) -> None:
    corrupt = corrupt_errors()
    try:
        zf = zipfile.ZipFile(ex.archive)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ArchiveFormatError(f"{ex.archive}: not a readable zip archive ({exc})") from None
    with zf:
        infos = zf.infolist()
        if len(infos) > ex.max_files:
            ex.refuse_count(len(infos))
        declared = sum(i.file_size for i in infos)
        if declared > ex.max_bytes:
            ex.add_bytes(declared)  # raises before anything is written
        for info in infos:
            ex.count_member(info.filename)
            rel = ex.relname(info.filename)
            unix_mode = (info.external_attr >> 16) & 0xFFFF
            ftype = stat.S_IFMT(unix_mode) if info.create_system == 3 else 0
            if info.is_dir() or ftype == stat.S_IFDIR:
                ex.directory(rel)
            elif ftype == stat.S_IFLNK:
                if info.file_size > MAX_LINK_TARGET:
                    raise UnsafeArchiveError(f"{ex.archive}: link {info.filename!r} has an oversized target")
                target = ex.guard(functools.partial(zf.read, info), corrupt).decode("utf-8", "surrogateescape")
                ex.symlink(rel, target)
            elif ftype in (0, stat.S_IFREG):
                ex.guard(functools.partial(_zip_file, ex, zf, info, rel, unix_mode), corrupt)
            else:
                raise UnsafeArchiveError(f"{ex.archive}: {info.filename!r} is a special file; refusing to extract it")


def _zip_file(ex: Extractor, zf: zipfile.ZipFile, info: zipfile.ZipInfo, rel: Optional[str], mode: int) -> None:
    with zf.open(info) as src:
        ex.file(rel, src, mode, _zip_mtime(info), info.file_size)


def _iter_tar(tf: tarfile.TarFile, archive: Path, corrupt: Tuple[Type[BaseException], ...]) -> Iterator[tarfile.TarInfo]:
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
    try:
        return time.mktime(info.date_time + (0, 0, -1))
    except (OverflowError, ValueError):
        return None
