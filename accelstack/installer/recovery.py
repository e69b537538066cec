"""Undo what a killed run left behind, and rebuild a damaged ``active.json``.

A damaged pointer is rebuilt from its last good copy (``Home.write_active`` writes one beside it
on every change), so repair keeps the runtime the user chose (a rollback included); only when
no readable copy names a complete runtime does the newest complete one from the receipts win.
Either way the caller is told which and why.

``recover`` runs under the lock before every change (never on a dry run). It finishes removals a
kill interrupted (a runtime is renamed to a trash name before its files go), and deletes only
staging directories accelstack marked as its own (a foreign ``staging/`` folder, or one that is
a symlink, is left alone), and points ``active`` back at an intact runtime if it names a
missing one.
"""
from __future__ import annotations

import logging
from typing import Dict, List, Optional, Tuple

from .. import fsio
from ..domain import STACKS
from ..limits import parse_json
from ..serde import from_dict
from .errors import StateError
from .home import MAX_STATE_BYTES, Home, read_state
from .records import Active, Receipt
from .torch_journal import recover_torch

__all__ = ["recover", "finish_removals", "readable_receipts", "last_good_active", "rebuild_active", "active_or_rebuild"]

log = logging.getLogger(__name__)


def recover(home: Home) -> List[str]:
    """Returns what it did, in words, for the caller to report."""
    done: List[str] = []
    for leftover in home.owned_children(home.staging):
        if home.remove_owned(leftover):
            done.append(f"removed unfinished install {leftover.name}")
    done += [f"finished removing {name}" for name in finish_removals(home)]
    done += recover_torch(home)  # a torch install a kill interrupted: undone, or finished once checked
    try:
        state = home.read_active()
    except StateError:
        return done  # a damaged pointer is repair's job (it rebuilds it); installs rewrite it whole
    changed = False
    for stack, rid in list(state.active.items()):
        try:
            if home.intact_receipt(stack, rid) is not None:
                continue
        except StateError:
            continue  # a damaged receipt: not ours to judge here (repair and status say so)
        prev = state.previous.get(stack)
        if prev and home.runtime_intact(stack, prev):
            state.active[stack] = prev
            state.previous.pop(stack, None)
            done.append(f"{stack}: active runtime {rid} was incomplete; went back to {prev}")
        else:
            state.active.pop(stack)
            done.append(f"{stack}: active runtime {rid} was incomplete and there was nothing to go back to")
        changed = True
    if changed:
        home.write_active(state)
    for line in done:
        log.info("recover: %s", line)
    return done


def finish_removals(home: Home) -> List[str]:
    """Remove what a killed removal left under a trash name (:func:`accelstack.fsio.discard_tree`)
    in the folders accelstack removes from; a folder that is a link is never entered."""
    done: List[str] = []
    for folder in [home.staging, home.root / "shared" / "cuda"] + [home.runtimes(stack) for stack in STACKS]:
        if not folder.is_symlink() and not any(p.is_symlink() for p in folder.parents if home.root in p.parents):
            done += fsio.finish_discards(folder)
    return done


def readable_receipts(home: Home) -> Tuple[Dict[str, Receipt], List[str]]:
    """Every receipt that reads, and the problems of those that do not."""
    out: Dict[str, Receipt] = {}
    problems: List[str] = []
    for rid in home.receipt_ids():
        try:
            out[rid] = home.read_receipt(rid)
        except StateError as exc:
            problems.append(exc.message)
    return out, problems


def last_good_active(home: Home) -> Optional[Active]:
    """The copy of ``active.json`` written at the last change, if it reads."""
    try:
        data = read_state(home.last_good_active_path)  # a FIFO there is refused, never waited on
        return from_dict(Active, parse_json(data, what="the last good copy of active.json", max_bytes=MAX_STATE_BYTES),
                         "active.last-good.json")
    except Exception:  # absent (a home from before the copy was kept), or damaged as well
        return None


def rebuild_active(home: Home) -> Tuple[Active, Dict[str, str]]:
    """A new ``active.json``: per stack, what its last good copy named (if that runtime is still
    complete), else the most recently installed complete runtime, the one before it previous.
    Returns it with, per stack that has an active runtime, why that one, in words."""
    receipts, _ = readable_receipts(home)
    good = last_good_active(home)
    state = Active()
    why: Dict[str, str] = {}
    for stack in STACKS:
        if good is not None and (not good.active.get(stack) or home.runtime_intact(stack, good.active[stack])):
            if good.active.get(stack):
                state.active[stack] = good.active[stack]
                why[stack] = (f"the last good copy of active.json (written {good.changed_at or 'at the last switch'}) "
                              "names it, so it stays the active runtime")
            prev = good.previous.get(stack)
            if prev and home.runtime_intact(stack, prev):
                state.previous[stack] = prev
            continue
        mine = sorted((r for r in receipts.values() if r.stack == stack and home.runtime_path(r).exists()),
                      key=lambda r: (r.installed_at, r.id), reverse=True)
        if mine:
            state.active[stack] = mine[0].id
            why[stack] = ("no readable copy of active.json names a complete runtime, so the most recently installed "
                          f"complete one (installed {mine[0].installed_at}) is active now")
        if len(mine) > 1:
            state.previous[stack] = mine[1].id
    home.write_active(state)
    log.info("rebuilt active.json (%s): %s", "from its last good copy" if good is not None else "from the receipts", state.active)
    return state, why


def active_or_rebuild(home: Home) -> Tuple[Active, Optional[Dict[str, str]]]:
    """The pointer, rebuilt when it is damaged; the second item is None when it was readable,
    else why each stack's runtime is the active one (see :func:`rebuild_active`)."""
    try:
        return home.read_active(), None
    except StateError:
        return rebuild_active(home)
