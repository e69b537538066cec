"""``torchruntime.install``: the caller's torch packages, from accelstack's plan, into this interpreter.

torchruntime picks an index from the GPU model and runs pip without looking at its exit status.
Here the packages and pins become the torch plan's requirements for the running interpreter
(``sys.executable``), and the core installs it as one transaction: the torch it replaces is moved
aside, pip (or uv) runs, the new torch is checked, and on any failure the old one comes back.
The install is recorded as the home's active torch runtime (``accelstack status`` shows it).
"""
from __future__ import annotations

import logging
from typing import List, Optional, Sequence, Tuple

from ...core.installing import install as core_install
from ...core.results import InstallSummary
from ...events import ProgressEvent
from ._machine import machine_report, refuse_unless_ready, settings, torch_plan
from .errors import CompatUsageError

__all__ = ["DEFAULT_PACKAGES", "split_packages", "install"]

log = logging.getLogger(__name__)

DEFAULT_PACKAGES = ["torch", "torchaudio", "torchvision"]  # torchruntime's default
# pip options torchruntime's callers pass among the packages (Easy Diffusion: "--upgrade", "--force"),
# and what each means here; a plan already names exact versions, so upgrading is what it does anyway
_FORCE = ("--force", "--force-reinstall")
_IGNORED = ("--upgrade", "-U", "--upgrade-strategy=eager", "-q", "--quiet", "--no-cache-dir")


def split_packages(packages: Optional[Sequence[str]]) -> Tuple[List[str], bool]:
    """The requirement strings and whether a reinstall was asked, from torchruntime's package list."""
    reqs: List[str] = []
    force = False
    for item in packages or []:
        if not isinstance(item, str):
            raise CompatUsageError(f"install() takes package strings, not {type(item).__name__}: {item!r}")
        if item in _FORCE:
            force = True
        elif item in _IGNORED:
            continue
        elif item.startswith("-"):
            raise CompatUsageError(f"the pip option {item!r} is not taken by accelstack's install",
                                   hint="pass package names and version pins; --upgrade and --force are understood")
        else:
            reqs.append(item)
    return reqs or list(DEFAULT_PACKAGES), force


def _log_event(event: ProgressEvent) -> None:
    if event.message:
        log.info("%s", event.message)


def install(packages: Optional[Sequence[str]] = None, use_uv: bool = False) -> InstallSummary:
    """Install ``packages`` (default torch, torchaudio, torchvision; pins kept) for this machine's GPU.

    Raises :class:`~.errors.NoTorchRunsHere` (a ``NotImplementedError``) when no build runs here as
    asked, and an ``AccelstackError`` when pip or the check fails (the previous torch is restored).
    Returns the core's :class:`InstallSummary` (torchruntime returns None)."""
    reqs, force = split_packages(packages)
    s = settings(use_uv=use_uv)
    report = machine_report(s=s)
    p = refuse_unless_ready(torch_plan(report, reqs, s))
    log.info("installing torch %s (%s): %s", p.torch_version, p.variant, " ".join(p.packages))
    return core_install(p, report=report, settings=s, force=force, on_progress=_log_event)
