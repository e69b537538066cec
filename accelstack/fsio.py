"""Files written whole: the one atomic write every layer uses, and a staging folder for the ones
that fill a directory.

A reader (another accelstack process, or this one after a crash or SIGKILL) sees the old content
or the new, never a mix: the data goes into a new temporary file beside the target, created with
``O_EXCL`` and never opened through a link (``tempfile.mkstemp``), flushed to disk, then renamed
over the target. Only that temporary file is ever removed on failure; whatever already had a name
is never touched. Temporary names are ``.<name>.<pid>.<random>.tmp`` (:data:`TEMP_NAME`), so
``cache list`` can tell an unfinished write from anything else.

It sits at the bottom layer so detection, manifests, artifacts, the installer, the engine and the
publisher share it instead of each writing its own.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterator, Optional, Union

__all__ = ["TEMP_NAME", "write_bytes", "write_text", "try_write_bytes", "fsync_dir", "staging_dir",
           "remove_own_tree"]

#: ``.<name>.<pid>.<random>.tmp``: a file :func:`write_bytes` is writing (or a crash left behind).
TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[A-Za-z0-9_]+\.tmp\Z")

PathLike = Union[str, "os.PathLike[str]"]


def fsync_dir(folder: PathLike) -> None:
    """Make a rename in ``folder`` durable (best effort: not every OS or filesystem allows it)."""
    try:
        fd = os.open(os.fspath(folder), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_bytes(path: PathLike, data: bytes, *, mode: int = 0o644, durable: bool = True,
                make_parents: bool = False) -> Path:
    """Replace ``path`` with ``data`` whole; ``durable`` also fsyncs the file and its folder (a
    cache file that can be made again can skip it). Raises ``OSError``; the target is then as it was."""
    target = Path(path)
    if make_parents:
        target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp", dir=str(target.parent))
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        if mode != 0o600:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(target.parent)
    return target


def write_text(path: PathLike, text: str, *, encoding: str = "utf-8", **kw: bool) -> Path:
    """:func:`write_bytes` for text (``\\n`` line ends on every OS: the files are read back by us)."""
    return write_bytes(path, text.encode(encoding), **kw)  # type: ignore[arg-type]


def try_write_bytes(path: PathLike, data: bytes, *, durable: bool = False) -> bool:
    """Write a cache file whole, creating its folder; False when it could not be written (a cache
    that cannot be kept changes nothing, so the caller goes on)."""
    try:
        write_bytes(path, data, durable=durable, make_parents=True)
        return True
    except OSError:
        return False


def remove_own_tree(path: PathLike) -> None:
    """Remove a folder this process created (a staging folder, a failed build's output): links in
    it are removed, never followed; a file or link in its place is removed alone."""
    p = Path(path)
    if p.is_symlink() or not p.is_dir():
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
        return
    shutil.rmtree(p, ignore_errors=True)


@contextlib.contextmanager
def staging_dir(parent: PathLike, prefix: str = ".staging-", *, keep: bool = False) -> Iterator[Path]:
    """A new private folder under ``parent`` (same filesystem, so a finished one renames into place
    atomically). It is removed when the block raises, and at its end unless ``keep`` (the caller
    renamed it, or wants it); what the block renamed out of it is not touched."""
    root = Path(parent)
    root.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=str(root)))
    ok = False
    try:
        yield folder
        ok = True
    finally:
        if not (ok and keep) and os.path.lexists(folder):
            remove_own_tree(folder)

