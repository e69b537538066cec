"""Files written whole: the one atomic write every layer uses, and a staging folder for the ones
that fill a directory.

A reader (another accelstack process, or this one after a crash or SIGKILL) sees the old content
or the new, never a mix: the data goes into a new temporary file beside the target, created with
``O_EXCL`` and never opened through a link (``O_NOFOLLOW``), flushed to disk, then renamed over
the target. Only that temporary file is ever removed on failure; whatever already had a name is
never touched. Temporary names are ``.<name>.<pid>.<random>.tmp`` (:data:`TEMP_NAME`), so
``cache list`` can tell an unfinished write from anything else.

It sits at the bottom layer so detection, manifests, artifacts, the installer, the engine and the
publisher share it instead of each writing its own. It uses ``os`` alone (no ``tempfile``, which
loads ``random``, nor ``shutil``): every command imports it, ``detect`` too, whose cold start is
measured (benchmarks/bench_detect_cold.py).
"""
from __future__ import annotations

import contextlib
import os
import re
import stat
from pathlib import Path
from typing import BinaryIO, Iterator, List, Optional, Tuple, Union

__all__ = ["TEMP_NAME", "temp_names_of", "TRASH_PREFIX", "output_problem", "replacing", "write_bytes", "write_text", "try_write_bytes", "copy_file",
           "fsync_dir", "staging_dir", "remove_own_tree", "discard_tree", "finish_discards"]

#: ``.<name>.<pid>.<random>.tmp``: a file :func:`write_bytes` is writing (or a crash left behind).
TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[A-Za-z0-9_]+\.tmp\Z")


def temp_names_of(*finals: re.Pattern[str]) -> re.Pattern[str]:
    """The temporary names (:data:`TEMP_NAME`) of files whose own names match one of ``finals``
    (each a whole-name pattern, ``^...\\Z``): what a cache lists as an unfinished write."""
    bodies = []
    for final in finals:
        assert final.pattern.startswith("^") and final.pattern.endswith("\\Z"), final.pattern
        bodies.append(final.pattern[1:-2])
    return re.compile(r"^\.(" + "|".join(bodies) + r")\.\d+(?:\.[A-Za-z0-9_]+)?\.tmp\Z")

#: A folder being removed is first renamed to ``.accelstack-trash-<name>.<random>`` in its folder, so
#: a removal killed half-way leaves a name :func:`finish_discards` recognises (its mark may be gone).
TRASH_PREFIX = ".accelstack-trash-"

PathLike = Union[str, "os.PathLike[str]"]

# A new file only (O_EXCL), never through a link in its place (O_NOFOLLOW where the OS has it),
# not inherited by child processes, and binary on Windows.
_NEW_FILE = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
             | getattr(os, "O_BINARY", 0))
# A folder opened to remove what is in it: refused when a link took its place.
_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
# Removal by descriptor (openat/unlinkat): a folder swapped for a link mid-way is never entered.
_BY_FD = ({os.open, os.unlink, os.rmdir} <= os.supports_dir_fd and os.scandir in os.supports_fd
          and hasattr(os, "O_DIRECTORY") and hasattr(os, "O_NOFOLLOW"))
_TRIES = 100  # random names that may already exist before giving up (FileExistsError)
_CHUNK = 1 << 20  # copy_file's read size: a CUDA library of hundreds of MB is never held whole


def _random() -> str:
    return os.urandom(4).hex()


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


def _new_file(target: Path) -> Tuple[int, str]:
    """A new, empty, private (0600) temporary file beside ``target``: its descriptor and path."""
    prefix = os.path.join(os.fspath(target.parent), f".{target.name}.{os.getpid()}.")
    for _ in range(_TRIES):
        tmp = f"{prefix}{_random()}.tmp"
        try:
            return os.open(tmp, _NEW_FILE, 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {target}")


@contextlib.contextmanager
def replacing(path: PathLike, *, mode: int = 0o644, durable: bool = True,
              make_parents: bool = False) -> Iterator[BinaryIO]:
    """A new file to stream into, renamed over ``path`` when the block ends without an error (a
    bundle or an archive written as it is made); on an error the temporary file goes and ``path``
    is as it was. ``durable`` also fsyncs the file and its folder."""
    target = Path(path)
    if make_parents:
        target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _new_file(target)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            if mode != 0o600:  # on the open file: a name swapped for a link meanwhile changes nothing
                _set_mode(fh.fileno(), tmp, mode)
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(target.parent)


def _set_mode(fd: int, path: str, mode: int) -> None:
    if hasattr(os, "fchmod"):
        os.fchmod(fd, mode)
    else:  # Windows: no fchmod; only the read-only bit means anything there
        os.chmod(path, mode)


def write_bytes(path: PathLike, data: bytes, *, mode: int = 0o644, durable: bool = True,
                make_parents: bool = False) -> Path:
    """Replace ``path`` with ``data`` whole; ``durable`` also fsyncs the file and its folder (a
    cache file that can be made again can skip it). Raises ``OSError``; the target is then as it was."""
    with replacing(path, mode=mode, durable=durable, make_parents=make_parents) as fh:
        fh.write(data)
    return Path(path)


def write_text(path: PathLike, text: str, *, encoding: str = "utf-8", **kw: bool) -> Path:
    """:func:`write_bytes` for text (``\\n`` line ends on every OS: the files are read back by us)."""
    return write_bytes(path, text.encode(encoding), **kw)


def try_write_bytes(path: PathLike, data: bytes, *, durable: bool = False) -> bool:
    """Write a cache file whole, creating its folder; False when it could not be written (a cache
    that cannot be kept changes nothing, so the caller goes on)."""
    try:
        write_bytes(path, data, durable=durable, make_parents=True)
        return True
    except OSError:
        return False


def copy_file(src: PathLike, dest: PathLike, *, mode: Optional[int] = None, durable: bool = True,
              make_parents: bool = False) -> Path:
    """Replace ``dest`` with a copy of ``src``, streamed (a restored CUDA library is hundreds of
    MB, never read whole), as atomically as :func:`write_bytes`; ``mode`` None keeps ``src``'s
    permission bits (never setuid, setgid or sticky). ``src`` must be a regular file, opened without
    following a link or waiting on a FIFO; anything else is an ``OSError``."""
    fd = os.open(os.fspath(src), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
                 | getattr(os, "O_BINARY", 0))
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise OSError(f"{src} is not a regular file")
    with os.fdopen(fd, "rb") as reader:
        keep = stat.S_IMODE(st.st_mode) & 0o777 if mode is None else mode
        with replacing(dest, mode=keep, durable=durable, make_parents=make_parents) as writer:
            while True:
                chunk = reader.read(_CHUNK)
                if not chunk:
                    break
                writer.write(chunk)
    return Path(dest)


def _is_link(entry: os.DirEntry[str]) -> bool:
    """A link, or on Windows any reparse point (a junction too): removed itself, never entered."""
    if entry.is_symlink():
        return True
    attributes = getattr(entry.stat(follow_symlinks=False), "st_file_attributes", 0)
    return bool(attributes & getattr(stat, "FILE_ATTRIBUTE_REPARSE_POINT", 0))


def _clear_fd(fd: int) -> None:
    """Remove everything in the open folder ``fd``, by descriptor; errors are skipped."""
    with os.scandir(fd) as it:
        entries = list(it)
    for entry in entries:
        with contextlib.suppress(OSError):
            if entry.is_dir(follow_symlinks=False):
                sub = os.open(entry.name, _DIR, dir_fd=fd)
                try:
                    _clear_fd(sub)
                finally:
                    os.close(sub)
                os.rmdir(entry.name, dir_fd=fd)
            else:
                os.unlink(entry.name, dir_fd=fd)


def _clear_path(folder: str) -> None:
    """:func:`_clear_fd` by path, where the OS has no ``*at`` calls (Windows)."""
    with os.scandir(folder) as it:
        entries = list(it)
    for entry in entries:
        with contextlib.suppress(OSError):
            if _is_link(entry):
                try:
                    os.unlink(entry.path)
                except OSError:  # a link to a folder, or a junction, on Windows
                    os.rmdir(entry.path)
            elif entry.is_dir(follow_symlinks=False):
                _clear_path(entry.path)
                os.rmdir(entry.path)
            else:
                os.unlink(entry.path)


def remove_own_tree(path: PathLike) -> None:
    """Remove a folder this process created (a staging folder, a failed build's output): links in
    it are removed, never followed; a file or link in its place is removed alone. What cannot be
    removed is left (as ``shutil.rmtree(ignore_errors=True)`` would)."""
    p = os.fspath(path)
    try:
        st = os.lstat(p)
    except OSError:
        return
    if not stat.S_ISDIR(st.st_mode) or getattr(st, "st_file_attributes", 0) & getattr(stat, "FILE_ATTRIBUTE_REPARSE_POINT", 0):
        with contextlib.suppress(OSError):
            os.unlink(p)
        return
    with contextlib.suppress(OSError):
        if _BY_FD:
            fd = os.open(p, _DIR)
            try:
                _clear_fd(fd)
            finally:
                os.close(fd)
        else:
            _clear_path(p)
    with contextlib.suppress(OSError):
        os.rmdir(p)


def discard_tree(path: PathLike) -> None:
    """Remove a folder of ours in two steps that a kill cannot leave half-way: an atomic rename to
    a trash name beside it (from then on it is garbage by its name alone, whatever of its content
    is gone), then :func:`remove_own_tree`. Where the rename is refused (a folder in use on
    Windows) it is removed in place."""
    p = os.fspath(path)
    parent, name = os.path.split(os.path.abspath(p))
    for _ in range(_TRIES):
        trash = os.path.join(parent, f"{TRASH_PREFIX}{name[:64]}.{_random()}")
        if os.path.lexists(trash):
            continue
        try:
            os.rename(p, trash)
        except OSError:
            break
        fsync_dir(parent)  # the rename is durable before the first unlink
        remove_own_tree(trash)
        return
    remove_own_tree(p)


def finish_discards(folder: PathLike) -> List[str]:
    """Finish the removals a kill interrupted in ``folder`` (trash names, see :func:`discard_tree`);
    a link with such a name is removed, never followed. Returns the names that are gone now."""
    done: List[str] = []
    try:
        st = os.lstat(os.fspath(folder))
        if not stat.S_ISDIR(st.st_mode):
            return done
        with os.scandir(os.fspath(folder)) as it:
            names = [e.name for e in it if e.name.startswith(TRASH_PREFIX)]
    except OSError:
        return done
    for name in sorted(names):
        path = os.path.join(os.fspath(folder), name)
        remove_own_tree(path)
        if not os.path.lexists(path):
            done.append(name)
    return done


@contextlib.contextmanager
def staging_dir(parent: PathLike, prefix: str = ".staging-", *, keep: bool = False) -> Iterator[Path]:
    """A new private folder under ``parent`` (same filesystem, so a finished one renames into place
    atomically). It is removed when the block raises, and at its end unless ``keep`` (the caller
    renamed it, or wants it); what the block renamed out of it is not touched."""
    root = Path(os.path.abspath(parent))  # as tempfile.mkdtemp answered: the caller may chdir
    root.mkdir(parents=True, exist_ok=True)
    for _ in range(_TRIES):
        folder = root / f"{prefix}{_random()}"
        try:
            os.mkdir(folder, 0o700)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free staging name in {root}")
    ok = False
    try:
        yield folder
        ok = True
    finally:
        if not (ok and keep) and os.path.lexists(folder):
            remove_own_tree(folder)


def output_problem(path: Path, *, folder: bool = False, parents: bool = True) -> Optional[Tuple[str, str]]:
    """Why ``path`` could not be written as a command's output, as (reason, hint), or None: asked
    before the work that fills it. A file path must be absent or a regular file (a folder, a link,
    a FIFO or a device is refused: the output would go elsewhere, block or replace a device); with
    ``folder``, a folder path must not be an existing file. The nearest existing folder above it
    must take a new file (missing folders are made when writing; without ``parents`` it must be its
    own folder): tried by writing one and removing it, since ``access()`` says yes to root on /proc
    or a read-only mount. Nothing is left behind."""
    try:
        st: Optional[os.stat_result] = os.lstat(path)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        return "a part of the path is a file, not a folder", "choose a path inside a folder"
    except (OSError, ValueError) as exc:  # a name too long, a NUL
        return getattr(exc, "strerror", None) or str(exc), "choose another path"
    if st is not None and folder:
        try:
            is_dir = stat.S_ISDIR(os.stat(path).st_mode)  # a link to a folder is that folder
        except OSError:
            is_dir = False
        if not is_dir:
            return "it exists and is not a folder", "name a new folder, or an existing one"
    elif st is not None and stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link", "name the file itself, not a link to it"
    elif st is not None and stat.S_ISDIR(st.st_mode):
        return "it is an existing folder", "name a file to write, not a folder"
    elif st is not None and not stat.S_ISREG(st.st_mode):
        return "it exists and is not a regular file (a device, a FIFO or a socket)", "choose another path"
    home = Path(path).absolute() if folder and st is not None else Path(path).absolute().parent
    ancestor = home
    while True:
        try:
            if stat.S_ISDIR(os.stat(ancestor).st_mode):
                break
            return f"{ancestor} is a file, not a folder", "choose a path inside a folder"
        except FileNotFoundError:
            if not parents:
                return f"the folder {home} does not exist", "make the folder first, or choose another path"
            ancestor = ancestor.parent
        except OSError as exc:
            return exc.strerror or str(exc), "choose another path"
    try:  # the one sure test: a new file there (removed at once)
        write_bytes(ancestor / f".accelstack-write-test-{os.getpid()}", b"", durable=False).unlink()
    except OSError as exc:
        made = Path(path).absolute() if folder else home
        why = (f"the folder {ancestor} cannot be written to" if ancestor in (home, made) else
               f"the folder {made} does not exist and cannot be made in {ancestor}")
        return f"{why} ({exc.strerror or exc})", "choose a folder you can write to"
    return None
