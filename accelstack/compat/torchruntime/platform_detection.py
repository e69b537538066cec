"""``torchruntime.platform_detection``: the torch platform for a list of GPUs, in torchruntime's words.

The answer starts as torchruntime's own (asked of the installed torchruntime, with this module's
``os_name``, ``arch`` and ``py_version``, which callers and tests patch) and stays unless
accelstack's facts say it cannot run:

- GPUs from :func:`~.device_db.get_gpus` carry the machine they were found on: the answer must pass
  accelstack's plan for that machine (driver, kernels, OS version, /dev/kfd, the caller's pins);
  where it does not, the plan's own choice is returned, spelled as a PyTorch index name.
- GPUs built by the caller (a device picker, a remote machine's list) are identified through
  accelstack's tables: a platform whose wheels in accelstack's matrix have no kernels for any of
  them gives way to the newest build that has, or to "cpu" (with a printed warning, as torchruntime
  warns). A GPU the tables do not know leaves torchruntime's answer standing.

``policy="torchruntime"`` (or this module's ``policy`` set to it, for every call) returns
torchruntime's answer as it is. Every difference is in docs/torchruntime.md.
"""
from __future__ import annotations

import dataclasses
import platform
import sys
from typing import Any, Optional, Sequence, Tuple

from ...hardware.report import HardwareReport
from ...hardware.tables import pci_lookup
from . import _facts, _theirs
from ._machine import machine_report, refuse_unless_ready, torch_plan
from .consts import AMD, CONTACT_LINK, INTEL, NVIDIA
from .errors import CompatUsageError
from .gpu_db import get_amd_gfx_info, get_nvidia_arch

__all__ = ["get_torch_platform", "os_name", "arch", "py_version", "AMD", "NVIDIA", "INTEL", "CONTACT_LINK",
           "get_nvidia_arch", "get_amd_gfx_info", "POLICIES", "policy"]

# torchruntime's module globals: its answer is read from them, and callers (and its tests) patch them
os_name = platform.system()
arch = platform.machine().lower()
py_version = sys.version_info
_NATIVE = (os_name, arch, py_version)  # what they are for this interpreter, to tell a patched value

POLICIES = {
    "accelstack": "torchruntime's answer where accelstack's facts say it runs, else accelstack's (the default)",
    "torchruntime": "torchruntime's own answer, unchanged",
}
policy = "accelstack"  # get_torch_platform's default policy in this process (a caller may set it once)


def _policy(policy: Optional[str]) -> str:
    chosen = (policy or globals()["policy"] or "accelstack").strip().lower()
    if chosen not in POLICIES:
        raise CompatUsageError(f"unknown torchruntime policy {chosen!r}", hint="use one of: " + ", ".join(POLICIES))
    return chosen


def _nvidia_arch_override() -> Any:
    """This module's ``get_nvidia_arch`` when a caller replaced it (a test's patch), for torchruntime's logic."""
    current = globals()["get_nvidia_arch"]
    return None if current is _GET_NVIDIA_ARCH else current


_GET_NVIDIA_ARCH = get_nvidia_arch


def _python() -> str:
    return ".".join(str(p) for p in tuple(py_version)[:2])


def get_torch_platform(gpu_infos: Sequence[Any], packages: Optional[Sequence[str]] = None, policy: Optional[str] = None) -> str:
    """"cpu", "cu128", "rocm6.2", "xpu", "mps", "directml" (torchruntime's words, PyTorch's index names)
    for these GPUs; ``packages``: the caller's requirement strings ("torch<2.7"), as torchruntime takes them.

    Raises ``NotImplementedError`` where torchruntime does (an unknown architecture, NVIDIA on a Mac,
    two vendors without NVIDIA), and :class:`~.errors.NoTorchRunsHere` (also one) where the pins leave
    no build for this machine."""
    gpus, reqs = list(gpu_infos), list(packages or [])
    chosen = _policy(policy)
    report = _machine_of(gpus)
    if report is not None:  # asked of torchruntime as if it ran on that machine, with its database's GPU names
        words = _torchruntime_platform_words(report)
        try:
            theirs = _theirs.torchruntime_platform([_as_theirs(g) for g in gpus], reqs, words[0], words[1], py_version)
        except NotImplementedError:  # two vendors without NVIDIA, NVIDIA on a Mac...: the plan still chooses
            if chosen == "torchruntime":
                raise
            theirs = "cpu"
        return theirs if chosen == "torchruntime" else _from_plan(report, theirs, reqs)
    theirs = _theirs.torchruntime_platform(gpus, reqs, os_name, arch, py_version, _nvidia_arch_override())
    if chosen == "torchruntime":
        return theirs
    if not gpus and reqs and (os_name, arch, py_version) == _NATIVE:
        refuse_unless_ready(torch_plan(_without_gpus(machine_report()), reqs))  # the pins must leave a CPU build
        return theirs
    where, py = _facts.platform_key(os_name, arch), _python()
    if theirs == "cpu" or not where or _facts.verdict(theirs, gpus, where, py, reqs):
        return theirs
    ours = _facts.own_choice(theirs, gpus, where, py, reqs)
    print(f"[WARNING] accelstack: no {theirs} build in its torch matrix has kernels for {_described(gpus)}; "
          f"answering {ours} instead (docs/torchruntime.md)")
    return ours


def _described(gpus: Sequence[Any]) -> str:
    return ", ".join(f"{g.device_name} ({_facts.gpu_cc(g) or _facts.gpu_gfx(g) or g.device_id})" for g in gpus)


def _machine_of(gpus: Sequence[Any]) -> Optional[HardwareReport]:
    """The machine the GPUs were detected on, when they all carry it and nothing was patched."""
    reports = {id(r): r for r in (getattr(g, "report", None) for g in gpus)}
    if len(reports) != 1 or (os_name, arch, py_version) != _NATIVE:
        return None
    found = next(iter(reports.values()))
    return found if isinstance(found, HardwareReport) else None


def _from_plan(report: HardwareReport, theirs: str, reqs: Sequence[str]) -> str:
    """torchruntime's answer if accelstack's plan for the machine accepts it, else the plan's choice as an index name."""
    if theirs != "cpu" and torch_plan(report, reqs, backend=theirs).ok:  # "cpu" is torchruntime's fallback, not a choice
        return theirs
    p = refuse_unless_ready(torch_plan(report, reqs))
    names = [c.name for c in p.candidates if c.accepted and _is_index(c.name)]
    best = p.variant if _is_index(p.variant) else (names[0] if names else "cpu")
    return best


_OS_WORDS = {"linux": "Linux", "windows": "Windows", "macos": "Darwin"}


def _torchruntime_platform_words(report: HardwareReport) -> Tuple[str, str]:
    """(os_name, arch) as torchruntime spells them for the machine of ``report``."""
    name = _OS_WORDS.get(report.os.name, report.os.name.capitalize())
    machine = report.os.arch
    if name == "Windows" and machine == "x86_64":
        machine = "amd64"
    elif name == "Linux" and machine == "arm64":
        machine = "aarch64"
    return name, machine


def _as_theirs(gpu: Any) -> Any:
    """A record as torchruntime's own ``get_gpus`` names it (its database's chip name), for its answer."""
    known = pci_lookup(str(gpu.vendor_id), str(gpu.device_id))
    return dataclasses.replace(gpu, device_name=known[0]) if known else gpu


def _is_index(name: str) -> bool:
    for release in _facts.matrix().releases:
        variant = release.variant(name)
        if variant is not None:
            return _facts.index_name(variant)
    return name in ("cpu", "directml")


def _without_gpus(report: HardwareReport) -> HardwareReport:
    """The machine with its GPUs left out: the caller asked about none of them."""
    return dataclasses.replace(report, gpus=[], vulkan_devices=[], preference=[p for p in report.preference if p.api == "cpu"],
                               apis=[a for a in report.apis if a.name == "cpu"])
