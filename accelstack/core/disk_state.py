"""What is on disk right now, read without taking the home's lock: which runtime is active, where
an installed runtime lives, and how much of a download the cache keeps.

For a command that must say what an interrupted install left (Ctrl-C) or find a runtime to run;
a reading that fails answers "none" instead of raising, since the caller is already reporting
something else.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Tuple

from ..artifacts.cache import Cache
from ..errors import AccelstackError
from ..installer.errors import StateError
from ..installer.home import Home
from ..installer.records import Receipt
from ..settings import Settings

__all__ = ["active_id", "active_runtime_id", "runtime_path", "kept_downloads"]


def active_id(home: Home, stack: str) -> str:
    """The id of ``stack``'s active runtime ("" when none, or the pointer cannot be read)."""
    try:
        return home.read_active().active.get(stack, "")
    except StateError:
        return ""


def active_runtime_id(settings: Settings, stack: str) -> str:
    """The id of ``stack``'s active runtime; "" when none is, or the pointer cannot be read."""
    home = Home(settings.home)
    try:
        return active_id(home, stack) if home.active_path.is_file() else ""
    except (AccelstackError, OSError):
        return ""


def runtime_path(settings: Settings, receipt: Receipt) -> Path:
    """Where the runtime of ``receipt`` is installed (a torch receipt's path is its interpreter)."""
    return Home(settings.home).runtime_path(receipt)


def kept_downloads(settings: Settings, blobs: Mapping[str, int]) -> Tuple[int, int]:
    """(bytes of partial downloads, bytes of finished ones) the cache keeps of ``blobs``
    (``{sha256: size}``; a size of 0 is unknown and counts as unfinished)."""
    cache = Cache(settings.cache)
    partial = sum(cache.part_size(h) for h in blobs)
    done = sum(size for h, size in blobs.items() if size and cache.valid(h, size, verify=False))
    return partial, done
