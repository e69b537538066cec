"""Undo what a killed run left behind, and rebuild a damaged ``active.json`` from the receipts.

``recover`` runs under the lock before every change (never on a dry run). It deletes only
staging directories accelstack marked as its own (a foreign ``staging/`` folder, or one that is
a symlink, is left alone), and points ``active`` back at an intact runtime if it names a
missing one.
"""
from __future__ import annotations

import logging
from typing import Dict, List, Tuple

from ..domain import STACKS
from .errors import StateError
from .home import Home
from .records import Active, Receipt

__all__ = ["recover", "readable_receipts", "rebuild_active", "active_or_rebuild"]

log = logging.getLogger(__name__)


def recover(home: Home) -> List[str]:
    """Returns what it did, in words, for the caller to report."""
    done: List[str] = []
    for leftover in home.owned_children(home.staging):
        if home.remove_owned(leftover):
            done.append(f"removed unfinished install {leftover.name}")
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


def rebuild_active(home: Home) -> Active:
    """A new ``active.json`` from the receipts: per stack, the most recently installed intact runtime
    is active and the one before it previous."""
    receipts, _ = readable_receipts(home)
    state = Active()
    for stack in STACKS:
        mine = sorted((r for r in receipts.values() if r.stack == stack and home.runtime_path(r).exists()),
                      key=lambda r: (r.installed_at, r.id), reverse=True)
        if mine:
            state.active[stack] = mine[0].id
        if len(mine) > 1:
            state.previous[stack] = mine[1].id
    home.write_active(state)
    log.info("rebuilt active.json from %d receipts: %s", len(receipts), state.active)
    return state


def active_or_rebuild(home: Home) -> Tuple[Active, bool]:
    """The pointer, rebuilt from the receipts when it is damaged; the flag says it was."""
    try:
        return home.read_active(), False
    except StateError:
        return rebuild_active(home), True
