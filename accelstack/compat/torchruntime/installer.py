"""``torchruntime.install``: the caller's torch packages, from accelstack's plan, into this interpreter.

torchruntime picks an index from the GPU model and runs pip without looking at its exit status.
Here the packages and pins become the torch plan's requirements for the running interpreter
(``sys.executable``), and the core installs it as one transaction: the torch it replaces is moved
aside, pip (or uv) runs, the new torch is checked, and on any failure the old one comes back.
The install is recorded as the home's active torch runtime (``accelstack status`` shows it).
"""
from __future__ import annotations

import logging
import platform
import re
import sys
from typing import List, Optional, Sequence, Tuple

from ...core.installing import install as core_install
from ...core.results import InstallSummary
from ...events import ProgressEvent
from ._commands import PYTORCH_INDEX, is_torch, run_plain, torch_command
from ._machine import machine_report, refuse_unless_ready, settings, torch_plan
from .device_db import get_gpus
from .errors import CompatUsageError
from .platform_detection import get_torch_platform

__all__ = ["DEFAULT_PACKAGES", "split_packages", "install", "get_install_commands", "get_pip_commands", "run_commands", "os_name",
           "PIP_PREFIX", "CUDA_REGEX", "ROCM_REGEX", "ROCM_VERSION_REGEX"]

log = logging.getLogger(__name__)

DEFAULT_PACKAGES = ["torch", "torchaudio", "torchvision"]  # torchruntime's default
# pip options torchruntime's callers pass among the packages (Easy Diffusion: "--upgrade", "--force"),
# and what each means here; a plan already names exact versions, so upgrading is what it does anyway
_FORCE = ("--force", "--force-reinstall")
# --no-deps and --no-warn-script-location (FooocusPlus's launcher) do not apply to a torch plan, which installs
# the dependencies its packages name; a command without torch packages gets them as given
_IGNORED = ("--upgrade", "-U", "--upgrade-strategy=eager", "-q", "--quiet", "--no-cache-dir", "--no-deps",
            "--no-warn-script-location")

os_name = platform.system()  # torchruntime's global: which companions a platform gets (tests patch it)
PIP_PREFIX = [sys.executable, "-m", "pip", "install"]
CUDA_REGEX = re.compile(r"^(nightly/)?cu\d+$")
ROCM_REGEX = re.compile(r"^(nightly/)?rocm\d+\.\d+$")
ROCM_VERSION_REGEX = re.compile(r"^(?:nightly/)?rocm(?P<major>\d+)\.(?P<minor>\d+)$")


def get_install_commands(torch_platform: str, packages: Optional[Sequence[str]]) -> List[List[str]]:
    """pip arguments (without ``pip install``) for ``packages`` (default torch, torchaudio, torchvision) on a platform.

    Raises ``ValueError`` (a :class:`~.errors.CompatUsageError`) for a platform torchruntime does not know."""
    pkgs = list(packages) if packages else list(DEFAULT_PACKAGES)
    if torch_platform == "cpu":
        return [pkgs]
    cuda, rocm = CUDA_REGEX.match(torch_platform), ROCM_REGEX.match(torch_platform)
    if cuda or rocm or torch_platform == "xpu":
        cmds = [pkgs + ["--index-url", f"{PYTORCH_INDEX}/{torch_platform}"]]
        if os_name == "Windows" and cuda:
            cmds.append(["triton-windows"])
        version = ROCM_VERSION_REGEX.match(torch_platform)
        if os_name == "Linux" and version and int(version.group("major")) >= 6:
            cmds.append(["pytorch-triton-rocm", "--index-url", PYTORCH_INDEX])
        if os_name == "Linux" and torch_platform == "xpu":
            cmds.append(["pytorch-triton-xpu", "--index-url", PYTORCH_INDEX])
        return cmds
    if torch_platform == "directml":
        return [["torch-directml"], pkgs]
    if torch_platform == "ipex":
        return [pkgs, ["intel-extension-for-pytorch"]]
    raise CompatUsageError(f"Unsupported platform: {torch_platform}",
                           hint="cpu, cuNNN, rocmN.N, xpu, directml or ipex (torchruntime's platform names)")


def get_pip_commands(cmds: Sequence[Sequence[str]], use_uv: bool = False) -> List[List[str]]:
    """Each command with the installer's prefix: ``python -m pip install`` (this interpreter) or ``uv pip install``."""
    assert not any(cmd is None for cmd in cmds)  # torchruntime's contract, which its callers' tests check
    prefix = ["uv", "pip", "install"] if use_uv else [sys.executable, "-m", "pip", "install"]
    return [prefix + list(cmd) for cmd in cmds]


def split_packages(packages: Optional[Sequence[str]]) -> Tuple[List[str], bool]:
    """The requirement strings and whether a reinstall was asked, from torchruntime's package list."""
    reqs: List[str] = []
    force = False
    for given in packages or []:
        if not isinstance(given, str):
            raise CompatUsageError(f"install() takes package strings, not {type(given).__name__}: {given!r}")
        item = given.strip()  # FooocusPlus writes " torchvision==0.x"
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


def install(packages: Optional[Sequence[str]] = None, use_uv: bool = False) -> Optional[InstallSummary]:
    """Install ``packages`` (default torch, torchaudio, torchvision; pins kept) for this machine's GPU.

    Raises :class:`~.errors.NoTorchRunsHere` (a ``NotImplementedError``) when no build runs here as
    asked, and an ``AccelstackError`` when pip or the check fails (the previous torch is restored).
    Returns the core's :class:`InstallSummary` (torchruntime returns None). Packages without torch,
    torchvision or torchaudio among them (FooocusPlus: ``["--no-deps", "xformers==0.0.28"]``) are
    installed as torchruntime installs them, from the index of :func:`get_torch_platform`'s answer; None."""
    reqs, force = split_packages(packages)
    if packages and not any(is_torch(r) for r in reqs):
        given = [p.strip() for p in packages if p.strip() not in _FORCE]
        answer = get_torch_platform(get_gpus(), packages=reqs)
        run_commands(get_pip_commands(get_install_commands(answer, given), use_uv=use_uv))
        return None
    s = settings(use_uv=use_uv)
    report = machine_report(s=s)
    p = refuse_unless_ready(torch_plan(report, reqs, s))
    log.info("installing torch %s (%s): %s", p.torch_version, p.variant, " ".join(p.packages))
    return core_install(p, report=report, settings=s, force=force, on_progress=_log_event)


def _install_torch(reqs: Sequence[str], backend: str, use_uv: bool) -> InstallSummary:
    s = settings(use_uv=use_uv)
    report = machine_report(s=s)
    p = refuse_unless_ready(torch_plan(report, reqs, s, backend=backend))
    log.info("installing torch %s (%s): %s", p.torch_version, p.variant, " ".join(p.packages))
    return core_install(p, report=report, settings=s, on_progress=_log_event)


def run_commands(cmds: Sequence[Sequence[str]]) -> List[InstallSummary]:
    """Run torchruntime's pip commands (from :func:`get_pip_commands`): each one that installs torch,
    torchvision or torchaudio becomes accelstack's plan for those packages on the platform its index
    names (``torch-directml`` among the commands: the DirectML build), installed as one transaction
    and checked, the previous torch restored on failure; every other command runs as given.

    Raises :class:`~.errors.NoTorchRunsHere` (a ``NotImplementedError``) when no build of that
    platform runs here as asked; returns the transactions' summaries (torchruntime returns None)."""
    directml = any("torch-directml" in cmd for cmd in cmds)
    done: List[InstallSummary] = []
    for cmd in cmds:
        found = torch_command(cmd)
        if found is None:
            if not (directml and "torch-directml" in cmd):  # the DirectML plan installs it with its torch
                run_plain(cmd)
            continue
        reqs, where, uv, others = found
        done.append(_install_torch(reqs, "directml" if directml else (where or "cpu"), uv))
        if others:
            run_plain(get_pip_commands([others], use_uv=uv)[0])
    return done
