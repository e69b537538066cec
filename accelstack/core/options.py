"""What the core is given besides the request: how an install runs, and its collaborators.

An app or a test hands the core its own network, builder and machine the way python-tuf's
``Updater(fetcher=...)`` takes a fetcher: ``Services(fetcher=MyFetcher())`` installs from memory,
without a loopback server and without monkeypatching. Each default is the real part.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence

from ..artifacts.batch import fetch
from ..artifacts.cache import Cache
from ..events import ProgressCallback, null_progress
from ..hardware.protocol import System
from ..installer.transaction import Verifier
from ..publisher.build import build_ggml
from ..refs import ArtifactRef
from ..settings import Settings
from .fetched import CheckedFetcher
from .sources import Fetcher, NetworkDocuments, TrustedSet

__all__ = ["Fetcher", "NetworkFetcher", "Builder", "Services", "InstallOptions"]


@dataclass
class NetworkFetcher(NetworkDocuments):
    """The real fetcher: accelstack.artifacts (the OS trust store, https only, size limits,
    resumable, content-addressed cache at ``settings.cache``), offline as the settings say."""

    settings: Settings

    def __post_init__(self) -> None:
        self.timeouts = self.settings.timeouts  # the documents' deadlines, as the files'

    def files(self, refs: Sequence[ArtifactRef], *, progress: ProgressCallback = null_progress,
              deep: bool = False, offline: Optional[bool] = None) -> Dict[str, Path]:
        off = self.settings.offline if offline is None else offline
        return fetch(list(refs), cache=Cache(self.settings.cache), progress=progress, offline=off, deep=deep,
                     timeouts=self.settings.timeouts)


Builder = Callable[..., Any]
"""Builds a ggml variant from source: ``builder(variant, settings, progress=..., cuda_archs=...)``
returns a ``BuildResult`` (``publisher.build.build_ggml`` is the real one)."""


@dataclass
class Services:
    """The core's collaborators; None is the real part for the settings in use."""

    fetcher: Optional[Fetcher] = None
    builder: Optional[Builder] = None
    system: Optional[System] = None  # the machine detection reads (a ReplaySystem replays a capture)

    def fetcher_for(self, settings: Settings) -> Fetcher:
        """The real fetcher, or the app's with every file it returns checked again (:mod:`.fetched`)."""
        return CheckedFetcher(self.fetcher) if self.fetcher is not None else NetworkFetcher(settings)

    def builder_or_default(self) -> Builder:
        return self.builder if self.builder is not None else build_ggml


@dataclass
class InstallOptions:
    """How one install runs; the defaults are what ``accelstack install`` does.

    ``verifier`` defaults to the stack's real check (a probe generation for ggml, torch operations
    in the target for torch). ``trusted``: manifests the caller already verified (an offline
    bundle); otherwise the active channels' (``prefer_remembered``: the last install's, for
    ``upgrade``). ``fallback``: a ggml build that fails verify gives way to the plan's next candidate."""

    force: bool = False
    dry_run: bool = False
    verifier: Optional[Verifier] = None
    trusted: Optional[TrustedSet] = None
    prefer_remembered: bool = False
    fallback: bool = True

    def keywords(self) -> Dict[str, Any]:
        """These options as ``install``'s keywords (the one way it takes them), the values as they are."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
