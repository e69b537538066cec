"""The converted-weights cache: a model converted on load (``weight_type`` q8_0, q4_k...) is written once, as a
GGUF file, and loaded as it is by the next load (issue 45: q4_k took 67 s on every load of the SD 1.x probe).

stable-diffusion.cpp converts with its own ``convert`` (src/convert.cpp, the bindings' ``sd_cpp.convert``,
names kept as stored: the loader renames them as for the source file). An entry is two files in the cache
folder the core hands the worker (``<Settings.cache>/converted``)::

    <key>.gguf    the converted file
    <key>.json    its record, written last (an entry without one is not ours or not finished)

``key`` hashes the source file's identity (real path, size, modification time, inode) and the type, so an
edited or replaced source is a new entry. An entry is trusted only when both are regular files (never a link or
a FIFO), the record names this source and type, and the GGUF's size is the recorded one and its header reads
as a model file's (:func:`~accelstack.engine.models.gguf_check.gguf_index`); otherwise both are removed and the
entry is made again. The folder is bounded (:data:`MAX_BYTES`): the least recently used entries go first.
Only files whose names this module gives are ever removed, and never through a link.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
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

    def _paths(self, key: str):
        return self.root / f"{key}.gguf", self.root / f"{key}.json"

    def lookup(self, source: Path, weight_type: str) -> Optional[Path]:
        """The trusted converted file of ``source`` as ``weight_type``, or None (a bad entry is removed)."""
        key = self.key(source, weight_type)
        gguf, record = self._paths(key)
        if not os.path.lexists(gguf) and not os.path.lexists(record):
            return None
        if self._trusted(gguf, record, _identity(source), weight_type):
            os.utime(record)  # used now: the last to go when the folder is over its bound
            return gguf
        self._remove(key)
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

    def _remove(self, key: str) -> None:
        """Both files of ``key`` (ours by name), whatever they became: a link is removed, never followed."""
        for p in self._paths(key):
            try:
                if not stat.S_ISDIR(os.lstat(p).st_mode):
                    os.unlink(p)
            except OSError:
                pass

    def store(self, source: Path, weight_type: str, convert: Callable[[Path], bool]) -> Optional[Path]:
        """Convert ``source`` with ``convert(output)`` (True: written) into a new entry, and return it; None when
        the conversion fails (a full disk...): nothing is left behind, and the caller converts on load."""
        key = self.key(source, weight_type)
        self._remove(key)
        self.root.mkdir(parents=True, exist_ok=True)
        gguf, record = self._paths(key)
        tmp = self.root / f"{key}.gguf.{os.getpid()}.tmp"
        try:
            if not convert(tmp) or _regular(tmp) is None:
                return None
            size = os.lstat(tmp).st_size
            os.replace(tmp, gguf)
            data = {"format": RECORD_FORMAT, "type": weight_type, "bytes": size, **_identity(source),
                    "created": time.time()}
            write_text(record, json.dumps(data))  # atomic, and last: the entry is whole
        except OSError:
            self._remove(key)
            return None
        finally:
            for leftover in self.root.glob(f"{key}.*.{os.getpid()}.tmp"):
                leftover.unlink()
        self.bound(keep=key)
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

    def purge(self) -> int:
        """Remove every entry (and unfinished conversion) this module made; the bytes freed."""
        freed = 0
        if not self.root.is_dir() or self.root.is_symlink():
            return 0
        for p in self.root.iterdir():
            name = p.name
            stem = name.split(".", 1)[0]
            if len(stem) == 32 and all(c in "0123456789abcdef" for c in stem) and (
                    name.endswith((".gguf", ".json", ".tmp"))):
                st = os.lstat(p)
                if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode) or stat.S_ISFIFO(st.st_mode):
                    freed += st.st_size if stat.S_ISREG(st.st_mode) else 0
                    p.unlink()
        return freed


_GGUF = re.compile(r"^[0-9a-f]{32}\.gguf\Z")
_RECORD = re.compile(r"^[0-9a-f]{32}\.json\Z")


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
    """A converted file this module wrote: its record beside it names its size."""
    record, st = path.with_suffix(".json"), _regular(path)
    if st is None or not is_record(record):
        return False
    try:
        return json.loads(record.read_bytes()).get("bytes") == st.st_size
    except (OSError, ValueError):
        return False


# for ``accelstack cache`` (core.caches): name pattern, kind, mark
CACHE_KINDS: List[Tuple[Pattern[str], str, Callable[[Path], bool]]] = [
    (_GGUF, "converted model", is_entry), (_RECORD, "converted model's record", is_record)]
