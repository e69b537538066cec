"""``<blob>.part``: a download in progress, with its running sha256 kept in step with the bytes.

The hash is computed while streaming (one pass over the network bytes); a resumed part is
re-hashed from disk first (a local read). The network is read into a few reused 1 MiB buffers
(no per-chunk ``bytes`` objects), each written with ``os.write`` on the raw descriptor (no Python
buffering, no copy) and hashed from the same memory. Large files are hashed by a helper thread
that trails the writes by a few buffers, so socket reads, disk writes and hashing overlap
(``hashlib``, ``recv`` and ``write`` all release the GIL).
"""
from __future__ import annotations

import hashlib
import os
import queue
import threading
from pathlib import Path
from typing import Any, Optional, Tuple, Union

__all__ = ["DEFAULT_BUFFER", "HASH_BEHIND_BUFFERS", "HASH_BEHIND_MIN", "HashBehind", "PartFile"]

DEFAULT_BUFFER = 1 << 20
HASH_BEHIND_MIN = 16 << 20  # files smaller than this are hashed inline
HASH_BEHIND_BUFFERS = 4  # buffers in flight between the reader and the hashing thread

_Item = Union[Tuple[Any, int, bool], threading.Event, None]


class HashBehind:
    """A sha256 updated by a helper thread from buffers the reader hands over.

    ``take()`` gives a free buffer (blocking while all are being hashed), ``submit(buf, n)`` hands
    its first ``n`` bytes to the hasher, which returns the buffer to the free pool when done. One
    hand-over per buffer, with C-implemented queues: no per-read Python thread traffic.
    """

    def __init__(self, initial: Any, buffers: int = HASH_BEHIND_BUFFERS, buffer_size: int = DEFAULT_BUFFER) -> None:
        self._hash = initial
        self._free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        for _ in range(buffers):
            self._free.put(bytearray(buffer_size))
        self._todo: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="accelstack-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        update = self._hash.update
        while True:
            item = self._todo.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            buf, n, pooled = item
            update(memoryview(buf)[:n] if pooled else buf)
            if pooled:
                self._free.put(buf)

    def take(self) -> bytearray:
        return self._free.get()

    def give_back(self, buf: bytearray) -> None:
        self._free.put(buf)

    def submit(self, buf: bytearray, n: int) -> None:
        """Hash ``buf[:n]``; ``buf`` belongs to the hasher until it is free again."""
        self._todo.put((buf, n, True))

    def update(self, data: bytes) -> None:
        self._todo.put((bytes(data), len(data), False))

    def hexdigest(self) -> str:
        done = threading.Event()
        self._todo.put(done)
        done.wait()
        return self._hash.hexdigest()

    def close(self) -> None:
        if self._thread.is_alive():
            self._todo.put(None)
            self._thread.join()


class _HashInline:
    """The same interface, hashing in the caller's thread from one reused buffer."""

    def __init__(self, initial: Any, buffer_size: int = DEFAULT_BUFFER) -> None:
        self._hash = initial
        self._size = buffer_size
        self._buf: Optional[bytearray] = None

    def take(self) -> bytearray:
        buf, self._buf = self._buf, None
        return buf if buf is not None else bytearray(self._size)

    def give_back(self, buf: bytearray) -> None:
        self._buf = buf

    def submit(self, buf: bytearray, n: int) -> None:
        self._hash.update(memoryview(buf)[:n])
        self._buf = buf

    def update(self, data: bytes) -> None:
        self._hash.update(data)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def close(self) -> None:
        pass


class PartFile:
    """``<blob>.part``: the bytes so far and their running sha256, kept in step."""

    def __init__(self, path: Path, size: int, buffer_size: int = DEFAULT_BUFFER) -> None:
        self.path = path
        self.size = size
        self.buffer_size = max(1, buffer_size)
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0)
        self._fd: Optional[int] = os.open(str(path), flags, 0o644)
        fd = self._fd
        existing = os.fstat(fd).st_size
        prefix = hashlib.sha256()
        self.offset = 0
        if 0 < existing <= size:
            # Resume: re-hash what is already on disk (a local read, not a network one).
            buf = bytearray(self.buffer_size)
            view = memoryview(buf)
            with os.fdopen(os.dup(fd), "rb", buffering=0) as fh:
                while True:
                    n = fh.readinto(view)
                    if not n:
                        break
                    prefix.update(view[:n])
                    self.offset += n
        if existing != self.offset:
            # Only when there is something to cut: ext4 flushes a file truncated to zero and
            # rewritten when it is closed (auto_da_alloc), which would stall every new download.
            os.ftruncate(fd, self.offset)
        os.lseek(fd, self.offset, os.SEEK_SET)
        self._hash = self._hasher(prefix)

    def _hasher(self, initial: Any) -> Union[HashBehind, _HashInline]:
        if self.size - self.offset >= HASH_BEHIND_MIN:
            return HashBehind(initial, buffer_size=self.buffer_size)
        return _HashInline(initial, self.buffer_size)

    # -- the zero-copy path: fill a buffer from the network, then commit it -------------------
    def buffer(self) -> bytearray:
        """A free buffer of ``buffer_size`` bytes to read into; hand it to :meth:`write` (with
        ``buffer=``) or back with :meth:`give_back`."""
        return self._hash.take()

    def give_back(self, buf: bytearray) -> None:
        self._hash.give_back(buf)

    def write(self, data: Any, buffer: Optional[bytearray] = None) -> None:
        """Append ``data`` (bytes-like) and hash it. With ``buffer`` (from :meth:`buffer`; ``data``
        a view of its start), the buffer is handed to the hasher instead of being copied."""
        view = memoryview(data)
        n = view.nbytes
        fd = self._fd
        if fd is None:
            raise ValueError("write to a closed part file")
        done = 0
        try:
            while done < n:
                done += os.write(fd, view[done:])
        except BaseException:
            if done:  # keep file, hash and offset in step: the bytes written stay, hashed
                self._hash.update(bytes(view[:done]))
                self.offset += done
            if buffer is not None:
                self._hash.give_back(buffer)
            raise
        if buffer is not None:
            self._hash.submit(buffer, n)
        else:
            self._hash.update(data)
        self.offset += n

    def reset(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.lseek(self._fd, 0, os.SEEK_SET)
        self._hash.close()
        self.offset = 0
        self._hash = self._hasher(hashlib.sha256())

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def flush(self, fsync: bool = False) -> None:
        """Writes go straight to the descriptor; ``fsync`` also makes them durable."""
        if fsync and self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        self._hash.close()
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
