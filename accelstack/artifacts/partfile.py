"""``<blob>.part``: a download in progress, with its running sha256 kept in step with the bytes.

The hash is computed while streaming (one pass over the network bytes); a resumed part is
re-hashed from disk first (a local read). Large files are hashed by a helper thread that trails
the writes, so a fast download is not slowed by hashing.
"""
from __future__ import annotations

import hashlib
import os
import queue
import threading
from pathlib import Path
from typing import Any, Optional, Union


class HashBehind:
    """A sha256 updated by a helper thread that trails the writes by at most ``depth`` chunks.

    Still one pass over the bytes as they stream in; hashing just runs beside the socket reads
    and disk writes (hashlib releases the GIL), so a fast download is not slowed by it.
    """

    def __init__(self, initial: Any, depth: int = 8) -> None:
        self._hash = initial
        self._queue: queue.Queue[Optional[bytes]] = queue.Queue(depth)
        self._thread = threading.Thread(target=self._run, name="accelstack-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._hash.update(item)
            finally:
                self._queue.task_done()

    def update(self, data: bytes) -> None:
        self._queue.put(data)

    def hexdigest(self) -> str:
        self._queue.join()
        return self._hash.hexdigest()

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()


HASH_BEHIND_MIN = 16 << 20  # files smaller than this are hashed inline


class PartFile:
    """``<blob>.part``: the bytes so far and their running sha256, kept in step."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        fd = os.open(str(path), os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o644)
        self._fh = os.fdopen(fd, "r+b")
        existing = os.fstat(fd).st_size
        prefix = hashlib.sha256()
        self.offset = 0
        if 0 < existing <= size:
            # Resume: re-hash what is already on disk (a local read, not a network one).
            while True:
                data = self._fh.read(1 << 20)
                if not data:
                    break
                prefix.update(data)
                self.offset += len(data)
        else:
            self._fh.truncate(0)
        self._fh.seek(self.offset)
        self._fh.truncate(self.offset)
        self._hash = self._hasher(prefix)

    def _hasher(self, initial: Any) -> Union[HashBehind, Any]:
        if self.size - self.offset >= HASH_BEHIND_MIN:
            return HashBehind(initial)
        return initial

    def write(self, data: bytes) -> None:
        self._fh.write(data)
        self._hash.update(data)
        self.offset += len(data)

    def reset(self) -> None:
        self._fh.seek(0)
        self._fh.truncate(0)
        self._close_hash()
        self.offset = 0
        self._hash = self._hasher(hashlib.sha256())

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def flush(self, fsync: bool = False) -> None:
        self._fh.flush()
        if fsync:
            os.fsync(self._fh.fileno())

    def _close_hash(self) -> None:
        if isinstance(self._hash, HashBehind):
            self._hash.close()

    def close(self) -> None:
        self._close_hash()
        if not self._fh.closed:
            try:
                self._fh.flush()
            finally:
                self._fh.close()
