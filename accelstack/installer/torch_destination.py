"""The torch destination: a Python environment that gets the planned torch, checked there, or undone.

The plan gives exact pip/uv commands (``{python}`` stands for the target interpreter). Before
running them, the distributions the plan will replace are moved aside (a rename into a folder made
in the site-packages each lies in, so it costs nothing for a multi-GB CUDA torch and never crosses a
file system); one that cannot be moved (a site-packages this user cannot write) is a typed error with
everything moved so far put back. If pip fails or the verifier says FAIL, the new ones are uninstalled
and the old ones moved back. The receipt lives in the home;
the environment itself is the user's and is never deleted.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from packaging.requirements import InvalidRequirement, Requirement

from ..errors import Action
from ..events import ProgressCallback
from ..manifests.plan import PYTHON_PLACEHOLDER, Command, Plan
from ..settings import Settings
from .errors import TorchInstallError
from .home import Home
from .pip_commands import with_indexes
from .pip_runner import run_json, run_pip
from .records import InstalledFile, Receipt
from .torch_journal import BACKUP_PREFIX, STACK, Journal, forget_recovery
from .torch_scripts import INSPECT_SCRIPT
from .transaction import StagedRuntime

__all__ = ["STACK", "receipt_id", "package_names", "PipCommands", "TorchEnvironment"]

log = logging.getLogger(__name__)


def receipt_id(plan: Plan, python: str) -> str:
    """One receipt per target environment: the same interpreter path always gets the same id."""
    return f"{STACK}-{plan.variant}-{hashlib.sha256(str(Path(python).absolute()).encode()).hexdigest()[:10]}"


def package_names(plan: Plan) -> List[str]:
    names = []
    for spec in plan.packages:
        try:
            names.append(Requirement(spec).name.lower().replace("_", "-"))
        except InvalidRequirement:
            continue
    return names


class _Backup:
    """Moves installed distributions aside and back: the undo log of a torch install.

    Each file or folder goes into a folder this install makes in its own site-packages (one per
    location: a user site on another disk gets its own), so a move is a rename on one file system:
    nothing is copied, and a torch outside the environment's prefix no longer meets EXDEV."""

    def __init__(self, python: str, names: List[str], timeout: float, journal: Journal) -> None:
        self.python = python
        self.journal = journal  # written before the first move: a kill from here on is undone by the next command
        self.names = names
        self.timeout = timeout
        self.folders: Dict[Path, Path] = {}  # location -> the fresh folder this install made in it
        self.moved: List[Tuple[Path, Path]] = []
        self.previous: Dict[str, str] = {}

    def _folder(self, location: Path) -> Path:
        if location not in self.folders:  # fresh, so discarding it can never remove anything else
            self.folders[location] = Path(tempfile.mkdtemp(prefix=BACKUP_PREFIX, dir=location))
            self.journal.add_folder(self.folders[location])  # before anything is moved into it
        return self.folders[location]

    def stash(self) -> None:
        info = run_json(self.python, INSPECT_SCRIPT, self.names, self.timeout)
        dists = info.get("dists", [])
        for dist in dists if isinstance(dists, list) else []:
            self.previous[dist["name"]] = dist["version"]
            location = Path(dist["location"])
            tops = sorted({Path(f).parts[0] for f in dist["files"] if not f.startswith("..") and Path(f).parts})
            for top in tops:
                src = location / top
                if os.path.lexists(src) and not any(src == m[0] for m in self.moved):
                    try:
                        dest = self._folder(location) / f"{len(self.moved)}-{top}"
                        os.replace(src, dest)
                    except OSError as exc:
                        raise TorchInstallError(
                            f"cannot move {src} aside before installing: {exc.strerror or exc}; nothing was changed",
                            hint="the environment's site-packages must be writable by this user; install into an "
                                 "environment you own (a venv), or run as its owner") from None
                    self.moved.append((src, dest))

    def restore(self) -> None:
        for src, dest in reversed(self.moved):
            if os.path.lexists(src):
                shutil.rmtree(src) if src.is_dir() and not src.is_symlink() else src.unlink()
            os.replace(dest, src)
        self.moved.clear()

    def discard(self) -> None:
        for folder in self.folders.values():
            shutil.rmtree(folder, ignore_errors=True)
        self.folders.clear()
        self.moved.clear()
        self.journal.remove()  # last: until the folders are gone, a kill is still recovered


@dataclass
class _Undo:
    plan: Plan
    backup: _Backup
    names: List[str]


@dataclass
class PipCommands:
    """A source: the plan's commands, run with pip (or uv when asked and on PATH)."""

    commands: List[Command]
    use_uv: bool = False
    proxied: bool = False  # pip goes through a proxy (Settings.proxied): its failures are not checked directly

    @classmethod
    def for_plan(cls, plan: Plan, settings: Settings) -> PipCommands:
        """The plan's commands with the settings' package indexes (a mirror), uv choice and proxy applied."""
        return cls(with_indexes(plan.commands, settings.index_url, settings.extra_index_urls), settings.use_uv,
                   settings.proxied)


class TorchEnvironment:
    """Destination for torch runtimes: the interpreter ``python`` (a venv's or any other)."""

    stack = STACK

    def __init__(self, home: Home, python: str, pip_timeout: float, probe_timeout: float) -> None:
        self.home = home
        self.python = python
        self.pip_timeout = pip_timeout
        self.probe_timeout = probe_timeout

    def stage(self, plan: Plan, source: PipCommands, progress: ProgressCallback) -> StagedRuntime:
        if plan.stack != self.stack or not plan.ok or not source.commands:
            raise TorchInstallError(f"the plan has nothing to install ({plan.summary})", action=Action.EXPLAIN_PLAN)
        names = package_names(plan)
        journal = Journal(self.home, self.python, names)
        journal.write()
        backup = _Backup(self.python, names, self.probe_timeout, journal)
        try:
            backup.stash()
        except BaseException:
            backup.restore()
            backup.discard()
            raise
        staged = StagedRuntime(stack=self.stack, backend=plan.backend, path=Path(self.python), env=dict(plan.env),
                               python=self.python, handle=_Undo(plan, backup, names))
        try:
            for cmd in source.commands:
                self._run(cmd, source, progress)
        except BaseException:
            self.abort(staged)
            raise
        return staged

    def _run(self, cmd: Command, source: PipCommands, progress: ProgressCallback) -> None:
        argv = [a.replace(PYTHON_PLACEHOLDER, self.python) for a in cmd.argv]
        if source.use_uv and cmd.tool == "pip" and shutil.which("uv"):
            argv = ["uv", "pip"] + argv[argv.index("pip") + 1:] + ["--python", self.python]
        run_pip(argv, self.pip_timeout, progress, "the previous torch (if any) has been restored", proxied=source.proxied)

    def files(self, staged: StagedRuntime) -> List[InstalledFile]:
        return []  # the environment is the user's; its files are pip's to track

    def commit(self, staged: StagedRuntime, receipt: Receipt) -> Optional[Path]:
        undo: _Undo = staged.handle
        receipt.path = self.python
        receipt.verification.details.setdefault("previous", dict(undo.backup.previous))
        undo.backup.journal.commit(dict(undo.backup.previous))  # checked: a kill from here on keeps the new torch
        self.home.write_receipt(receipt)
        undo.backup.discard()
        forget_recovery(self.home)
        return None

    def abort(self, staged: StagedRuntime) -> None:
        undo: _Undo = staged.handle
        try:
            subprocess.run([self.python, "-m", "pip", "uninstall", "-y", "-q", *undo.names], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=self.pip_timeout)
        except (subprocess.TimeoutExpired, OSError):
            log.warning("pip uninstall in %s did not finish; restoring the previous files anyway", self.python)
        undo.backup.restore()
        undo.backup.discard()

    def retire(self, old: Path) -> None:  # never: the environment is the user's
        return None
