"""The ggml destination: a runtime directory under the home, built in staging, renamed into place.

Layout: ``runtimes/ggml/<id>`` (``<id>.<n>`` when a forced reinstall of the same id builds a
fresh copy beside the old one). The receipt is written only after the rename, naming the new
directory, and the superseded copy is removed only after that: at every instant the receipt
names a complete directory.
"""
from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from ..events import ProgressCallback, ProgressEvent
from ..manifests.plan import Plan
from ..refs import ArtifactRef
from . import cuda_libs
from .errors import InstallError
from .home import Home
from .records import InstalledFile, Receipt
from .transaction import StagedRuntime
from .wheel import hash_tree, install_wheel

__all__ = ["STACK", "FetchedWheel", "runtime_id", "wheel_of", "GgmlDirectory"]

log = logging.getLogger(__name__)
STACK = "ggml"


@dataclass
class FetchedWheel:
    """A source: a wheel file already verified into the cache, and the name it is installed under."""

    path: Path
    name: str


def runtime_id(plan: Plan) -> str:
    """Content-derived: the same artifacts always give the same id (a re-run is recognisable)."""
    digest = hashlib.sha256("".join(sorted(a.sha256 for a in plan.artifacts)).encode()).hexdigest()[:12]
    name = (plan.variant or plan.backend or "ggml").replace("/", "-").replace(" ", "-").replace("\\", "-")
    name = "".join(c for c in name if c.isalnum() or c in "-_.")[:64].strip(".") or "ggml"
    return f"{name}-{digest}"


def wheel_of(plan: Plan):
    wheels = [a for a in plan.artifacts if a.name.endswith(".whl")]
    if plan.stack != STACK or not plan.ok or len(wheels) != 1:
        raise InstallError(f"the plan has no installable ggml build ({plan.summary})",
                           hint="name a manifest with a build for this machine, or allow a local build")
    return wheels[0]


class GgmlDirectory:
    """Destination for ggml runtimes (see the module docstring).

    ``cuda_libs``: library wheels the build needs beside it, fetched with ``fetch`` when neither
    the home nor a torch environment (``torch_sites``; default: the home's torch receipts') has them."""

    stack = STACK

    def __init__(self, home: Home, runtime_id: str, *, cuda_libs: Sequence[ArtifactRef] = (),
                 fetch: Optional[cuda_libs.LibFetcher] = None, torch_sites: Optional[Sequence[Path]] = None) -> None:
        self.home = home
        self.rid = runtime_id
        self.cuda_libs = list(cuda_libs)
        self.fetch = fetch
        self.torch_sites = torch_sites

    def stage(self, plan: Plan, source: FetchedWheel, progress: ProgressCallback) -> StagedRuntime:
        self.home.check_same_filesystem(STACK)
        stage = self.home.make_owned_dir(self.home.staging, f"{self.rid}.{os.getpid()}")
        try:
            progress(ProgressEvent("start", "install", task=self.rid, message=f"installing {source.name} into staging"))
            install_wheel(source.path, stage, source.name)
            provided = self._provide_libs(stage, progress)
        except BaseException:
            self.home.remove_owned(stage)
            raise
        return StagedRuntime(stack=STACK, backend=plan.backend, path=stage, env=dict(plan.env), handle=provided)

    def _provide_libs(self, stage: Path, progress: ProgressCallback) -> Optional[cuda_libs.ProvidedLibs]:
        if not self.cuda_libs:
            return None
        if self.fetch is None:
            raise InstallError("this build needs CUDA libraries, and no way to fetch them was given",
                               hint="install through accelstack's install command")
        provided = cuda_libs.provide(self.home, self.cuda_libs, self.fetch, torch_sites=self.torch_sites, progress=progress)
        cuda_libs.write_links(stage, provided)
        return provided

    def files(self, staged: StagedRuntime) -> List[InstalledFile]:
        return hash_tree(staged.path)

    def commit(self, staged: StagedRuntime, receipt: Receipt) -> Optional[Path]:
        old: Optional[Path] = None
        if self.home.receipt_path(self.rid).is_file():
            try:
                old = self.home.runtime_path(self.home.read_receipt(self.rid))
            except Exception:  # a damaged receipt: its directory is found again by gc
                old = None
        final = self.home.runtimes(STACK) / self.rid
        if final.exists() or final.is_symlink():
            final = self.home.runtimes(STACK) / f"{self.rid}.{os.urandom(4).hex()}"
        os.replace(staged.path, final)  # same filesystem (checked in stage): atomic
        staged.path = final
        receipt.path = self.home.relative(final)
        if isinstance(staged.handle, cuda_libs.ProvidedLibs):  # gc keeps a shared library while a receipt names it
            have = {a.sha256 for a in receipt.artifacts}
            receipt.artifacts += [r for r in staged.handle.shared if r.sha256 not in have]
        self.home.write_receipt(receipt)
        return old if old is not None and old != final else None

    def abort(self, staged: StagedRuntime) -> None:
        # still in staging, or renamed into place without a receipt naming it: either way unreferenced
        self.home.remove_owned(staged.path)

    def retire(self, old: Path) -> None:
        if not self.home.remove_owned(old):
            log.warning("the superseded runtime %s was not removed (not a directory accelstack marked as its own)", old)
