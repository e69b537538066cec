"""``status``'s reading of the home: what is installed and active, whether its files are there and
unchanged, whether it still fits this machine.

Apart from :mod:`.maintenance` (rollback, uninstall, gc) so that reading the state loads no
install code: `accelstack status` imports this, not the wheel installer or pip's runner.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from ..domain import STACKS
from ..errors import Action
from ..events import ProgressCallback, null_progress
from ..serde import plural
from .errors import StateError
from .file_checks import check_files, check_shared
from .home import Home
from .records import Active, Receipt
from .recovery import readable_receipts
from .torch_journal import STACK as TORCH_STACK
from .torch_journal import last_recovery, pending

__all__ = ["StatusProblem", "UpgradeCheck", "StackStatus", "local_status"]


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
