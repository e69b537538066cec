"""Operations on installed runtimes: status, rollback, uninstall, gc, and the cache's home registry.

Each runs under the home's lock (except ``status``, which only reads) after ``recover``.
Deletion follows the home's rules: only directories accelstack marked as its own.
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Set

from .. import fsio
from ..artifacts.cache import Cache
from ..domain import STACKS
from ..errors import Action
from ..serde import plural
from . import cuda_libs
from .errors import StateError
from .home import Home, read_state
from .records import Active, Receipt, now_iso
from .recovery import active_or_rebuild, last_good_active, readable_receipts
from .status import StackStatus, StatusProblem, UpgradeCheck, local_status

__all__ = ["StatusProblem", "UpgradeCheck", "StackStatus", "local_status", "rollback", "uninstall", "remove_runtime", "KeptRuntime", "GcReport", "gc",
           "register_home", "blobs_of_other_homes", "referenced_blobs"]

log = logging.getLogger(__name__)


def rollback(home: Home, stack: str) -> Active:
    state = home.read_active()
    prev = state.previous.get(stack)
    if not prev:
        raise StateError(f"there is no previous {stack} runtime to go back to", hint="the status lists what is installed",
                         action=Action.STATUS)
    if not home.runtime_intact(stack, prev):
        raise StateError(f"the previous runtime {prev} is no longer complete", hint="install it again", action=Action.INSTALL)
    current = state.active.get(stack, "")
    state.active[stack] = prev
    if current:
        state.previous[stack] = current
    home.write_active(state)
    return state


def uninstall(home: Home, stack: str) -> List[str]:
    """Remove every runtime of ``stack`` (ggml directories; torch receipts only, never the user's env)."""
    removed: List[str] = []
    state, _ = active_or_rebuild(home)  # a damaged pointer is rebuilt, so the other stack's stays active
    state.active.pop(stack, None)
    state.previous.pop(stack, None)
    home.write_active(state)  # first unpoint, then delete: a crash leaves only garbage
    receipts, _ = readable_receipts(home)
    for rid, r in receipts.items():
        if r.stack == stack:
            remove_runtime(home, r)
            removed.append(rid)
    for leftover in home.owned_children(home.runtimes(stack)):
        home.remove_owned(leftover)
    cuda_libs.remove_unreferenced(home)  # shared CUDA libraries no remaining receipt names
    return sorted(removed)


def remove_runtime(home: Home, receipt: Receipt) -> None:
    """Delete an inactive runtime: receipt first, so a crash leaves only a stray directory for gc.
    Only a runtime directory goes (one the home made and marked: ggml's); a receipt that names an
    interpreter (torch) leaves it, since that environment is the user's."""
    home.receipt_path(receipt.id).unlink(missing_ok=True)
    where = home.runtime_path(receipt)
    if where.is_dir():
        home.remove_owned(where)


@dataclass
class KeptRuntime:
    """A runtime gc left in place, and why: what names it (or might)."""

    name: str  # the runtime id, or the directory's name
    reason: str


@dataclass
class GcReport:
    runtimes_removed: List[str] = field(default_factory=list)
    runtimes_kept: List[KeptRuntime] = field(default_factory=list)
    removals_finished: List[str] = field(default_factory=list)  # runtimes a killed removal left half-deleted
    blobs_removed: List[str] = field(default_factory=list)
    blobs_kept_shared: List[str] = field(default_factory=list)  # still named by another home using this cache
    other_homes: List[str] = field(default_factory=list)
    service_jobs_removed: List[str] = field(default_factory=list)  # job folders of services that have stopped
    bytes_freed: int = 0


def _keep_reasons(home: Home, states: List[Active], unreadable: Dict[str, str]) -> Dict[str, str]:
    """Every runtime id something could still name, with why: ``active.json`` (active, previous),
    its last good copy, and each receipt that cannot be read (it may be the active one's)."""
    why: Dict[str, str] = {}
    named = [("active.json", st) for st in states] + [("the last good copy of active.json", last_good_active(home))]
    for source, st in reversed(named):  # active.json's own words win
        if st is None:
            continue
        for stack, rid in st.previous.items():
            why[rid] = f"{source} names it as the previous {stack} runtime (kept for rollback)"
        for stack, rid in st.active.items():
            why[rid] = f"{source} names it as the active {stack} runtime"
    for rid, problem in unreadable.items():
        why.setdefault(rid, f"its receipt cannot be read ({problem}); repair or reinstall it, then run gc again")
    return why


def _named_by(name: str, ids: Dict[str, str]) -> str:
    """Why the directory ``name`` is kept: ``<id>`` or ``<id>.<n>`` (a forced reinstall's copy) of a
    kept id that has no readable receipt to say which directory is its own."""
    for rid, reason in ids.items():
        if name == rid or name.startswith(rid + "."):
            return reason
    return ""


def gc(home: Home, cache: Cache, named_before: Optional[Active] = None) -> GcReport:
    """Remove inactive runtimes and cached blobs no home needs. Conservative: a runtime that
    ``active.json``, its last good copy or an unreadable receipt could name is kept, and said
    so (``runtimes_kept``); while any receipt is unreadable no directory without a receipt goes.
    ``named_before``: the pointer as it was before ``recover`` un-named a runtime it found incomplete."""
    out = GcReport()
    state = home.read_active()
    receipts, _ = readable_receipts(home)
    unreadable: Dict[str, str] = {}
    for rid in home.receipt_ids():
        if rid not in receipts:
            try:
                home.read_receipt(rid)
            except StateError as exc:
                unreadable[rid] = exc.message
    keep = _keep_reasons(home, [state] + ([named_before] if named_before is not None else []), unreadable)
    referenced: Set[str] = set()
    kept_dirs: Set[Path] = set()
    for rid, r in sorted(receipts.items()):
        if rid in keep:
            referenced |= {a.sha256 for a in r.artifacts}
            kept_dirs.add(home.runtime_path(r).resolve())
            out.runtimes_kept.append(KeptRuntime(rid, keep[rid]))
            continue
        out.bytes_freed += sum(f.size for f in r.files)
        remove_runtime(home, r)
        out.runtimes_removed.append(rid)
    for stack in STACKS:
        for d in home.owned_children(home.runtimes(stack)):
            if d.resolve() in kept_dirs:
                continue
            reason = _named_by(d.name, {rid: why for rid, why in keep.items() if rid not in receipts}) or (
                f"{plural(len(unreadable), 'receipt')} cannot be read and might name it" if unreadable else "")
            if reason:
                out.runtimes_kept.append(KeptRuntime(d.name, reason))
            elif home.remove_owned(d):
                out.runtimes_removed.append(d.name)
    cuda_libs.remove_unreferenced(home)  # shared CUDA libraries no remaining receipt names
    register_home(cache, home, referenced)
    others, homes = blobs_of_other_homes(cache, home)
    out.other_homes = homes
    if cache.blob_dir.is_dir() and not cache.blob_dir.is_symlink():
        for blob in sorted(cache.blob_dir.iterdir()):
            name = blob.name
            if len(name) != 64 or name in referenced or blob.is_symlink() or not cache.placed(name):
                continue  # a file only named like a blob is not ours to delete (issue 47)
            if name in others:
                out.blobs_kept_shared.append(name)
                continue
            with cache.lock(name):  # a concurrent fetch of this blob finishes (or waits) first
                try:
                    size = blob.stat().st_size
                except FileNotFoundError:
                    continue
                cache.remove(name)  # the blob and its .verified record
            out.bytes_freed += size
            out.blobs_removed.append(name)
    return out


# -- which homes use a cache -----------------------------------------------------------------
def _registry(cache: Cache) -> Path:
    return cache.root / "homes"


def register_home(cache: Cache, home: Home, blobs: Set[str]) -> None:
    """Record in the cache which blobs this home's runtimes were installed from, so gc run from
    another home sharing the cache keeps them."""
    reg = _registry(cache)
    try:
        reg.mkdir(parents=True, exist_ok=True)
        key = hashlib.sha256(str(home.root.resolve()).encode()).hexdigest()[:16]
        fsio.write_text(reg / f"{key}.json", json.dumps({"home": str(home.root.resolve()), "blobs": sorted(blobs), "updated": now_iso()}))
    except OSError as exc:
        log.warning("could not record this home in the cache registry %s: %s", reg, exc)


def blobs_of_other_homes(cache: Cache, home: Home) -> tuple[Set[str], List[str]]:
    mine = str(home.root.resolve())
    blobs: Set[str] = set()
    homes: List[str] = []
    reg = _registry(cache)
    if not reg.is_dir():
        return blobs, homes
    for entry in sorted(reg.glob("*.json")):
        try:
            data: Dict = json.loads(read_state(entry, 1 << 20))  # another home's entry: a FIFO is skipped
            other = str(data["home"])
            names = {str(b) for b in data["blobs"]}
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if other == mine or not Path(other).is_dir():
            continue  # this home, or one that no longer exists
        homes.append(other)
        blobs |= names
    return blobs, homes


def referenced_blobs(home: Home) -> Set[str]:
    receipts, _ = readable_receipts(home)
    return {a.sha256 for r in receipts.values() for a in r.artifacts}
