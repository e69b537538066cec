"""Keeping what is installed healthy: upgrade, repair, rollback, uninstall (and what it would
free), gc and status, the same functions for both stacks.

Each one resolves ``Settings`` once, takes the home's lock (reads alone take none), runs
``recover`` first so a killed run never leaves a mess, and reports progress only through
``on_progress``; what differs between the stacks is their driver's (:mod:`.stacks`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence

from .. import fsio
from ..artifacts.cache import Cache
from ..events import ProgressCallback, null_progress
from ..hardware.report import HardwareReport
from ..installer import maintenance
from ..installer.errors import StateError
from ..installer.records import Active
from ..installer.recovery import active_or_rebuild, finish_removals, readable_receipts, recover
from ..installer.repair import RepairReport, unrepairable_error
from ..installer.transaction import Verifier
from ..settings import Settings
from . import job_folders
from .caches import cache_infos
from .context import home_of, prepare_home
from .detection import detect
from .installing import install
from .local_build import rebuilder
from .options import Services
from .results import InstallSummary
from .stacks import driver
from .status_check import status

__all__ = ["upgrade", "repair", "rollback", "uninstall", "uninstall_preview", "gc", "status", "SpaceUse",
           "UninstallPreview", "disk_usage", "cache_usage", "active_backend_request"]


def upgrade(*, stack: str = "ggml", report: Optional[HardwareReport] = None, settings: Optional[Settings] = None,
            backend: Optional[str] = None, verifier: Optional[Verifier] = None, services: Optional[Services] = None,
            on_progress: Optional[ProgressCallback] = None) -> InstallSummary:
    """Plan again from the current (or remembered) manifests; install the result side by side,
    verify it, switch. The old runtime stays for rollback."""
    s = settings or Settings.resolve()
    if backend is None:
        backend = active_backend_request(s, stack)
    return install(None, stack=stack, backend=backend, report=report, settings=s, verifier=verifier, prefer_remembered=True,
                   services=services, on_progress=on_progress)


def active_backend_request(s: Settings, stack: str) -> str:
    home = home_of(s)
    try:
        rid = home.read_active().active.get(stack, "")
        return home.read_receipt(rid).plan.request.backend if rid else s.backend
    except StateError:
        return s.backend


def repair(*, stack: str = "ggml", settings: Optional[Settings] = None, verifier: Optional[Verifier] = None,
           services: Optional[Services] = None, on_progress: Optional[ProgressCallback] = None) -> RepairReport:
    """Rebuild a damaged ``active.json`` (from its last good copy, else the receipts), restore the
    active runtime's missing or corrupt files (package metadata included) and verify it again. The
    report names the runtime now active and why (``active``, ``active_reason``)."""
    d = driver(stack)
    s = settings or Settings.resolve()
    progress = on_progress or null_progress
    svc = services or Services()
    if not d.repairable:
        return d.repair(s, verifier, svc.fetcher_for(s), progress)  # it says how that stack is repaired instead
    home, lock = prepare_home(s, "repair", progress, stack=stack)
    with lock:
        _, why = active_or_rebuild(home)
        recovered = [line for line in recover(home) if line.startswith(f"{stack}:")]
        rep = d.repair(s, verifier, svc.fetcher_for(s), progress,
                       rebuild=rebuilder(s, svc.builder_or_default(), lambda: detect(svc.system, settings=s)))
        rep.pointer_rebuilt = why is not None
        rep.active = rep.runtime
        if recovered:  # the pointer named an incomplete runtime: recover went back to the previous one
            rep.active_reason = recovered[-1].split(": ", 1)[1]
        elif why is not None:
            rep.active_reason = f"active.json was damaged and has been rebuilt: {why.get(stack, 'no runtime is named')}"
        else:
            rep.active_reason = "active.json names it; repair did not change which runtime is active"
    if rep.unrepairable:
        raise unrepairable_error(rep)
    return rep


def rollback(*, stack: str = "ggml", settings: Optional[Settings] = None,
             on_progress: Optional[ProgressCallback] = None) -> Active:
    """Switch back to the previous runtime of ``stack`` (``on_progress`` hears a wait for the lock)."""
    s = settings or Settings.resolve()
    home, lock = prepare_home(s, "rollback", on_progress or null_progress, stack=stack)
    with lock:
        recover(home)
        return maintenance.rollback(home, stack)


def uninstall(*, stack: str = "ggml", settings: Optional[Settings] = None,
              on_progress: Optional[ProgressCallback] = None) -> List[str]:
    """Remove every runtime of ``stack`` (a torch environment itself is never touched)."""
    s = settings or Settings.resolve()
    home, lock = prepare_home(s, "uninstall", on_progress or null_progress, stack=stack)
    with lock:
        recover(home)
        return maintenance.uninstall(home, stack)


@dataclass
class SpaceUse:
    """A thing on disk and its size: a runtime an uninstall removes, or a cache it leaves."""

    name: str
    path: str
    bytes: int
    note: str = ""


@dataclass
class UninstallPreview:
    """What ``uninstall`` would remove (and free), and the caches it leaves in place."""

    stack: str
    runtimes: List[SpaceUse] = field(default_factory=list)
    bytes: int = 0  # freed by removing ``runtimes``
    kept: List[SpaceUse] = field(default_factory=list)  # download, build and probe caches: `accelstack cache purge`


def disk_usage(path: Path, skip: Sequence[Path] = ()) -> int:
    """Bytes of the regular files under ``path`` (links not followed), leaving out ``skip`` subtrees."""
    skipped = {str(p) for p in skip}
    total = 0
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if os.path.join(root, d) not in skipped]
        for f in files:
            try:
                st = os.lstat(os.path.join(root, f))
            except OSError:
                continue
            if not os.path.islink(os.path.join(root, f)):
                total += st.st_size
    return total


def cache_usage(s: Settings) -> List[SpaceUse]:
    """The download, build, probe and verify caches with their sizes, measured as ``accelstack cache
    list`` measures them (:func:`.caches.cache_infos`: accelstack's entries, never a lock file or a
    file of the user's), so ``gc``, ``uninstall`` and ``cache list`` say the same size."""
    notes = {"builds": "local stable-diffusion.cpp builds, reused by the next install", "probe": "the verify probe model",
             "verify": "verify's probe images and its records of them"}
    return [SpaceUse(i.name, i.path, i.size, notes.get(i.name, ""))
            for i in cache_infos(s, ["downloads", "builds", "probe", "verify"])]


def uninstall_preview(*, stack: str = "ggml", settings: Optional[Settings] = None) -> UninstallPreview:
    """What :func:`uninstall` would remove and free, from reads alone (no lock, nothing written)."""
    s = settings or Settings.resolve()
    home = home_of(s)
    out = UninstallPreview(stack)
    receipts = readable_receipts(home)[0] if home.receipts.is_dir() else {}
    seen = set()
    for rid, r in sorted(receipts.items()):
        if r.stack != stack:
            continue
        where = home.runtime_path(r)
        d = driver(r.stack)
        if not d.removes_files:  # the environment is the user's: only the record goes
            out.runtimes.append(SpaceUse(rid, str(where), 0, d.uninstall_note(home, r)))
            continue
        size = disk_usage(where) if where.is_dir() and not where.is_symlink() else 0
        seen.add(where.resolve())
        out.runtimes.append(SpaceUse(rid, str(where), size))
    if home.runtimes(stack).is_dir():
        for left in home.owned_children(home.runtimes(stack)):
            if left.resolve() not in seen:
                out.runtimes.append(SpaceUse(left.name, str(left), disk_usage(left), "left over from an interrupted install"))
    out.bytes = sum(r.bytes for r in out.runtimes)
    out.kept = cache_usage(s)
    return out


def gc(*, settings: Optional[Settings] = None, on_progress: Optional[ProgressCallback] = None) -> maintenance.GcReport:
    """Remove inactive runtimes (keeping the previous one), downloads no home needs any more, and
    the job folders of services that have stopped."""
    s = settings or Settings.resolve()
    home, lock = prepare_home(s, "gc", on_progress or null_progress, release=False)
    with lock:
        finished = finish_removals(home)  # what a killed removal left: reported, then recover and gc go on
        try:
            before: Optional[Active] = home.read_active()
        except StateError:
            before = None  # maintenance.gc says so itself
        recover(home)  # may un-name an incomplete active runtime: gc still keeps its directory
        rep = maintenance.gc(home, Cache(s.cache), named_before=before)
        rep.removals_finished = [_discarded_name(n) for n in finished]
        rep.service_jobs_removed, freed = job_folders.sweep(job_folders.jobs_root(s.state_dir))  # a running one's stay
        rep.bytes_freed += freed
        return rep


def _discarded_name(trash: str) -> str:
    """``.accelstack-trash-<name>.<random>`` -> ``<name>``."""
    return trash[len(fsio.TRASH_PREFIX):].rsplit(".", 1)[0]
