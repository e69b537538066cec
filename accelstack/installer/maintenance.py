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
from ..events import ProgressCallback, null_progress
from ..serde import plural
from . import cuda_libs
from .errors import StateError
from .home import Home, read_state
from .records import Active, Receipt, now_iso
from .recovery import active_or_rebuild, last_good_active, readable_receipts
from .repair import check_files, check_shared
from .torch_destination import STACK as TORCH_STACK
from .torch_journal import last_recovery, pending

__all__ = ["StatusProblem", "UpgradeCheck", "StackStatus", "local_status", "rollback", "uninstall", "remove_runtime", "KeptRuntime", "GcReport", "gc",
           "register_home", "blobs_of_other_homes", "referenced_blobs"]

log = logging.getLogger(__name__)


@dataclass
class StatusProblem:
    message: str
    action: str = ""  # an accelstack.errors.Action value


@dataclass
class UpgradeCheck:
    """Where ``upgrade_available`` comes from: a check made now, or (``cached``) the last one, shown
    when the channels did not answer within status's few seconds; ``note`` says why in words."""

    checked_at: str = ""  # when the answer was found (ISO 8601, UTC); "" when there is none
    cached: bool = False
    note: str = ""


@dataclass
class StackStatus:
    stack: str
    active: str = ""
    previous: str = ""
    receipt: Optional[Receipt] = None
    runtime_path: str = ""  # absolute, where the active runtime is now
    installed: List[str] = field(default_factory=list)
    hardware_matches: Optional[bool] = None
    missing_files: int = 0
    checked: str = ""  # how the files were checked: "hashes" (--deep), "metadata" (size, mtime, inode), "presence"
    files: int = 0  # how many files the receipt lists
    changed_files: int = 0  # size, mtime or inode differ from the receipt: not re-hashed, repair checks them
    corrupt_files: int = 0  # re-hashed (--deep) and different from the receipt
    upgrade_available: str = ""  # runtime id the current plan would install, when different
    upgrade_check: Optional[UpgradeCheck] = None  # how fresh that answer is (None: no check was asked for)
    problems: List[StatusProblem] = field(default_factory=list)

    __derived__ = ("healthy",)

    @property
    def healthy(self) -> bool:
        """No damage found by the check that ran (``checked`` says which: only ``hashes`` proves the content)."""
        return (bool(self.active) and self.receipt is not None and not self.missing_files and not self.changed_files
                and not self.corrupt_files and self.hardware_matches is not False)


def _torch_journal_problems(home: Home) -> List[StatusProblem]:
    """An interrupted torch install not yet recovered, or what the last recovery did."""
    out = [StatusProblem(f"an install of torch into {j['python']} (started {j.get('started', '?')}) was interrupted; the "
                         "previous torch is set aside in " + ", ".join(j["folders"]) + " until the next install, repair "
                         "or gc puts it back", Action.REPAIR.value) for j in pending(home)]
    last = last_recovery(home)
    if last is not None and isinstance(last.get("what"), str):
        out.append(StatusProblem(f"{last['what']} ({last.get('when', '?')})", ""))
    return out


def local_status(home: Home, fingerprint: Optional[str], *, deep: bool = False,
                 progress: ProgressCallback = null_progress) -> List[StackStatus]:
    """What is installed and active, whether its files are there and unchanged (``deep``: re-hashed),
    whether it still fits."""
    out: List[StackStatus] = []
    try:
        state = home.read_active()
        damaged = ""
    except StateError as exc:
        state, damaged = Active(), exc.message
    receipts, unreadable = readable_receipts(home)
    for stack in STACKS:
        st = StackStatus(stack=stack, active=state.active.get(stack, ""), previous=state.previous.get(stack, ""))
        if damaged:
            st.problems.append(StatusProblem(damaged + "; repair rebuilds it from its last good copy (else the receipts)", Action.REPAIR.value))
        st.problems += [StatusProblem(m, Action.REINSTALL.value) for m in unreadable]
        st.installed = sorted(rid for rid, r in receipts.items() if r.stack == stack)
        if stack == TORCH_STACK:  # its journal: an interrupted install, or what recovering it did
            st.problems += _torch_journal_problems(home)
        st.receipt = receipts.get(st.active) if st.active else None
        if st.active and st.receipt is None:
            st.problems.append(StatusProblem(f"the active runtime {st.active} has no readable receipt", Action.REPAIR.value))
        if st.receipt is not None:
            where = home.runtime_path(st.receipt)
            st.runtime_path = str(where)
            if not where.exists():
                st.missing_files, st.files, st.checked = max(1, len(st.receipt.files)), len(st.receipt.files), "presence"
                st.problems.append(StatusProblem(f"the active runtime's files are gone ({where})", Action.REINSTALL.value))
            else:
                _check_files(home, st, deep, progress)
            if fingerprint is not None:
                st.hardware_matches = st.receipt.hardware_fingerprint == fingerprint
                if not st.hardware_matches:
                    st.problems.append(StatusProblem("the hardware or driver changed since this runtime was installed; "
                                                     "upgrading re-plans for it", Action.UPGRADE.value))
        out.append(st)
    return out


def _check_files(home: Home, st: StackStatus, deep: bool, progress: ProgressCallback) -> None:
    assert st.receipt is not None
    found = check_files(home, st.receipt, deep=deep, progress=progress)
    st.checked, st.files = found.checked, found.files
    st.missing_files, st.changed_files, st.corrupt_files = len(found.missing), len(found.changed), len(found.corrupt)
    if found.missing:
        st.problems.append(StatusProblem(f"{_n(found.missing)} missing (first: {found.missing[0]}); "
                                         "repair restores them", Action.REPAIR.value))
    if found.changed:
        st.problems.append(StatusProblem(f"{_n(found.changed, False)} changed since install (size, time "
                                         f"or inode differ from the receipt; first: {found.changed[0]}); "
                                         "repair re-hashes them and restores what differs", Action.REPAIR.value))
    if found.corrupt:
        st.problems.append(StatusProblem(f"{_n(found.corrupt, False)} {'differs' if len(found.corrupt) == 1 else 'differ'} from the receipt when "
                                         f"re-hashed (first: {found.corrupt[0]}); repair restores them",
                                         Action.REPAIR.value))
    _check_shared_files(home, st, deep, progress)


def _check_shared_files(home: Home, st: StackStatus, deep: bool, progress: ProgressCallback) -> None:
    """The shared CUDA libraries the receipt names count as the runtime's files: their damage is its damage."""
    assert st.receipt is not None
    found = check_shared(home, st.receipt, deep=deep, progress=progress)
    if not found.files:
        return
    st.files += found.files
    st.missing_files += len(found.missing)
    st.changed_files += len(found.changed)
    st.corrupt_files += len(found.corrupt)
    if found.checked == "presence" and st.checked == "metadata":
        st.checked = "presence"
    damaged = found.damaged
    if damaged:
        what = "missing" if found.missing else "changed since install (size, time or inode)" if found.changed \
            else "different from what was unpacked when re-hashed"
        verb = "is" if len(damaged) == 1 else "are"
        st.problems.append(StatusProblem(f"{plural(len(damaged), 'shared CUDA library file')} {verb} {what} (first: {damaged[0]}); "
                                         "repair unpacks them again from the library wheel", Action.REPAIR.value))


def _n(paths: List[str], verb: bool = True) -> str:
    """"1 of the active runtime's files is" / "3 of ... files are" (``verb``: with the verb)."""
    return f"{len(paths)} of the active runtime's files" + ((" is" if len(paths) == 1 else " are") if verb else "")


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
