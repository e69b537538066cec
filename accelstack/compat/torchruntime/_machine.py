"""What every compat call shares: the settings, this machine's report (detected once) and its torch plan.

torchruntime re-reads the PCI bus on every call and keeps its answers in module globals; here the
report is detected once per process (or per replayed ``System``) and each call plans from it, so
``get_gpus``, ``get_torch_platform``, ``install`` and ``configure`` all describe the same machine.
The plan is always for the running interpreter (torchruntime installs into ``sys.executable``) and
for torch alone (``torch_engine=False``): the caller names every package it wants.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, Optional, Sequence

from ...core.detection import detect
from ...core.planning import plan
from ...hardware.protocol import System
from ...hardware.report import HardwareReport
from ...manifests.plan import Plan
from ...settings import Settings
from .errors import NoTorchRunsHere

__all__ = ["settings", "machine_report", "torch_plan", "platform_of", "refuse_unless_ready"]

_LOCK = threading.Lock()
_LIVE: Dict[str, HardwareReport] = {}  # this machine's report, detected on first use


def settings(**overrides: Any) -> Settings:
    """The settings a compat call runs with: the usual ones (``ACCELSTACK_*``), torch alone, this interpreter."""
    return Settings.resolve(torch_engine=False, torch_python="", **overrides)


def machine_report(system: Optional[System] = None, s: Optional[Settings] = None) -> HardwareReport:
    """The report of this machine (detected once per process) or of ``system`` (a replayed capture)."""
    s = s or settings()
    if system is not None:
        return detect(system, settings=s, write_cache=False)
    with _LOCK:  # Easy Diffusion calls info() from a thread while the main thread configures
        if "live" not in _LIVE:
            _LIVE["live"] = detect(settings=s)
        return _LIVE["live"]


def torch_plan(report: HardwareReport, packages: Sequence[str] = (), s: Optional[Settings] = None,
               backend: Optional[str] = None) -> Plan:
    """accelstack's torch plan for ``report`` and the caller's requirement strings (pins included);
    ``backend``: only that variant ("cu128") or backend."""
    s = s or settings()
    return plan(report, stack="torch", requirements=list(packages), backend=backend, settings=s)


def refuse_unless_ready(p: Plan) -> Plan:
    """``p`` when it installs something that runs; else :class:`NoTorchRunsHere` with the plan's reasons."""
    if p.ok:
        return p
    why = "; ".join(p.conflicts) or "; ".join(f"{c.name}: {c.reason}" for c in p.rejected[:3])
    raise NoTorchRunsHere(f"no torch build runs on this machine as asked: {p.summary}" + (f" ({why})" if why else ""),
                          hint="relax the version pins, or look at the plan's rejected candidates (accelstack plan --stack torch)")


def platform_of(p: Plan) -> str:
    """torchruntime's platform string for a plan: the variant name, which uses the same words
    ("cpu", "cu128", "rocm6.4", "xpu", "mps", "directml")."""
    return refuse_unless_ready(p).variant
