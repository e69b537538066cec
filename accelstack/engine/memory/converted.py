"""The converted-weights cache: a model converted on load (``weight_type`` q8_0, q4_k...) is written once, as a
GGUF file, and loaded as it is by the next load (issue 45: q4_k took 67 s on every load of the SD 1.x probe).

stable-diffusion.cpp converts with its own ``convert`` (src/convert.cpp, the bindings' ``sd_cpp.convert``,
names kept as stored: the loader renames them as for the source file). An entry is two files in the cache
folder the core hands the worker (``<Settings.cache>/converted``)::

    <name>.json   its record: the source, the type, the size and the hash of the file's head (the mark)
    <name>.gguf   the converted file, renamed into place whole after its record is written

``name`` is ``key`` (a hash of the source file's identity: real path, size, modification time, inode, and the
type, so an edited or replaced source is a new entry), or ``key-1``, ``key-2`` where a file the cache did not
write holds that name. An entry is trusted only when both are regular files (never a link or a FIFO), the
record names this source and type, and the GGUF's size is the recorded one and its header reads as a model
file's (:func:`~accelstack.engine.models.gguf_check.gguf_index`); otherwise it is made again.

Only what carries the mark is ever removed (issue 47: the folder may be one where a person keeps files):
a record this module wrote (:func:`is_record`), a GGUF whose record it is and whose head is the one the
record hashed (:func:`is_entry`; a file cut short past its head is still ours). A link, a FIFO, a file
cut inside its head and a person's file stay where they are, and the entry is made under the next name.
``accelstack cache purge converted`` uses the same two marks (:data:`CACHE_KINDS`). The folder is bounded
(:data:`MAX_BYTES`): the least recently used entries go first.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Pattern, Tuple

from ...fsio import write_text
from ..errors import ModelLoadError
from ..models.gguf_check import gguf_index

__all__ = ["ConvertedCache", "ConvertedEntry", "MAX_BYTES", "RECORD_FORMAT", "CACHE_KINDS", "is_record", "is_entry"]

MAX_BYTES = 64 << 30  # the folder's bound: a FLUX.1 q8_0 is 12.7 GB, an SDXL q8_0 3.7 GB
RECORD_FORMAT = 1
MAX_RECORD = 64 * 1024
HEAD_BYTES = 4096  # the GGUF header, its metadata and tensor table begin there: what marks a file as the one converted
SLOTS = 3  # key, key-1, key-2: names to try past files the cache did not write


@dataclass
class ConvertedEntry:
    """One entry: the converted file, its source and type, its size and when it was last used."""

    path: str
    source: str
    weight_type: str
    bytes: int
    used: float


def _identity(source: Path) -> dict:
    st = os.stat(source)
    return {"source": os.path.realpath(source), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


def _regular(path: Path) -> Optional[os.stat_result]:
    """``path``'s lstat when it is a regular file (not a link, FIFO, device or folder), else None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


class ConvertedCache:
    """The cache folder ``root`` (made on first store)."""

    def __init__(self, root: str, max_bytes: int = MAX_BYTES) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes

    def key(self, source: Path, weight_type: str) -> str:
        ident = _identity(source)
        text = json.dumps({**ident, "type": weight_type}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def _paths(self, name: str) -> Tuple[Path, Path]:
        return self.root / f"{name}.gguf", self.root / f"{name}.json"

    def _names(self, key: str) -> List[str]:
        return [key] + [f"{key}-{i}" for i in range(1, SLOTS)]

    def lookup(self, source: Path, weight_type: str) -> Optional[Path]:
        """The trusted converted file of ``source`` as ``weight_type``, or None (a bad entry of ours is removed)."""
        ident = _identity(source)
        for name in self._names(self.key(source, weight_type)):
            gguf, record = self._paths(name)
            if not os.path.lexists(gguf) and not os.path.lexists(record):
                continue
            if self._trusted(gguf, record, ident, weight_type):
                os.utime(record)  # used now: the last to go when the folder is over its bound
                return gguf
            self._remove(name)
        return None

    def _trusted(self, gguf: Path, record: Path, ident: dict, weight_type: str) -> bool:
        st, rst = _regular(gguf), _regular(record)
        if st is None or rst is None or rst.st_size > MAX_RECORD:
            return False
        try:
            with open(record, "rb") as fh:
                data = json.loads(fh.read(MAX_RECORD))
            if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT or data.get("type") != weight_type:
                return False
            if any(data.get(k) != v for k, v in ident.items()) or data.get("bytes") != st.st_size:
                return False
            with open(gguf, "rb") as fh:  # O_NOFOLLOW not needed: lstat said regular, and a swap is caught below
                if os.fstat(fh.fileno()).st_ino != st.st_ino:
                    return False
                gguf_index(gguf, fh, st.st_size)  # the header reads as a model file's, its tensors inside it
        except (OSError, ValueError, ModelLoadError):
            return False
        return True

    def _remove(self, name: str) -> None:
        """What of entry ``name`` carries the mark (both judged before either goes); the rest stays."""
        gguf, record = self._paths(name)
        ours = [p for p, mine in ((gguf, is_entry(gguf)), (record, is_record(record))) if mine]
        for p in ours:  # the file first: a kill between leaves a record alone, still ours to remove
            try:
                os.unlink(p)  # a regular file (the marks read only those): a link is never followed
            except OSError:
                pass

    def store(self, source: Path, weight_type: str, convert: Callable[[Path], bool]) -> Optional[Path]:
        """Convert ``source`` with ``convert(output)`` (True: written) into a new entry, and return it; None when
        the conversion fails (a full disk...) or every name is held by files not the cache's: nothing of ours is
        left behind, nothing else is touched, and the caller converts on load."""
        key = self.key(source, weight_type)
        for name in self._names(key):
            self._remove(name)
        free = [n for n in self._names(key) if not any(os.path.lexists(p) for p in self._paths(n))]
        if not free:
            return None
        gguf, record = self._paths(free[0])
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{key}.{secrets.token_hex(8)}.tmp"
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))  # ours: made here, never a name held
        try:
            if not convert(tmp) or _regular(tmp) is None:
                return None
            size = os.lstat(tmp).st_size
            with open(tmp, "rb") as fh:
                head = fh.read(HEAD_BYTES)
            data = {"format": RECORD_FORMAT, "type": weight_type, "bytes": size, **_identity(source),
                    "head": hashlib.sha256(head).hexdigest(), "head_bytes": len(head), "created": time.time()}
            if os.path.lexists(gguf) or os.path.lexists(record):
                return None  # taken meanwhile, by something not ours
            write_text(record, json.dumps(data))  # first: the file renamed in next is marked from its first moment
            os.replace(tmp, gguf)
        except OSError:
            self._remove(free[0])
            return None
        finally:
            if _regular(tmp) is not None:
                tmp.unlink()
        self.bound(keep=free[0])
        return gguf

    def entries(self) -> List[ConvertedEntry]:
        """The entries with a record, most recently used first (what ``accelstack cache`` lists)."""
        out: List[ConvertedEntry] = []
        if not self.root.is_dir() or self.root.is_symlink():
            return out
        for record in self.root.glob("*.json"):
            gguf = record.with_suffix(".gguf")
            st, rst = _regular(gguf), _regular(record)
            if st is None or rst is None or rst.st_size > MAX_RECORD:
                continue
            try:
                data = json.loads(record.read_text(encoding="utf-8"))
                out.append(ConvertedEntry(str(gguf), str(data.get("source", "")), str(data.get("type", "")), st.st_size,
                                          rst.st_mtime))
            except (OSError, ValueError, AttributeError):
                continue
        return sorted(out, key=lambda e: -e.used)

    def bound(self, keep: str = "") -> None:
        """Remove the least recently used entries until the folder holds at most ``max_bytes`` (``keep`` stays)."""
        entries = self.entries()
        total = sum(e.bytes for e in entries)
        for e in reversed(entries):
            if total <= self.max_bytes:
                break
            name = Path(e.path).stem
            if name != keep:
                self._remove(name)
                total -= e.bytes


_GGUF = re.compile(r"^[0-9a-f]{32}(?:-[0-9])?\.gguf\Z")
_RECORD = re.compile(r"^[0-9a-f]{32}(?:-[0-9])?\.json\Z")


def is_record(path: Path) -> bool:
    """A record this module wrote (its mark: the format, the type, the size and the source it names)."""
    st = _regular(path)
    if st is None or st.st_size > MAX_RECORD:
        return False
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == RECORD_FORMAT and {"type", "bytes", "source"} <= set(data)


def is_entry(path: Path) -> bool:
    """A converted file this module wrote: its record beside it hashed its head (a file cut short past it stays ours)."""
    record, st = path.with_suffix(".json"), _regular(path)
    if st is None or not is_record(record):
        return False
    try:
        data = json.loads(record.read_bytes())
        want, length = data.get("head"), data.get("head_bytes")
        if not isinstance(want, str) or not isinstance(length, int) or not 0 < length <= HEAD_BYTES or st.st_size < length:
            return False
        with open(path, "rb") as fh:
            if os.fstat(fh.fileno()).st_ino != st.st_ino:
                return False
            return hashlib.sha256(fh.read(length)).hexdigest() == want
    except (OSError, ValueError, AttributeError):
        return False


# for ``accelstack cache`` (core.caches): name pattern, kind, mark
CACHE_KINDS: List[Tuple[Pattern[str], str, Callable[[Path], bool]]] = [
    (_GGUF, "converted model", is_entry), (_RECORD, "converted model's record", is_record)]
