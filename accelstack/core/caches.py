"""The caches accelstack keeps outside the runtime home, listed and purged (``accelstack cache``).

Four caches, each where :class:`~accelstack.settings.Settings` puts it:

``downloads`` (``Settings.cache``/blobs/sha256)
    verified artifacts by sha256 (:mod:`accelstack.artifacts.cache`): ``<hex>``, ``<hex>.part``
    (a resumable download), ``<hex>.verified`` (its hash record).
``builds`` (``Settings.build_cache``)
    compiled ggml wheels, one slot per build key (:mod:`accelstack.publisher.build`):
    ``<20 hex>/`` with ``build.json``, and ``sdist/`` with the bindings' source distribution.
``probe`` (``Settings.probe_cache``)
    the verify probe model (:mod:`accelstack.engine.probes.model`): folders ``sd1-f<N>-s<seed>/``
    (``custom-…`` for test architectures), the temporary ``.tmp-…`` folders verify synthesizes
    into and removes, and ``pools-f<N>-s<seed>-<dtype>.bin``, the encoded value pools that make
    synthesis twice as fast (27 MB); ``.pools-….bin.<pid>.tmp`` is one being written (or left by a
    process killed while writing it). ``verify --family F`` adds ``pools-<family>-f<N>-s<seed>-<dtype>.bin``
    and, when kept, ``<family>-f<N>-s<seed>/`` (:mod:`accelstack.engine.probes.family_files`), for the
    families verify knows only.
``service`` (``Settings.state_dir``/service/jobs)
    job folders (images) stopped services left (:mod:`.job_folders`); a running service's are kept.
``verify`` (``Settings.verify_dir``)
    ``verify-<backend>.png``, the last probe image of each backend, and ``image-<32 hex>.json``,
    the digest of a probe image a passing verify saw (:mod:`accelstack.engine.probes.record`): a
    later verify of the same runtime compares with it instead of generating twice.

An *entry* is something accelstack wrote there, recognised by its name pattern in its own cache
directory (each pattern declared by the layer that writes those names, gathered here) and by the mark it carries (:mod:`.cache_marks`: a name alone is never enough). Purging removes entries only: never a symbolic link (nor anything through one), never
a file accelstack does not name that way (``vulkan-headers/`` from scripts/setup-vulkan.sh: :mod:`.script_folders`
says whose, files a person put there), never the runtime home or anything holding it, never an entry another
process holds the lock of (a build or download in progress), and nothing on a dry run. Lock files
stay: deleting a lock another process may be waiting on would let two processes in at once.
"""
from __future__ import annotations

import logging
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Pattern, Sequence, Tuple

from filelock import FileLock, Timeout

from ..artifacts.cache import ENTRY_NAME
from ..engine.memory.converted import CACHE_KINDS as CONVERTED
from ..engine.probes.families import FAMILIES
from ..engine.probes.family_files import FAMILY_FORMAT_VERSION as FAMILY_FORMAT
from ..engine.probes.family_files import FAMILY_POOLS_NAME, FAMILY_PROBE_NAME
from ..engine.probes.model import FORMAT_VERSION as PROBE_FORMAT
from ..engine.probes.model import POOLS_NAME, PROBE_NAME, TEMPORARY_NAME, temporary_probe_holder
from ..engine.probes.record import RECORD_NAME, VERIFY_IMAGE_NAME
from ..fsio import temp_names_of
from ..hardware.vulkan_cache import ANSWER_NAME
from ..publisher.build_cache import SLOT_NAME, is_slot
from ..publisher.sdist import SDIST_FILE_NAME
from ..serde import size_text
from ..settings import Settings
from . import cache_marks as marks
from . import job_folders
from .script_folders import written_by

__all__ = ["CACHES", "CacheEntry", "CacheInfo", "PurgeReport", "cache_infos", "purge", "tree_size"]

log = logging.getLogger(__name__)

CACHES = ("downloads", "builds", "probe", "verify", "detect", "service", "converted")
DESCRIPTIONS = {
    "downloads": "verified downloads (runtime archives) by sha256; re-downloaded when needed",
    "builds": "ggml runtimes compiled on this machine, and the bindings' source; rebuilt when needed (minutes)",
    "probe": "the verify probe model's value pools (and any kept probe); made again when needed (seconds)",
    "verify": "verify's last probe images and its records of them; without a record the next verify generates twice",
    "detect": "detection's kept Vulkan enumeration; without it the next detect starts the Vulkan drivers again (~0.2 s)",
    "service": "the job folders (images) of stopped services; a running service's are in use, kept",
    "converted": "models converted on load (--weight-type), each once (engine.memory.converted); converted again when needed",
}

# each cache's names are declared by the layer that writes them, and gathered here; a pools file
# or record being written, or left by a process killed while writing it (accelstack.fsio.try_write_bytes)
_UNFINISHED = temp_names_of(POOLS_NAME, RECORD_NAME, ANSWER_NAME)


@dataclass
class CacheEntry:
    """One thing accelstack wrote in a cache: a file or a folder."""

    name: str  # relative to the cache's directory, '/'-separated
    path: str
    size: int
    kind: str  # "blob", "partial download", "hash record", "build", "source", "probe model", "probe pools", ...
    busy: bool = False  # in use by a running service (another process's lock: checked only when purging)


@dataclass
class CacheInfo:
    name: str  # "downloads" | "builds" | "probe"
    path: str  # the directory this cache's entries live in
    description: str
    exists: bool = False
    size: int = 0  # bytes of accelstack's entries
    entries: List[CacheEntry] = field(default_factory=list)
    other: List[str] = field(default_factory=list)  # names left alone: links, files accelstack did not write
    written_by: Dict[str, str] = field(default_factory=dict)  # those of ``other`` the project's scripts wrote: whose

    __derived__ = ("count",)

    @property
    def count(self) -> int:
        return len(self.entries)


@dataclass
class PurgeReport:
    dry_run: bool
    caches: List[str]
    bytes_freed: int = 0  # would be freed, on a dry run
    removed: List[str] = field(default_factory=list)  # paths (would be) removed
    kept: List[str] = field(default_factory=list)  # "path: why" for entries left in place


def tree_size(path: Path) -> int:
    """Bytes of the regular files in ``path`` (a file, or a folder walked without following links)."""
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size if stat.S_ISREG(st.st_mode) else 0
    total = 0
    for root, dirs, files in os.walk(path, followlinks=False):
        for name in files + dirs:
            try:
                s = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if stat.S_ISREG(s.st_mode):
                total += s.st_size
    return total


def _real_dir(path: Path) -> bool:
    return job_folders.real_dir(path)


def _children(directory: Path) -> List[Tuple[str, os.stat_result]]:
    """(name, lstat) of what is in ``directory``; nothing when it is missing or is a link."""
    if not _real_dir(directory):
        return []
    out = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    for name in names:
        try:
            out.append((name, os.lstat(directory / name)))
        except OSError:
            continue
    return out


def _downloads(s: Settings) -> CacheInfo:
    root = s.cache / "blobs" / "sha256"
    info = CacheInfo("downloads", str(root), DESCRIPTIONS["downloads"], exists=_real_dir(root))
    for name, st in _children(root):
        if name.endswith(".lock"):
            continue
        kind = "partial download" if name.endswith(".part") else "hash record" if name.endswith(".verified") else "blob"
        marked = {"blob": marks.blob, "partial download": marks.partial_download, "hash record": marks.blob_stamp}[kind]
        if not ENTRY_NAME.match(name) or not stat.S_ISREG(st.st_mode) or not marked(root / name):
            info.other.append(name)
            continue
        info.entries.append(CacheEntry(name, str(root / name), st.st_size, kind))
    return info


def _builds(s: Settings) -> CacheInfo:
    root = s.build_cache
    info = CacheInfo("builds", str(root), DESCRIPTIONS["builds"], exists=_real_dir(root))
    for name, st in _children(root):
        if name.endswith(".lock"):
            continue
        if SLOT_NAME.match(name) and stat.S_ISDIR(st.st_mode) and is_slot(root / name):  # the name alone is not enough
            info.entries.append(CacheEntry(name, str(root / name), tree_size(root / name), "build"))
        elif name == "sdist" and stat.S_ISDIR(st.st_mode):
            for fname, fst in _children(root / name):
                if SDIST_FILE_NAME.match(fname) and stat.S_ISREG(fst.st_mode):
                    info.entries.append(CacheEntry(f"sdist/{fname}", str(root / name / fname), fst.st_size, "source"))
                else:
                    info.other.append(f"sdist/{fname}")
        else:
            info.other.append(name)
    return info


def _probe(s: Settings) -> CacheInfo:
    root = s.probe_cache
    info = CacheInfo("probe", str(root), DESCRIPTIONS["probe"], exists=_real_dir(root))
    for name, st in _children(root):
        if name.endswith(".lock"):
            continue
        family = _family_format(name, st)
        if not _probe_marked(root / name, st):
            info.other.append(name)
        elif PROBE_NAME.match(name) and stat.S_ISDIR(st.st_mode):
            kind = "probe model" if f"-f{PROBE_FORMAT}-" in name else "probe model (older format, unused)"
            info.entries.append(CacheEntry(name, str(root / name), tree_size(root / name), kind))
        elif family is not None:
            kind = "probe model" if stat.S_ISDIR(st.st_mode) else "probe pools"
            kind += "" if family == FAMILY_FORMAT else " (older format, unused)"
            size = tree_size(root / name) if stat.S_ISDIR(st.st_mode) else st.st_size
            info.entries.append(CacheEntry(name, str(root / name), size, kind))
        elif TEMPORARY_NAME.match(name) and stat.S_ISDIR(st.st_mode):
            info.entries.append(CacheEntry(name, str(root / name), tree_size(root / name), "temporary probe"))
        elif POOLS_NAME.match(name) and stat.S_ISREG(st.st_mode):  # written whole (renamed into place): no lock
            kind = "probe pools" if f"-f{PROBE_FORMAT}-" in name else "probe pools (older format, unused)"
            info.entries.append(CacheEntry(name, str(root / name), st.st_size, kind))
        elif _UNFINISHED.match(name) and stat.S_ISREG(st.st_mode):
            info.entries.append(CacheEntry(name, str(root / name), st.st_size, "unfinished write"))
        else:
            info.other.append(name)
    return info


def _probe_marked(path: Path, st: os.stat_result) -> bool:
    """Whether ``path`` carries accelstack's mark for what its name says it is (:mod:`.cache_marks`)."""
    name = path.name
    if stat.S_ISDIR(st.st_mode):
        return marks.temporary_probe(path) if TEMPORARY_NAME.match(name) else marks.probe_folder(path)
    if stat.S_ISREG(st.st_mode):
        return marks.unfinished_write(path) if name.startswith(".") else marks.pools_file(path)
    return False


def _family_format(name: str, st: os.stat_result) -> Optional[int]:
    """The format of a family probe's folder or pools file named ``name`` (None: not one), for the
    families verify knows (engine.probes.families; sd1 keeps probe_model's names)."""
    m = (FAMILY_PROBE_NAME if stat.S_ISDIR(st.st_mode) else FAMILY_POOLS_NAME if stat.S_ISREG(st.st_mode) else None)
    found = m.match(name) if m is not None else None
    if found is None or found["family"] not in FAMILIES or found["family"] == "sd1":
        return None
    return int(found["format"])


def _named_files(name: str, root: Path, kinds: Sequence[Tuple[Pattern[str], str, Callable[[Path], bool]]]) -> CacheInfo:
    """A cache of regular files recognised by name and mark: each matching file that carries its
    kind's mark is an entry of that kind; anything else (a link, a folder, a file of the user's,
    one only named like ours) is left alone."""
    info = CacheInfo(name, str(root), DESCRIPTIONS[name], exists=_real_dir(root))
    for entry, st in _children(root):
        found = next(((k, m) for pattern, k, m in kinds if pattern.match(entry)), None) if stat.S_ISREG(st.st_mode) else None
        kind = found[0] if found is not None and found[1](root / entry) else None
        if kind is None:
            info.other.append(entry)
        else:
            info.entries.append(CacheEntry(entry, str(root / entry), st.st_size, kind))
    return info


def _verify(s: Settings) -> CacheInfo:
    return _named_files("verify", s.verify_dir, [(VERIFY_IMAGE_NAME, "verify image", marks.verify_image),
                                                 (RECORD_NAME, "probe image record", marks.image_record),
                                                 (_UNFINISHED, "unfinished write", marks.unfinished_write)])


def _detect(s: Settings) -> CacheInfo:
    return _named_files("detect", s.detect_cache, [(ANSWER_NAME, "vulkan enumeration", marks.vulkan_answer),
                                                   (_UNFINISHED, "unfinished write", marks.unfinished_write)])


def _service(s: Settings) -> CacheInfo:
    root = job_folders.jobs_root(s.state_dir)
    info = CacheInfo("service", str(root), DESCRIPTIONS["service"], exists=_real_dir(root))
    for folder, running in job_folders.left(root):
        info.entries.append(CacheEntry(folder.name, str(folder), tree_size(folder),
                                       f"job folder (its service {'is running' if running else 'stopped'})", busy=running))
    return info


_READERS: Dict[str, Callable[[Settings], CacheInfo]] = {"downloads": _downloads, "builds": _builds, "probe": _probe,
                                                        "verify": _verify, "detect": _detect, "service": _service, "converted": lambda s: _named_files("converted", s.cache / "converted", CONVERTED)}


def cache_infos(settings: Optional[Settings] = None, which: Optional[List[str]] = None) -> List[CacheInfo]:
    """Each cache (``which``, default all): its directory, accelstack's entries in it and their size.

    Reads only: nothing is created, locked or changed."""
    s = settings or Settings.resolve()
    out = []
    for name in which or list(CACHES):
        info = _READERS[name](s)
        info.size = sum(e.size for e in info.entries)
        info.written_by = written_by(name, Path(info.path), info.other)
        out.append(info)
    return out


def _holds(path: Path, home: Path) -> bool:
    """True when ``path`` is the home or a folder the home lies inside (never deleted)."""
    try:
        p, h = Path(os.path.abspath(path)), Path(os.path.abspath(home))
        rp, rh = path.resolve(), home.resolve()
    except (OSError, RuntimeError):
        return True  # unsure: keep it
    return p == h or p in h.parents or rp == rh or rp in rh.parents


def _lock_path(cache: str, entry: CacheEntry) -> Optional[Path]:
    """The lock another process holds while it writes ``entry`` (None: the entry has none)."""
    path = Path(entry.path)
    if cache == "downloads":
        return path.parent / (entry.name[:64] + ".lock")
    if cache == "builds" and entry.kind == "build":
        return path.parent / (entry.name + ".lock")
    if cache == "probe" and entry.kind.startswith("probe model"):
        return path.parent / (entry.name + ".lock")
    return None


def _remove(path: Path) -> None:
    """Delete a file, or a real folder (rmtree never follows the links inside it)."""
    if _real_dir(path):
        def retry_writable(func, p, _exc):  # read-only files (blobs are 0444; Windows refuses those)
            try:
                os.chmod(p, stat.S_IWRITE | stat.S_IREAD)
                func(p)
            except OSError:
                pass
        shutil.rmtree(path, onerror=retry_writable)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except PermissionError:
            os.chmod(path, stat.S_IWRITE | stat.S_IREAD)
            os.unlink(path)


def purge(which: List[str], settings: Optional[Settings] = None, *, dry_run: bool = False) -> PurgeReport:
    """Remove accelstack's entries from the caches named in ``which`` (see the module docstring
    for what is never removed); with ``dry_run``, only say what would go and how much it frees."""
    s = settings or Settings.resolve()
    report = PurgeReport(dry_run=dry_run, caches=list(which))
    for info in cache_infos(s, which):
        probe_live = _live_temporary_probes(Path(info.path)) if info.name == "probe" else {}
        for entry in info.entries:
            path = Path(entry.path)
            if path.is_symlink():
                report.kept.append(f"{path}: a symbolic link")
                continue
            if _holds(path, s.home):
                report.kept.append(f"{path}: holds the runtime home {s.home}")
                continue
            if entry.name in probe_live or entry.busy:
                report.kept.append(f"{path}: {probe_live.get(entry.name) or 'in use by a running service'}")
                continue
            lock_path = _lock_path(info.name, entry)
            if dry_run:
                report.removed.append(str(path))
                report.bytes_freed += entry.size
                continue
            lock = FileLock(str(lock_path)) if lock_path is not None and lock_path.parent.is_dir() else None
            try:
                if lock is not None:
                    lock.acquire(timeout=0)
            except Timeout:
                report.kept.append(f"{path}: in use by another accelstack process")
                continue
            except OSError as exc:
                report.kept.append(f"{path}: cannot take its lock ({exc.strerror or exc})")
                continue
            try:
                size = tree_size(path)
                (job_folders.remove if info.name == "service" else _remove)(path)
            except OSError as exc:
                report.kept.append(f"{path}: {exc.strerror or exc}")
                continue
            finally:
                if lock is not None:
                    lock.release()
            log.info("purged %s (%s)", path, size_text(size))
            report.removed.append(str(path))
            report.bytes_freed += size
        if not dry_run and info.name == "builds":
            sdist = Path(info.path) / "sdist"
            try:
                if _real_dir(sdist) and not os.listdir(sdist):
                    sdist.rmdir()
            except OSError:
                pass
    return report


def _live_temporary_probes(root: Path) -> Dict[str, str]:
    """Temporary probe folders left alone, each with why (its verify runs, or may: engine.probes.owner)."""
    held = {name: temporary_probe_holder(root / name) for name, _st in _children(root) if TEMPORARY_NAME.match(name)}
    return {name: why for name, why in held.items() if why}
