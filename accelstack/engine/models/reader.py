"""Reading a model file's headers safely, and the typed failure every format check gives.

The format checks (:mod:`~accelstack.engine.models.safetensors_check`, :mod:`~accelstack.engine.models.gguf_check`,
:mod:`~accelstack.engine.models.ckpt_check`) open files only through :func:`open_regular` (a FIFO, a device
or a socket is refused without blocking) and report with :func:`fail` and :func:`damaged`.
"""
from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections import OrderedDict
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, List, NamedTuple, Tuple

from ..errors import ModelLoadError

__all__ = ["fail", "damaged", "open_regular", "reading", "is_int", "text_of", "INT64_MAX", "TensorInfo",
           "remembered_index", "forget_indexes"]

INT64_MAX = 2 ** 63 - 1


class TensorInfo(NamedTuple):
    """One tensor as a header declares it: what :mod:`~accelstack.engine.models.inspection` reads a
    model's family, size and weight types from. ``shape`` is in PyTorch order (outermost first)."""

    name: str
    shape: Tuple[int, ...]
    dtype: str  # safetensors dtype (F16, BF16, F8_E4M3 ...) or ggml type name (Q4_K, Q8_0 ...)


def fail(path: Path, reason: str, hint: str = "") -> ModelLoadError:
    return ModelLoadError(f"cannot load model {path}: {reason}",
                          hint=hint or "check the file (re-download it if it is damaged) and pass a .safetensors, "
                          ".gguf or .ckpt file or a diffusers folder")


def damaged(path: Path, kind: str, reason: str) -> ModelLoadError:
    return fail(path, f"damaged {kind} file: {reason}")


def open_regular(path: Path) -> Tuple[BinaryIO, int]:
    """Open ``path`` for reading only if it is a regular file; (file, size). ``O_NONBLOCK`` makes
    opening a FIFO that replaced the file since the stat return at once; fstat then refuses it."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise fail(path, f"cannot read it: {exc.strerror or exc}", hint="check the file's permissions") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise fail(path, "it is not a regular file", hint="pass a model file, not a pipe, device or socket")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), st.st_size
    except BaseException:
        os.close(fd)
        raise


@contextlib.contextmanager
def reading(path: Path) -> Iterator[None]:
    """A read that fails after the open (EIO from a failing disk or an NFS mount, ``/proc/self/mem``)
    becomes the typed failure naming the file, not a traceback."""
    try:
        yield
    except OSError as exc:
        raise fail(path, f"cannot read it: {exc.strerror or exc}",
                   hint="check the disk or the network mount it is on, then copy the file again") from None


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def text_of(name: str) -> str:
    """A name read from a file as text that UTF-8 can write: a lone surrogate (a pickle's text keeps
    one) becomes U+FFFD, so our JSON output stays strict and a terminal can print it."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


# -- one read per file ----------------------------------------------------------------------------------
KEPT_INDEXES = 32  # files whose index a process keeps (a server sees many models; each index is small)
_INDEXES: OrderedDict[Tuple[int, ...], Tuple[TensorInfo, ...]] = OrderedDict()
_INDEX_LOCK = threading.Lock()


def remembered_index(path: Path, fh: BinaryIO, read: Callable[[], List[TensorInfo]]) -> List[TensorInfo]:
    """``read()``, the checked tensor index of the open file ``fh``, read once per process while the
    file is unchanged (the same device, inode, size, modification and change times). One generation
    checks its model's header up to eight times (the CLI's and the engine's checks, inspection, the
    memory planner): ~35 ms on the FLUX.1 probe. A failed read is not remembered; a read error of
    the disk is a ``ModelLoadError`` naming ``path``."""
    with reading(path):
        return _remembered(fh, read)


def _remembered(fh: BinaryIO, read: Callable[[], List[TensorInfo]]) -> List[TensorInfo]:
    st = os.fstat(fh.fileno())
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    with _INDEX_LOCK:
        found = _INDEXES.get(key)
        if found is not None:
            _INDEXES.move_to_end(key)
            return list(found)
    found = tuple(read())
    with _INDEX_LOCK:
        _INDEXES[key] = found
        while len(_INDEXES) > KEPT_INDEXES:
            _INDEXES.popitem(last=False)
    return list(found)


def forget_indexes() -> None:
    """Drop the remembered indexes (tests that count reads)."""
    with _INDEX_LOCK:
        _INDEXES.clear()
