"""``torchruntime.configure``: set the environment the torch plan carries, in this process.

torchruntime sets ``HSA_OVERRIDE_GFX_VERSION`` by AMD family name, ``HIP_VISIBLE_DEVICES``,
``ROC_ENABLE_PRE_VEGA`` and the MPS fallback. Here the variables are the plan's ``env``: the visible
devices of the GPU the plan chose, the gfx override only where accelstack's data allows it for
that GPU (never for one where the override is known to hang or fail), and the MPS fallback. The
plan is made for the torch already installed, so the variables match what will run.
This module writes ``os.environ``: that is its whole job.
"""
from __future__ import annotations

import logging
import os
from importlib import metadata
from typing import Dict, List, Optional

from ...hardware.protocol import System
from ._machine import machine_report, torch_plan

__all__ = ["configure", "planned_env"]

log = logging.getLogger(__name__)


def _installed_pins() -> List[str]:
    """``torch==X`` for the torch in this interpreter, so the plan is the one for it (none: any)."""
    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return []
    return [f"torch=={version.split('+')[0]}"]


def planned_env(system: Optional[System] = None) -> Dict[str, str]:
    """The variables the torch plan for this machine (and the torch installed here) sets."""
    report = machine_report(system)
    p = torch_plan(report, _installed_pins())
    if not p.ok:  # the installed torch is not one that runs here (or none is in the matrix): plan without it
        p = torch_plan(report)
    for problem in report.problems:
        if problem.code.startswith("kfd"):  # torchruntime warns about /dev/kfd too
            log.warning("%s", problem.message)
    return dict(p.env) if p.ok else {}


def configure(system: Optional[System] = None) -> Dict[str, str]:
    """Set the plan's environment variables in ``os.environ``; returns what was set.

    A variable the user already set is left as it is (an override of their own wins).
    ``system``: plan for a replayed capture instead of this machine (accelstack's addition)."""
    applied: Dict[str, str] = {}
    for key, value in planned_env(system).items():
        if key in os.environ:
            log.info("keeping %s=%s (set before configure)", key, os.environ[key])
            continue
        os.environ[key] = value
        applied[key] = value
        log.info("setting env variable %s=%s", key, value)
    return applied
