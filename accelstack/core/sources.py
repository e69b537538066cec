"""Where the core's inputs come from: the fetcher protocols, the network's documents, and the
trusted set a plan and an install are made from.

Value types and protocols only, low in the core: the options an app passes (:mod:`.options`), the
fetcher check (:mod:`.fetched`) and planning (:mod:`.planning`) all build on them, none of them
on each other.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Protocol, Sequence

from .. import artifacts  # the documents on first use: a plan from a saved report loads no HTTP stack
from ..events import ProgressCallback, null_progress
from ..manifests.resolver import Manifests
from ..refs import ArtifactRef
from ..settings import Channel, Timeouts

__all__ = ["Fetcher", "DocumentFetcher", "NetworkDocuments", "LoadedManifest", "TrustedSet"]


class Fetcher(Protocol):
    """The core's one way to the network: verified files into the download cache, and documents."""

    def files(self, refs: Sequence[ArtifactRef], *, progress: ProgressCallback = null_progress,
              deep: bool = False, offline: Optional[bool] = None) -> Dict[str, Path]:
        """``{sha256: path}`` of each ref, hash and size checked; ``deep`` re-hashes cached files."""

    def document(self, url: str) -> bytes:
        """A small document (a manifest): its bytes, or a ``FetchError``."""

    def optional_document(self, url: str) -> Optional[bytes]:
        """A document that may be absent (a signature): None when the server says so."""


class DocumentFetcher(Protocol):
    """Reads a channel's manifest and its signature (a :class:`Fetcher` is one)."""

    def document(self, url: str) -> bytes: ...

    def optional_document(self, url: str) -> Optional[bytes]: ...


class NetworkDocuments:
    """Documents over the network (accelstack.artifacts, loaded on first use so that planning
    from a saved report never imports the HTTP stack); :class:`~.options.NetworkFetcher` adds files.
    ``timeouts`` (``Settings.timeouts``) set each fetch's deadline."""

    timeouts: Optional[Timeouts] = None

    def __init__(self, timeouts: Optional[Timeouts] = None) -> None:
        self.timeouts = timeouts

    def document(self, url: str) -> bytes:
        return artifacts.fetch_document(url, timeouts=self.timeouts)

    def optional_document(self, url: str) -> Optional[bytes]:
        return artifacts.fetch_optional_document(url, timeouts=self.timeouts)


@dataclass
class LoadedManifest:
    url: str
    source: str
    version: int
    channel: str = ""  # the channel it came from


@dataclass
class TrustedSet:
    """What ``load_manifests`` verified: the knowledge for the resolver, where each part came from,
    and the channels it was read from (remembered after an install, keys included)."""

    manifests: Manifests
    loaded: List[LoadedManifest]
    channels: List[Channel] = field(default_factory=list)
    remember: bool = True  # an install remembers ``channels`` for status and upgrade (a bundle its own channel)
