"""What `accelstack status` prints for people: per stack, the active runtime and a badge that claims
no more than the file check that ran can vouch for."""
from __future__ import annotations

from pathlib import Path
from typing import List

from .common import problem_lines
from .progress_format import local_time

__all__ = ["status_text", "is_damaged"]

DAMAGE_ACTIONS = ("repair", "reinstall")  # a problem only these fix is damage (a changed GPU asks for an upgrade)


def is_damaged(st) -> bool:
    """Whether ``st`` found damage: files missing, changed or corrupt, or state it cannot read
    (active.json, a receipt). ``accelstack status`` then exits 1 with ``ok: false``."""
    return any(p.action in DAMAGE_ACTIONS for p in st.problems)


def _health(st) -> str:
    """The status badge: what the file check that ran can vouch for, and no more."""
    if st.missing_files or st.corrupt_files:
        return "[damaged: run `accelstack repair`]"
    if st.changed_files:  # not re-hashed: a copied home changes every inode, so "damaged" would claim too much
        return "[changed since install: run `accelstack repair`]"
    if not st.healthy:
        return "[needs attention]"
    if not st.files:
        return "[present; no file list to check]"
    return {"hashes": "[healthy, re-hashed]", "metadata": "[healthy, not re-hashed]"}.get(st.checked, "[files present, not re-hashed]")


def _files_line(st) -> str:
    damage = [f"{n} {what}" for n, what in ((st.missing_files, "missing"), (st.changed_files, "changed since install"),
                                            (st.corrupt_files, "different when re-hashed")) if n]
    if damage:
        return f"  files: {', '.join(damage)}, of {st.files}"
    if st.checked in ("hashes", "metadata"):
        return f"  files: all {st.files} re-hashed and matching the receipt" if st.checked == "hashes" else (
            f"  files: all {st.files} match the receipt's size, mtime and inode (not re-hashed; "
            "`accelstack status --deep` re-hashes them)")
    return (f"  files: all {st.files} present, not re-hashed (this receipt recorded no mtimes or inodes to compare; "
            "`accelstack status --deep` re-hashes them)")


def status_text(home: Path, stats: List) -> str:
    """The human form of ``core.status``'s answer for ``home``."""
    lines = [f"runtime home: {home}"]
    for st in stats:
        if not st.installed and not st.active:
            lines.append(f"{st.stack}: nothing installed")
            lines += problem_lines(st.problems)
            continue
        lines.append(f"{st.stack}: active {st.active or '(none)'}" + (f", previous {st.previous}" if st.previous else "")
                     + (f"  {_health(st)}" if st.active else ""))
        if st.receipt:
            r = st.receipt
            if st.files:
                lines.append(_files_line(st))
            lines.append(f"  from: {r.origin}")
            lines.append(f"  backend {r.backend}, installed {local_time(r.installed_at)}, verified {local_time(r.verified_at)} "
                         f"({r.verification.verdict}), at {st.runtime_path}")
            lines.append(f"  fits this machine: {'yes' if st.hardware_matches else 'no' if st.hardware_matches is False else 'unknown'}")
        if st.upgrade_available:
            lines.append(f"  upgrade available: {st.upgrade_available} (run `accelstack upgrade`)")
        check = getattr(st, "upgrade_check", None)
        if check is not None and check.cached:  # the network was slow: say whose answer this is
            lines.append(f"  upgrade check: {check.note} ({local_time(check.checked_at)}: "
                         f"{'an upgrade' if st.upgrade_available else 'no upgrade'}; cached)")
        others = [i for i in st.installed if i not in (st.active, st.previous)]
        if others and not st.active and is_damaged(st):  # which one is active is not known: gc is no answer
            lines.append(f"  installed: {', '.join(others)} (`accelstack repair` restores which one is active)")
        elif others:
            lines.append(f"  also installed: {', '.join(others)} (`accelstack gc` removes them)")
        lines += problem_lines(st.problems)
    return "\n".join(lines)
