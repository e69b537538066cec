"""The build cache: one slot per set of build inputs, its record, its lock, remembered digests.

A slot is named by :func:`cache_key` — the source's sha256, the variant, the exact CMake options,
the machine and (for CUDA) the toolchain — so a repeated build is a lookup. The slot holds the
compiled wheel, its lean packaging and ``build.json`` (a :class:`BuildResult`, its paths relative
to the cache root, so a moved or copied cache is still a cache); ``<slot>.lock`` keeps two
accelstack processes from building the same slot at once. A slot carries :data:`SLOT_MARK` from
the moment it is made (before any build.json), so ``cache purge builds`` deletes only folders
accelstack made, never one of the user's that happens to have a 20-hex-digit name.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import platform
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional

from filelock import FileLock, Timeout

from ..artifacts.cache import hash_file
from ..events import ProgressCallback, ProgressEvent, null_progress
from ..fsio import try_write_bytes, write_text
from ..limits import read_capped
from ..settings import Settings

__all__ = ["SLOT_NAME", "BUILDER_VERSION", "SLOT_MARK", "make_slot", "is_slot", "BuildResult", "build_cache_dir", "build_lock", "cache_key", "cached_sha256", "in_cache",
           "remembered_sha256", "read_record", "sha256_file", "write_json", "write_record"]

log = logging.getLogger(__name__)

BUILDER_VERSION = 1  # bump when the build recipe changes in a way the options do not show
SLOT_MARK = ".accelstack-build"  # in every build slot accelstack makes: what makes it ours to delete


@dataclass
class BuildResult:
    variant: str
    wheel: str  # path of the wheel in the cache (or in out_dir when one was given)
    sha256: str
    size: int
    cmake_args: List[str]
    source_sha256: str
    key: str
    properties: Dict[str, object] = field(default_factory=dict)
    cache_hit: bool = False
    seconds: float = 0.0
    platform_tag: str = ""
    installed_size: int = 0  # bytes the wheel's files take once installed (its uncompressed contents)
    packaging: int = 0  # PACKAGING_VERSION that made ``wheel`` (0: the wheel as the compile left it)
    compiled_wheel: str = ""  # the wheel as compiled, before packaging (in the cache slot)
    # NVIDIA runtime wheels a CUDA build links but does not carry: {name, version, sha256, size, url}
    # of the exact files its toolchain used (the manifest's cuda_libs)
    cuda_libs: List[Dict[str, Any]] = field(default_factory=list)
    toolchain: Dict[str, Any] = field(default_factory=dict)  # CUDA: the nvcc used, its version, its packages


def build_cache_dir(settings: Settings) -> Path:
    """The build cache of ``settings`` (``Settings.build_cache``: ``ACCELSTACK_BUILD_CACHE``, else
    ``builds`` in the download cache)."""
    return settings.build_cache


def sha256_file(path: Path) -> str:
    return hash_file(path).hexdigest()


def remembered_sha256(path: Path) -> str:
    """The sha256 :func:`cached_sha256` remembered for ``path`` while its size and mtime still
    match, else "": reads only (a dry run asks this)."""
    try:
        st = path.stat()
        remembered = read_capped(path.with_name(path.name + ".sha256"), 4096).decode("utf-8", "replace")  # never blocks on a FIFO
        digest, seen = (remembered.split(" ", 1) + [""])[:2]
    except OSError:
        return ""
    return digest if seen.strip() == f"{st.st_size} {st.st_mtime_ns}" and len(digest) == 64 else ""


def cached_sha256(path: Path) -> str:
    """sha256 of a build-cache file, remembered in ``<file>.sha256`` with its size and mtime.

    A cache hit is on the path of every install that builds locally; re-hashing the 20 MB source
    and the 19 MB wheel each time would dominate a no-op run.
    """
    digest = remembered_sha256(path)
    if digest:
        return digest
    st = path.stat()
    digest = sha256_file(path)
    side = path.with_name(path.name + ".sha256")
    try_write_bytes(side, f"{digest} {st.st_size} {st.st_mtime_ns}\n".encode())  # a read-only cache still works, only slower
    return digest


SLOT_NAME = re.compile(r"^[0-9a-f]{20}\Z")  # a build slot's folder: its cache_key


def cache_key(source_sha256: str, variant: str, cmake_args: List[str],
              toolchain: Optional[Mapping[str, Any]] = None) -> str:
    """The build slot of a source, variant and options; ``toolchain`` (a CUDA build's compiler
    and package versions) joins the key only when given, so other variants' keys stay as they were."""
    facts: Dict[str, Any] = {"source": source_sha256, "variant": variant, "cmake": cmake_args,
                             "builder": BUILDER_VERSION, "machine": platform.machine(), "system": platform.system()}
    if toolchain:
        facts["toolchain"] = dict(toolchain)
    material = json.dumps(facts, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()[:20]


@contextlib.contextmanager
def build_lock(path: Path, variant: str, progress: ProgressCallback = null_progress,
               poll: float = 1.0) -> Iterator[None]:
    """Hold the build slot's lock. When another process holds it (another accelstack building the
    same variant), say so and tick every ``poll`` seconds until it is free: a wait of minutes
    must not look like a hang."""
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        task = f"waiting for the {variant} build lock"
        said = f"waiting for another accelstack build of {variant} (lock {path})"
        log.info("%s", said)
        progress(ProgressEvent("message", "build", task=variant, message=said))
        progress(ProgressEvent("start", "build", task=task, message=said))
        start = time.monotonic()
        try:
            while True:
                try:
                    lock.acquire(timeout=poll)
                    break
                except Timeout:
                    progress(ProgressEvent("advance", "build", task=task, message=said,
                                           extra={"elapsed": round(time.monotonic() - start, 1), "lock": str(path)}))
        except BaseException:
            progress(ProgressEvent("end", "build", task=task, ok=False, message="stopped waiting for the build lock"))
            raise
        waited = time.monotonic() - start
        log.info("got the %s build lock after %.1f s", variant, waited)
        progress(ProgressEvent("end", "build", task=task, ok=True,
                               message=f"the other build of {variant} finished after {waited:.0f} s of waiting"))
    try:
        yield
    finally:
        lock.release()


_PATHS = ("wheel", "compiled_wheel")  # the fields of a record that name files in the cache


def in_cache(recorded: str, root: Path, key: str) -> str:
    """The path a record's ``recorded`` file has in the cache at ``root``: relative to the root as
    written now, or (an older, absolute record) re-rooted at its slot ``key``, so that a cache moved
    with its records still finds its files."""
    if not recorded:
        return recorded
    path = Path(recorded)
    if not path.is_absolute():
        return str(root / path)
    if key and key in path.parts:
        return str(root.joinpath(*path.parts[path.parts.index(key):]))
    return recorded


def make_slot(slot: Path) -> Path:
    """The build slot ``slot`` (made if missing), carrying accelstack's mark."""
    slot.mkdir(parents=True, exist_ok=True)
    if not (slot / SLOT_MARK).is_file():
        write_text(slot / SLOT_MARK, json.dumps({"key": slot.name, "builder": BUILDER_VERSION}))
    return slot


def is_slot(path: Path) -> bool:
    """A real folder accelstack made as a build slot: it carries :data:`SLOT_MARK`, or (a slot made
    before the mark existed) a ``build.json`` that is a build record of this very key."""
    try:
        if path.is_symlink() or not path.is_dir():
            return False
        mark = path / SLOT_MARK
        if mark.is_file() and not mark.is_symlink():
            return True
        record = path / "build.json"
        if record.is_symlink() or not record.is_file():
            return False
        data = json.loads(read_capped(record, 1 << 20))
        return isinstance(data, dict) and data.get("key") == path.name and "sha256" in data and "variant" in data
    except (OSError, ValueError):
        return False


def read_record(record: Path) -> Optional[BuildResult]:
    """The recorded build in a cache slot (``<root>/<key>/build.json``), its paths made absolute
    for this cache's place, if its wheel is still there and intact."""
    if not record.is_file():
        return None
    try:
        result = BuildResult(**json.loads(read_capped(record, 1 << 20)))
        root = record.parent.parent
        for name in _PATHS:
            setattr(result, name, in_cache(getattr(result, name), root, str(result.key)))
    except (OSError, ValueError, TypeError) as exc:
        log.info("ignoring unreadable build record %s (%s)", record, exc)
        return None
    wheel = Path(result.wheel)
    if not wheel.is_file() or cached_sha256(wheel) != result.sha256:
        log.info("cached wheel %s is missing or changed; building again", wheel)
        return None
    result.cache_hit = True
    return result


def write_record(path: Path, result: BuildResult, *, root: Optional[Path] = None, **changes: Any) -> None:
    """Write ``result`` (with ``changes``) as the build record ``path``, replaced whole; with
    ``root`` (the build cache a slot's record is in), its files are named relative to it."""
    data = {**asdict(result), **changes}
    if root is not None:
        for name in _PATHS:
            with contextlib.suppress(ValueError):  # a file outside the cache keeps its absolute path
                data[name] = Path(data[name]).relative_to(root).as_posix() if data[name] else data[name]
    write_json(path, data)


def write_json(path: Path, data: object) -> None:
    """Replace ``path`` with ``data`` as indented JSON."""
    write_text(path, json.dumps(data, indent=2))
