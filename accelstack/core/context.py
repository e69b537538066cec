"""One install job's inputs, handed from the install flow to a stack driver, and the home's lock."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Tuple

from ..events import ProgressCallback, null_progress
from ..hardware.report import HardwareReport
from ..installer.home import Home, InstallLock
from ..installer.transaction import Verifier
from ..settings import Settings
from .options import Fetcher, InstallOptions, Services

__all__ = ["InstallJob", "home_of", "prepare_home"]


def home_of(settings: Settings) -> Home:
    return Home(settings.home)


def prepare_home(settings: Settings, command: str, progress: ProgressCallback = null_progress) -> Tuple[Home, InstallLock]:
    """The home, made if missing, and its lock for ``command`` (not yet taken: ``with lock:``)."""
    home = home_of(settings)
    home.ensure()
    return home, home.lock(command, wait=settings.timeouts.lock_wait, progress=progress)


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
