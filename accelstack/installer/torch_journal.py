"""The torch install's journal, so that a SIGKILL at any point never loses the user's torch (issue 47).

A torch install moves the distributions it replaces into ``.accelstack-backup-<random>/`` folders in
their own site-packages (:mod:`.torch_destination`), runs pip, checks, then commits. The journal,
``<home>/state/torch-journal/<key>.json``, says which folders hold what was moved and in which
phase the install is; it is written (durably) before the first move, again whenever a folder is
added, and marked ``committed`` before the receipt is written. Each folder describes itself: its
entry ``<n>-<name>`` came from ``<the folder's parent>/<name>``.

:func:`recover_torch` runs first in every command that changes the home (``recovery.recover``):

- ``installing`` (killed while moving, while pip ran, or before the check passed): the new packages
  are uninstalled with pip (best effort, as an abort does), every moved entry is put back over
  whatever pip left at its place, the folders go: the previous torch is back;
- ``committed`` (killed after the check passed): the folders go; the new torch stays.

What it did is kept in ``<home>/state/torch-recovered.json`` for ``status`` to say until the next
torch install completes; a journal not yet recovered is a problem ``status`` names.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from .. import fsio
from ..limits import parse_json
from .home import Home, read_state

__all__ = ["STACK", "BACKUP_PREFIX", "Journal", "recover_torch", "pending", "last_recovery", "forget_recovery"]

STACK = "torch"  # the stack whose installs this journal keeps

log = logging.getLogger(__name__)

BACKUP_PREFIX = ".accelstack-backup-"


def _folder(home: Home) -> Path:
    return home.root / "state" / "torch-journal"


def _recovered_path(home: Home) -> Path:
    return home.root / "state" / "torch-recovered.json"


class Journal:
    """The journal of one torch install into ``python``."""

    def __init__(self, home: Home, python: str, names: List[str]) -> None:
        key = hashlib.sha256(str(Path(python).absolute()).encode()).hexdigest()[:16]
        self.path = _folder(home) / f"{key}.json"
        self.doc: Dict[str, Any] = {"python": python, "names": names, "folders": [], "phase": "installing",
                                    "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "previous": {}}

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fsio.write_text(self.path, json.dumps(self.doc, indent=1))

    def add_folder(self, folder: Path) -> None:
        self.doc["folders"].append(str(folder))
        self.write()

    def commit(self, previous: Dict[str, str]) -> None:
        self.doc.update(phase="committed", previous=previous)
        self.write()

    def remove(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


def _read(path: Path) -> Optional[Dict[str, Any]]:
    try:
        doc = parse_json(read_state(path), what=str(path), max_depth=8)
    except (OSError, ValueError) as exc:  # a damaged journal: left for a person (MalformedInput is a ValueError)
        log.warning("cannot read the torch journal %s: %s", path, exc)
        return None
    ok = isinstance(doc, dict) and isinstance(doc.get("python"), str) and isinstance(doc.get("folders"), list) \
        and all(isinstance(f, str) for f in doc["folders"]) and doc.get("phase") in ("installing", "committed")
    return doc if ok else None


def pending(home: Home) -> List[Dict[str, Any]]:
    """The journals of torch installs a kill interrupted and no command has recovered yet."""
    folder = _folder(home)
    if not folder.is_dir() or folder.is_symlink():
        return []
    out = []
    for path in sorted(folder.glob("*.json")):
        doc = _read(path)
        if doc is not None:
            out.append(doc)
    return out


def last_recovery(home: Home) -> Optional[Dict[str, Any]]:
    try:
        doc = parse_json(read_state(_recovered_path(home)), what="torch-recovered.json", max_depth=8)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def forget_recovery(home: Home) -> None:
    """A torch install that completed: what an earlier recovery did is no longer news for ``status``."""
    try:
        _recovered_path(home).unlink()
    except FileNotFoundError:
        pass


def _backup_folder(text: str) -> Optional[Path]:
    """A folder the journal names, when it is still one this install made (its name, a real folder)."""
    path = Path(text)
    if not path.name.startswith(BACKUP_PREFIX) or path.is_symlink() or not path.is_dir():
        return None
    return path


def _put_back(folder: Path) -> List[str]:
    """Every entry ``<n>-<name>`` of ``folder`` back to ``folder.parent/<name>``, last moved first."""
    entries = []
    for entry in os.listdir(folder):
        number, _, name = entry.partition("-")
        if number.isdigit() and name and "/" not in name:
            entries.append((int(number), entry, name))
    restored = []
    for _n, entry, name in sorted(entries, reverse=True):
        src = folder.parent / name
        if os.path.lexists(src):  # what pip wrote there (the new version, or half of it)
            shutil.rmtree(src) if src.is_dir() and not src.is_symlink() else src.unlink()
        os.replace(folder / entry, src)
        restored.append(name)
    return restored


def recover_torch(home: Home, pip_timeout: float = 600.0) -> List[str]:
    """Finish or undo each torch install a kill interrupted; returns what it did, in words."""
    done: List[str] = []
    folder = _folder(home)
    if not folder.is_dir() or folder.is_symlink():
        return done
    for path in sorted(folder.glob("*.json")):
        doc = _read(path)
        if doc is None:
            continue
        folders = [f for f in (_backup_folder(t) for t in doc["folders"]) if f is not None]
        if doc["phase"] == "installing":
            names = [n for n in doc.get("names", []) if isinstance(n, str)]
            try:  # the new packages pip may have left (whole or half); what it cannot remove is replaced below
                subprocess.run([doc["python"], "-m", "pip", "uninstall", "-y", "-q", *names], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=pip_timeout)
            except (subprocess.TimeoutExpired, OSError):
                log.warning("pip uninstall in %s did not finish; restoring the previous files anyway", doc["python"])
            restored = [name for f in folders for name in _put_back(f)]
            what = (f"an interrupted torch install into {doc['python']} (started {doc.get('started', '?')}) was undone: "
                    + (f"{', '.join(restored)} put back" if restored else "nothing had been moved yet"))
        else:
            what = (f"an interrupted torch install into {doc['python']} (started {doc.get('started', '?')}) had passed "
                    "its check: finished (the previous version's set-aside files removed)")
        for f in folders:
            shutil.rmtree(f, ignore_errors=True)
        fsio.write_text(_recovered_path(home), json.dumps({"what": what, "when": time.strftime(
            "%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python": doc["python"]}, indent=1))
        path.unlink()
        log.info("%s", what)
        done.append(what)
    return done
