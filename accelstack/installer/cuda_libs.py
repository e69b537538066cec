"""NVIDIA's CUDA runtime libraries, shared by every CUDA runtime in a home instead of bundled in each.

A CUDA build of ggml needs ``libcudart`` and cuBLAS (~600 MB together); its manifest entry names
NVIDIA's wheels for them (``cuda_libs``: ``nvidia-cuda-runtime``, ``nvidia-cublas``, ``-cu12`` for
CUDA 12) instead of carrying copies. For each such wheel the installer, in order of preference:

1. reuses a torch environment this home installed torch into, when it already has that wheel at
   the same major and at least the same version (``site-packages/nvidia/*/lib``): nothing fetched;
2. reuses ``<home>/shared/cuda/<sha256>/``, unpacked by an earlier install (another runtime, an
   older version of this one): nothing fetched, nothing copied;
3. fetches the wheel through the artifact cache (sha256-checked) and unpacks only its shared
   libraries and metadata into that directory, staged and renamed into place like a runtime.

The runtime directory gets a small file, :data:`LINK_FILE`, saying where its libraries are and
which to load first; :mod:`accelstack.engine.runtime` reads it when it starts a worker (preload in
dependency order, library path set). Directories in the home are written relative to it, so a
moved home keeps working. The receipt lists every wheel unpacked into the home among its
``artifacts``; :func:`remove_unreferenced` deletes a shared directory only when no receipt names
it, only one accelstack marked as its own, and nothing at all while any receipt is unreadable.
macOS has no CUDA: nothing here runs there.
"""
from __future__ import annotations

import glob
import json
import logging
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence

from packaging.version import InvalidVersion, Version

from .. import fsio
from ..artifacts.cache import hash_file
from ..domain import RUNTIME_LIBS_NOTE, RUNTIME_LIBS_NOTE_FORMAT
from ..errors import Action
from ..events import ProgressCallback, ProgressEvent, null_progress
from ..limits import read_capped
from ..refs import ArtifactRef
from ..serde import plural, to_dict
from .errors import InstallError, StateError
from .home import Home, read_state
from .records import InstalledFile, stamp_files
from .recovery import readable_receipts
from .shared_libs import _SHA, _WHEEL, CONTENTS, SHARED, shared_files, shared_refs, shared_root
from .wheel import extract_wheel_files

__all__ = ["SHARED", "LINK_FILE", "CONTENTS", "LibFetcher", "LibWheel", "parse_wheel_name", "LibLocation", "ProvidedLibs",
           "shared_root", "shared_files", "shared_refs", "torch_site_packages", "find_in_site", "provide", "restore",
           "write_links", "remove_unreferenced"]

log = logging.getLogger(__name__)

LINK_FILE = RUNTIME_LIBS_NOTE  # in a runtime directory; read by accelstack.engine.runtime
# The libraries each NVIDIA wheel provides that a ggml build links, in the order they load
# (cuBLAS needs cuBLASLt). A wheel not listed here is put on the library path but not preloaded.
_STEMS: Dict[str, List[str]] = {"nvidia_cuda_runtime": ["cudart"], "nvidia_cublas": ["cublasLt", "cublas"]}
_ORDER = ["nvidia_cuda_runtime", "nvidia_cublas"]

LibFetcher = Callable[[List[ArtifactRef]], Dict[str, Path]]  # refs -> {sha256: verified file}, like artifacts.fetch


@dataclass
class LibWheel:
    """What an NVIDIA library wheel's file name says."""

    dist: str  # normalized: "nvidia_cublas_cu12"
    version: str
    major: int
    family: str  # without the "_cuNN" suffix: "nvidia_cublas"

    def library_names(self, windows: Optional[bool] = None) -> List[str]:
        """The files the dynamic loader looks for (``libcudart.so.13``; ``cudart64_13.dll``)."""
        win = os.name == "nt" if windows is None else windows
        return [f"{s}64_{self.major}.dll" if win else f"lib{s}.so.{self.major}" for s in _STEMS.get(self.family, [])]


def parse_wheel_name(name: str) -> LibWheel:
    m = _WHEEL.match(name)
    if not m:
        raise InstallError(f"{name!r} is not a wheel file name", hint="the manifest's cuda_libs entry is broken",
                           action=Action.REPORT_BUG)
    dist = re.sub(r"[-_.]+", "_", m["dist"]).lower()
    try:
        major = Version(m["version"]).release[0]
    except InvalidVersion:
        raise InstallError(f"{name!r} has no valid version", hint="the manifest's cuda_libs entry is broken",
                           action=Action.REPORT_BUG) from None
    return LibWheel(dist=dist, version=m["version"], major=major, family=re.sub(r"_cu[0-9]+\Z", "", dist))


@dataclass
class LibLocation:
    """One directory of CUDA libraries a runtime uses (the link file holds a list of these)."""

    dir: str  # relative to the home when ``base`` is "home", else absolute
    base: str  # "home" | "absolute"
    files: List[str] = field(default_factory=list)  # to preload from ``dir``, in order
    source: str = ""  # for people: which wheel, downloaded or from which torch environment
    sha256: str = ""  # the wheel a shared directory was unpacked from


@dataclass
class ProvidedLibs:
    """What :func:`provide` arranged: the locations, and the wheels now unpacked in the home."""

    locations: List[LibLocation] = field(default_factory=list)
    shared: List[ArtifactRef] = field(default_factory=list)  # go into the receipt's artifacts (gc's refcount)
    downloaded: List[str] = field(default_factory=list)  # sha256 of the ones fetched by this call
    reused_from_torch: List[str] = field(default_factory=list)  # site-packages directories used


def _check_shared_root(home: Home) -> Path:
    """``shared/cuda`` as a real directory inside the home (never through a link out of it)."""
    parent, root = home.root / SHARED[0], shared_root(home)
    for d in (parent, root):
        if d.is_symlink() or (d.exists() and not d.is_dir()):
            raise StateError(f"{d} is not a plain directory; accelstack keeps shared CUDA libraries inside the home and "
                             "never works through a link out of it", hint="remove it, or choose another home",
                             action=Action.CHOOSE_HOME)
    root.mkdir(parents=True, exist_ok=True)
    if os.stat(root).st_dev != os.stat(home.staging).st_dev:
        raise StateError(f"{root} and {home.staging} are on different filesystems", hint="keep the whole runtime home "
                         "on one disk", action=Action.CHOOSE_HOME)
    return root


# -- torch environments -----------------------------------------------------------------------
def torch_site_packages(home: Home) -> List[Path]:
    """site-packages of every torch environment this home installed into (from its receipts): the
    receipts whose runtime is an interpreter (a file; a ggml runtime is a directory of the home)."""
    receipts, _ = readable_receipts(home)
    out: List[Path] = []
    for r in sorted(receipts.values(), key=lambda r: r.installed_at, reverse=True):  # the newest first
        if not r.path or not home.runtime_path(r).is_file():
            continue
        env = home.runtime_path(r).parent.parent  # <venv>/bin/python, <venv>/Scripts/python.exe
        for site in sorted(glob.glob(str(env / "lib" / "python3*" / "site-packages"))) + [str(env / "Lib" / "site-packages")]:
            p = Path(site)
            if p.is_dir() and p not in out:
                out.append(p)
    return out


def _dist_version(info: Path) -> Optional[Version]:
    try:
        return Version(info.name[: -len(".dist-info")].rsplit("-", 1)[1])
    except (IndexError, InvalidVersion):
        return None


def find_in_site(site: Path, wheel: LibWheel, names: Sequence[str]) -> Optional[LibLocation]:
    """The directory of ``site`` holding all of ``names`` from an installed ``wheel.dist`` of the
    same major and at least ``wheel.version`` (an older minor may lack what the build calls)."""
    if not names:
        return None
    want = Version(wheel.version)
    for info in sorted(site.glob("*.dist-info")):
        stem = info.name[: -len(".dist-info")]  # "nvidia_cuda_runtime-13.0.96" ("dist-info" has a hyphen too)
        if re.sub(r"[-_.]+", "_", stem.rsplit("-", 1)[0]).lower() != wheel.dist:
            continue
        have = _dist_version(info)
        if have is None or have.release[0] != wheel.major or have < want:
            continue
        found: Dict[str, Path] = {}
        try:
            record = read_capped(info / "RECORD", 16 << 20).decode("utf-8", "replace").splitlines()  # never blocks on a FIFO
        except OSError:
            record = []
        for line in record:
            rel = line.split(",", 1)[0]
            base = rel.rsplit("/", 1)[-1]
            if base in names and ".." not in rel.split("/") and (site / rel).is_file():
                found.setdefault(base, (site / rel))
        for n in names:  # a RECORD that lacks them (or none): NVIDIA's layouts
            for pattern in (f"nvidia/*/lib/{n}", f"nvidia/*/bin/{n}", f"nvidia/*/bin/*/{n}"):
                for hit in sorted(site.glob(pattern)):
                    found.setdefault(n, hit)
        if all(n in found for n in names):
            dirs = {found[n].parent for n in names}
            if len(dirs) == 1:
                d = dirs.pop()
                return LibLocation(dir=str(d.resolve()), base="absolute", files=list(names),
                                   source=f"{info.name[: -len('.dist-info')]} from the torch environment {site}")
    return None


# -- the shared copy --------------------------------------------------------------------------
def _is_library(member: str) -> bool:
    base = member.rsplit("/", 1)[-1]
    return base.endswith((".dll", ".so")) or ".so." in base


def _wanted(member: str) -> bool:
    """Shared libraries and the package metadata (licence included); no headers, no static archives."""
    return ".dist-info/" in member or _is_library(member)


def _intact(d: Path, ref: ArtifactRef) -> bool:
    """Cheap: every file there, with the size (and, when recorded, mtime and inode) it was unpacked with."""
    files = shared_files(d, ref)
    if files is None:
        return False
    for f in files:
        try:
            st = os.lstat(d / f.path)
        except OSError:
            return False
        if not stat.S_ISREG(st.st_mode) or f.stat_matches(st) is False:
            return False
    return True


def _unpack_shared(home: Home, ref: ArtifactRef, wheel_file: Path) -> Path:
    root = _check_shared_root(home)
    final = root / ref.sha256
    stage = home.make_owned_dir(home.staging, f"cuda-{ref.sha256[:16]}.{os.getpid()}")
    try:
        files = extract_wheel_files(wheel_file, stage, ref.name, _wanted)
        # each file's hash and stat, as a receipt records its runtime's: status checks them cheaply,
        # status --deep and repair re-hash (the directory's rename keeps every inode and mtime)
        stamped = stamp_files(stage, [InstalledFile(path=f, sha256=hash_file(stage / f).hexdigest(),
                                                    size=(stage / f).stat().st_size) for f in files])
        contents = {"name": ref.name, "sha256": ref.sha256, "files": [to_dict(f) for f in stamped]}
        fsio.write_text(stage / CONTENTS, json.dumps(contents, indent=1))
        if final.exists() or final.is_symlink():  # a damaged copy of ours: replaced; anything else: refused
            if not home.remove_owned(final):
                raise StateError(f"{final} exists and was not made by accelstack", hint="move it out of the home",
                                 action=Action.CHOOSE_HOME)
        os.replace(stage, final)  # same filesystem (checked): atomic
    except BaseException:
        home.remove_owned(stage)
        raise
    return final


def restore(home: Home, ref: ArtifactRef, wheel_file: Path) -> Path:
    """Unpack ``ref`` again over a damaged shared copy of it (``repair``); the caller holds the lock."""
    return _unpack_shared(home, ref, wheel_file)


def _locations_in(home: Home, d: Path, ref: ArtifactRef, wheel: LibWheel) -> List[LibLocation]:
    data = json.loads(read_state(d / CONTENTS))
    libs = [Path(f["path"]) for f in data["files"] if _is_library(f["path"])]
    names = wheel.library_names()
    source = f"{wheel.dist} {wheel.version}, shared in the home"
    if not names:  # a wheel we know nothing about: its library directories go on the path, nothing preloaded
        dirs = sorted({lib.parent.as_posix() for lib in libs})
        return [LibLocation(dir=home.relative(d / x), base="home", source=source, sha256=ref.sha256) for x in dirs]
    by_dir: Dict[str, List[str]] = {}
    for n in names:
        hit = next((lib for lib in libs if lib.name == n), None)
        if hit is None:
            raise InstallError(f"{ref.name} does not contain {n}", hint="the manifest names the wrong library wheel for "
                               "this build", action=Action.REPORT_BUG)
        by_dir.setdefault(hit.parent.as_posix(), []).append(n)
    return [LibLocation(dir=home.relative(d / x), base="home", files=fs, source=source, sha256=ref.sha256)
            for x, fs in by_dir.items()]


def _load_order(refs: Iterable[ArtifactRef]) -> List[ArtifactRef]:
    def rank(ref: ArtifactRef) -> int:
        fam = parse_wheel_name(ref.name).family
        return _ORDER.index(fam) if fam in _ORDER else len(_ORDER)

    return sorted(refs, key=rank)  # stable: unknown wheels keep the manifest's order, last


def provide(home: Home, refs: Sequence[ArtifactRef], fetch: LibFetcher, *, torch_sites: Optional[Sequence[Path]] = None,
            progress: ProgressCallback = null_progress) -> ProvidedLibs:
    """Make every library wheel of ``refs`` available (see the module docstring), locations in
    load order; the caller holds the home's lock. ``torch_sites`` defaults to those of the home's
    torch receipts."""
    out = ProvidedLibs()
    if not refs:
        return out
    sites = torch_site_packages(home) if torch_sites is None else list(torch_sites)
    ordered = _load_order(refs)
    reused: Dict[str, LibLocation] = {}
    todo: List[ArtifactRef] = []
    for ref in ordered:
        if not _SHA.match(ref.sha256):
            raise InstallError(f"{ref.name}: {ref.sha256!r} is not a sha256", action=Action.REPORT_BUG)
        names = parse_wheel_name(ref.name).library_names()
        loc = next((hit for site in sites if (hit := find_in_site(site, parse_wheel_name(ref.name), names)) is not None), None)
        if loc is not None:
            reused[ref.sha256] = loc
            progress(ProgressEvent("message", "install", message=f"using {', '.join(names)} from {loc.source}"))
        elif not (home.owns(shared_root(home) / ref.sha256) and _intact(shared_root(home) / ref.sha256, ref)):
            todo.append(ref)
    if todo:
        progress(ProgressEvent("message", "install", message="fetching CUDA libraries: " + ", ".join(r.name for r in todo)))
        paths = fetch(todo)
        for ref in todo:
            progress(ProgressEvent("message", "install", message=f"unpacking {ref.name} into the shared CUDA library folder"))
            _unpack_shared(home, ref, paths[ref.sha256])
            out.downloaded.append(ref.sha256)
    for ref in ordered:
        if ref.sha256 in reused:
            out.locations.append(reused[ref.sha256])
            out.reused_from_torch.append(reused[ref.sha256].dir)
        else:
            out.locations += _locations_in(home, shared_root(home) / ref.sha256, ref, parse_wheel_name(ref.name))
            out.shared.append(ref)
    return out


def write_links(runtime_dir: Path, provided: ProvidedLibs) -> None:
    """The runtime's note of where its CUDA libraries are (read by :mod:`accelstack.engine.runtime`)."""
    doc = {"format": RUNTIME_LIBS_NOTE_FORMAT, "libraries": [to_dict(loc) for loc in provided.locations]}
    fsio.write_text(runtime_dir / LINK_FILE, json.dumps(doc, indent=1))


def remove_unreferenced(home: Home) -> List[str]:
    """Delete shared library directories no receipt names; the caller holds the home's lock.

    Conservative: with any receipt unreadable nothing is deleted (it might name any of them)."""
    root = shared_root(home)
    if root.is_symlink() or not root.is_dir() or (home.root / SHARED[0]).is_symlink():
        return []
    receipts, problems = readable_receipts(home)
    if problems:
        log.warning("kept the shared CUDA libraries: %s cannot be read", plural(len(problems), "receipt"))
        return []
    used = {a.sha256 for r in receipts.values() for a in r.artifacts}
    removed: List[str] = []
    for d in home.owned_children(root):
        if _SHA.match(d.name) and d.name not in used and home.remove_owned(d):
            removed.append(d.name)
    return removed
