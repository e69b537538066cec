"""One install job's inputs, handed from the install flow to a stack driver, and the home's lock."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Tuple

from ..events import ProgressCallback, null_progress
from ..hardware.report import HardwareReport
from ..installer.home import Home, InstallLock
from ..installer.transaction import Verifier
from ..settings import Settings
from .held_workers import release_held
from .options import Fetcher, InstallOptions, Services

__all__ = ["InstallJob", "ChangeLock", "home_of", "prepare_home"]


def home_of(settings: Settings) -> Home:
    return Home(settings.home)


def prepare_home(settings: Settings, command: str, progress: ProgressCallback = null_progress, *,
                 stack: Optional[str] = None, release: bool = True) -> Tuple[Home, InstallLock]:
    """The home, made if missing, and its lock for ``command`` (not yet taken: ``with lock:``). Taking it
    also has a running service of this home release a loaded worker of ``stack`` (None: any) first, unless
    ``release`` is false (issue 46: a change to a runtime never runs beside a loaded worker of it)."""
    home = home_of(settings)
    home.ensure()
    if not release:
        return home, home.lock(command, wait=settings.timeouts.lock_wait, progress=progress)
    return home, ChangeLock(home.root / "install.lock", command, settings.timeouts.lock_wait, progress,
                            state_dir=settings.state_dir, stack=stack)


class ChangeLock(InstallLock):
    """The home's lock for a command that changes a runtime: once held, a service's loaded worker of
    that runtime is released (:func:`~.held_workers.release_held`), else the lock is let go and the
    typed error raised; nothing was changed."""

    def __init__(self, *args: Any, state_dir: Path, stack: Optional[str], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.state_dir, self.stack = state_dir, stack

    def __enter__(self) -> ChangeLock:
        super().__enter__()
        try:
            release_held(self.state_dir, self.stack, self.command)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self


@dataclass
class InstallJob:
    """Everything a stack driver needs to install one plan."""

    report: HardwareReport
    settings: Settings
    options: InstallOptions = field(default_factory=InstallOptions)
    services: Services = field(default_factory=Services)
    progress: ProgressCallback = null_progress

    @property
    def fetcher(self) -> Fetcher:
        return self.services.fetcher_for(self.settings)

    def verifier(self, default: Verifier) -> Verifier:
        return self.options.verifier or default
