"""``status``'s upgrade check, bounded: at most ``Settings.timeouts.status_network`` seconds.

The check reads the channels' manifests, and a server that drips them (a captive portal, a
hostile mirror) would hold ``status`` for as long as their deadlines allow. So the check runs
beside ``status`` with short deadlines of its own; when it has not answered in time, ``status``
shows the last answer it found for the same runtime on the same machine (kept in the home's
``state/upgrade-check.json``), marked as cached with when it was found, or says it could not check
now. A check still running goes on (to its own short deadlines) and keeps its answer for the next
``status``; a second ``status`` in the same process (the service) waits for it instead of starting
another.
"""
from __future__ import annotations

import dataclasses
import json
import threading
import time
from typing import Callable, Dict, Optional, Tuple

from ..errors import AccelstackError, Action
from ..fsio import try_write_bytes
from ..installer.records import now_iso
from ..installer.status import StackStatus, StatusProblem, UpgradeCheck
from ..limits import MAX_CONFIG_BYTES, MalformedInput, parse_json, read_capped
from ..settings import Settings

__all__ = ["check_upgrade", "quick_settings"]

_FORMAT = 1
_FILE = "upgrade-check.json"  # in the home's state directory: the answer is the home's runtime's


class _Check:
    """One upgrade check running in its own thread; its answer or its error once ``done``."""

    def __init__(self, ask: Callable[[], str], keep: Callable[[str, str], None]) -> None:
        self.done = threading.Event()
        self.answer = ""
        self.error: Optional[BaseException] = None
        self.at = ""
        self._ask, self._keep = ask, keep
        threading.Thread(target=self._run, name="accelstack-upgrade-check", daemon=True).start()

    def _run(self) -> None:
        try:
            self.answer = self._ask()
            self.at = now_iso()
            self._keep(self.answer, self.at)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller that waits
            self.error = exc
        finally:
            self.done.set()


_RUNNING: Dict[Tuple[str, str, str], _Check] = {}
_LOCK = threading.Lock()


def quick_settings(s: Settings) -> Settings:
    """``s`` with every network wait at most the status budget, so a check left running ends soon too."""
    t, budget = s.timeouts, s.timeouts.status_network
    return s.replace(timeouts=dataclasses.replace(t, connect=min(t.connect, budget), read=min(t.read, budget),
                                                  document=min(t.document, budget)))


def check_upgrade(st: StackStatus, s: Settings, key: str, ask: Callable[[Settings], str], until: float) -> None:
    """Fill ``st``'s ``upgrade_available`` and ``upgrade_check`` from ``ask`` (the stack's check), waiting
    for it until ``until`` (``time.monotonic()``), else from the last answer kept for ``key``."""
    budget = s.timeouts.status_network
    slot = (str(s.home), st.stack, key)
    with _LOCK:
        check = _RUNNING.get(slot)
        if check is None or check.done.is_set():
            quick = quick_settings(s)
            check = _Check(lambda: ask(quick), lambda answer, at: _keep(s, st.stack, key, answer, at))
            _RUNNING[slot] = check
    if check.done.wait(max(0.0, until - time.monotonic())):
        with _LOCK:
            if _RUNNING.get(slot) is check:
                del _RUNNING[slot]
        if isinstance(check.error, AccelstackError):
            st.problems.append(StatusProblem(f"could not check for upgrades: {check.error.message}", check.error.action.value))
            return
        if check.error is not None:
            raise check.error
        st.upgrade_available = check.answer or st.upgrade_available
        st.upgrade_check = UpgradeCheck(checked_at=check.at, cached=False)
        return
    late = f"the channels did not answer within {budget:g} s"
    kept = _kept(s, st.stack, key)
    if kept is not None:
        st.upgrade_available = kept[0] or st.upgrade_available
        st.upgrade_check = UpgradeCheck(checked_at=kept[1], cached=True, note=f"{late}; this is the answer of the last check")
        return
    st.upgrade_check = UpgradeCheck(note=f"could not check now: {late}")
    st.problems.append(StatusProblem(f"could not check for upgrades now: {late} (status does not wait longer; "
                                     "upgrade does)", Action.CHECK_NETWORK.value))


def _read(s: Settings) -> Dict[str, object]:
    path = s.state_dir / _FILE
    try:
        doc = parse_json(read_capped(path, MAX_CONFIG_BYTES + 1), what=str(path), max_bytes=MAX_CONFIG_BYTES)
    except (OSError, MalformedInput):
        return {}
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT or not isinstance(doc.get("stacks"), dict):
        return {}
    return doc["stacks"]


def _kept(s: Settings, stack: str, key: str) -> Optional[Tuple[str, str]]:
    """The last answer for ``stack`` and when it was found, if it was for the same ``key``."""
    entry = _read(s).get(stack)
    if not isinstance(entry, dict) or entry.get("key") != key:
        return None
    answer, at = entry.get("upgrade_available"), entry.get("checked_at")
    return (answer, at) if isinstance(answer, str) and isinstance(at, str) and at else None


def _keep(s: Settings, stack: str, key: str, answer: str, at: str) -> None:
    stacks = dict(_read(s))
    stacks[stack] = {"key": key, "upgrade_available": answer, "checked_at": at}
    try_write_bytes(s.state_dir / _FILE, json.dumps({"format": _FORMAT, "stacks": stacks}, indent=2).encode())
