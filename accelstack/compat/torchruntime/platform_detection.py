"""``torchruntime.platform_detection``: the torch platform string, from accelstack's plan.

torchruntime maps the GPU model to a platform; accelstack's plan also checks the driver, the OS
version, the Python version, the kernels each wheel was built with and the caller's pins, and the
string returned is the plan's variant. Where no build runs, :class:`~.errors.NoTorchRunsHere` (a
``NotImplementedError``, what torchruntime raises for a machine it cannot serve) says why.
"""
from __future__ import annotations

import dataclasses
import platform
import sys
from typing import Optional, Sequence

from ...hardware.report import HardwareReport
from ._machine import machine_report, platform_of, torch_plan
from .device_db import GPU

__all__ = ["get_torch_platform", "os_name", "arch", "py_version"]

# torchruntime's module globals, kept for callers that read them (they describe this interpreter)
os_name = platform.system()
arch = platform.machine().lower()
py_version = sys.version_info


def get_torch_platform(gpu_infos: Sequence[GPU], packages: Optional[Sequence[str]] = None) -> str:
    """"cpu", "cu128", "rocm6.4", "xpu", "mps" or "directml": the build accelstack would install.

    ``gpu_infos`` come from :func:`~.device_db.get_gpus`; the plan is for the machine they were
    found on (an empty list: the CPU build, as torchruntime says). ``packages``: requirement
    strings ("torch>=2.7", "torchvision<0.20") the build must meet."""
    gpus = list(gpu_infos)
    found = next((r for r in (getattr(g, "report", None) for g in gpus) if isinstance(r, HardwareReport)), None)
    report = found if found is not None else machine_report()
    if not gpus:
        report = _without_gpus(report)
    return platform_of(torch_plan(report, list(packages or [])))


def _without_gpus(report: HardwareReport) -> HardwareReport:
    """The machine with its GPUs left out: the caller asked about none of them."""
    return dataclasses.replace(report, gpus=[], vulkan_devices=[], preference=[p for p in report.preference if p.api == "cpu"],
                               apis=[a for a in report.apis if a.name == "cpu"])
