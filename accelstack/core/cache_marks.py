"""What makes a cache entry accelstack's: a mark it wrote itself, never its name alone (issue 47).

A cache may be pointed at a folder where a person keeps files (``ACCELSTACK_PROBE_CACHE=~/models``);
a folder or file of theirs can have exactly the name of one of accelstack's entries. ``cache purge``
and ``gc`` delete only what carries accelstack's mark, and each mark is what the writer already puts
there from the moment the entry exists:

- a probe folder: ``probe.json`` whose ``method`` names accelstack's synthesis
  (:mod:`accelstack.engine.probes.model`); a temporary one: its ``.owner`` record
  (:mod:`accelstack.engine.probes.owner`), or an empty folder (a kill before the record: nothing to lose);
- a pools file, finished or being written: :data:`~accelstack.engine.probes.weights.POOLS_MAGIC` first;
- a verify image: the ``parameters`` text verify writes (its prompt, ``accelstack probe``);
- a probe image record and a Vulkan answer: their JSON's ``what``/``format`` fields;
- a download: its ``.verified`` record naming the blob by its sha256 (:mod:`accelstack.artifacts.cache`),
  a ``.part`` the blob's lock file (taken before a ``.part`` is made);
- a build slot: :data:`~accelstack.publisher.build_cache.SLOT_MARK`.

Reads only regular files, without following a link or blocking on a FIFO, a few KiB at most.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from ..engine.models.family_reports import VERIFY_PARAMETERS
from ..engine.probes.layout import MARKER as PROBE_MARKER
from ..engine.probes.owner import has_owner, is_probe_folder
from ..engine.probes.weights import POOLS_MAGIC
from ..limits import read_capped

__all__ = ["probe_folder", "temporary_probe", "pools_file", "verify_image", "image_record", "vulkan_answer",
           "blob_stamp", "blob", "partial_download", "unfinished_write"]

MAX_MARK_BYTES = 64 << 10
RECORD_WHAT = "accelstack verify"  # engine.probes.record's "what"
VULKAN_FORMAT = "accelstack-detect-cache"  # hardware.vulkan_cache.CACHE_FORMAT


def _head(path: Path, limit: int = MAX_MARK_BYTES) -> bytes:
    try:
        return read_capped(path, limit)
    except OSError:
        return b""


def _doc(path: Path) -> Any:
    try:
        return json.loads(_head(path))
    except ValueError:
        return None


def probe_folder(path: Path) -> bool:
    """A probe folder probe_model renamed into place: its marker names the synthesis."""
    return is_probe_folder(path, PROBE_MARKER)


def temporary_probe(path: Path) -> bool:
    """A temporary probe folder: its ``.owner`` record (a folder a kill left before its record is
    not told from a person's, so it stays: it is empty)."""
    return has_owner(path)


def pools_file(path: Path) -> bool:
    """A pools file (or one being written): it begins with the pools header."""
    return _head(path, len(POOLS_MAGIC)) == POOLS_MAGIC


def verify_image(path: Path) -> bool:
    """A probe image verify wrote: a PNG whose parameters are verify's."""
    head = _head(path)
    return head.startswith(b"\x89PNG\r\n\x1a\n") and VERIFY_PARAMETERS in head


def image_record(path: Path) -> bool:
    doc = _doc(path)
    return isinstance(doc, dict) and isinstance(doc.get("what"), str) and RECORD_WHAT in doc["what"]


def vulkan_answer(path: Path) -> bool:
    doc = _doc(path)
    return isinstance(doc, dict) and doc.get("format") == VULKAN_FORMAT


def blob_stamp(path: Path) -> bool:
    """A ``<hex>.verified`` record that names its own blob."""
    doc = _doc(path)
    return isinstance(doc, dict) and doc.get("sha256") == path.name[:64]


def blob(path: Path) -> bool:
    """A blob is accelstack's when its ``.verified`` record names it (written as it was placed)."""
    return blob_stamp(path.with_name(path.name + ".verified"))


def partial_download(path: Path) -> bool:
    """A ``.part`` beside its blob's lock file: the downloader takes the lock before it writes one."""
    try:
        return stat.S_ISREG(os.lstat(path.with_name(path.name[:64] + ".lock")).st_mode)
    except OSError:
        return False


def unfinished_write(path: Path) -> bool:
    """``.<name>.<pid>.<random>.tmp`` (accelstack.fsio): accelstack's when what it holds already
    carries the mark of the file it was becoming (a pools file's header from its first bytes; a
    JSON document whole)."""
    target = path.name[1:].split(".tmp")[0]
    if target.startswith("pools-"):
        return pools_file(path)
    if target.startswith("image-"):
        return image_record(path)
    if target.startswith("vulkan-"):
        return vulkan_answer(path)
    return False

