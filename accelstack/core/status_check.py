"""``status``: what is installed and active, and whether it still fits this machine.

Its own module, apart from the maintenance that changes runtimes, so that reading the state loads
no install, download or engine code (`accelstack status` on a home with nothing to check upgrades
for imports no HTTP or TLS stack; tests/test_import_cost.py pins what it may import). The upgrade
check loads the stack's driver, and with it the manifests' fetcher, only for a runtime it asks about.
"""
from __future__ import annotations

import time
from typing import Callable, List, Optional

from ..events import ProgressCallback, null_progress
from ..hardware.report import HardwareReport
from ..installer.home import Home
from ..installer.status import StackStatus, local_status
from ..settings import Settings
from .detection import detect
from .fingerprint import hardware_fingerprint
from .stacks import driver
from .upgrade_check import check_upgrade

__all__ = ["status"]


def status(*, report: Optional[HardwareReport] = None, settings: Optional[Settings] = None,
           check_upgrades: bool = True, deep: bool = False,
           on_progress: Optional[ProgressCallback] = None) -> List[StackStatus]:
    """What is installed and active, whether its files are there and unchanged since install (size,
    mtime and inode against the receipt; ``deep``: every file re-hashed, with progress), whether it
    still fits this machine, and (from the manifests) whether a newer build would be chosen now.
    Each stack's ``checked`` says which file check ran. The upgrade check waits on the network at
    most ``settings.timeouts.status_network`` seconds in all, then shows the last answer, marked
    as cached (``upgrade_check``; :mod:`.upgrade_check`). Reads only, but for that kept answer."""
    s = settings or Settings.resolve()
    home = Home(s.home)
    report = report if report is not None else detect(settings=s)
    fingerprint = hardware_fingerprint(report)
    out = local_status(home, fingerprint, deep=deep, progress=on_progress or null_progress)
    until = time.monotonic() + s.timeouts.status_network
    for st in out:
        if st.receipt is None or not check_upgrades:
            continue
        key = f"{st.active}/{fingerprint}/{'offline' if s.offline else 'online'}"
        check_upgrade(st, s, key, _asker(st, report), until)
    return out


def _asker(st: StackStatus, report: HardwareReport) -> Callable[[Settings], str]:
    """The stack's own upgrade question for ``st``, asked with the settings it is given."""
    d = driver(st.stack)
    return lambda quick: d.upgrade_available(st, report, quick)
