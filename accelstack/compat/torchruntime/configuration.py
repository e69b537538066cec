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
import platform
import sys
from importlib import metadata
from typing import Any, Dict, List, Optional, Sequence

from ...hardware.protocol import System
from . import _theirs
from ._facts import gfx_version, gpu_gfx, matrix
from ._machine import machine_report, torch_plan

__all__ = ["configure", "planned_env", "os_name", "check_rocm_permissions", "set_rocm_env_vars", "set_mac_env_vars", "rocm_env"]

os_name = platform.system()  # torchruntime's global: a Mac gets the MPS fallback (tests patch it)

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
    return _set_env_vars(planned_env(system))


def _set_env_vars(env: Dict[str, str]) -> Dict[str, str]:
    """Set ``env`` in ``os.environ`` except what the user already set; returns what was set."""
    applied: Dict[str, str] = {}
    for key, value in env.items():
        if key in os.environ:
            log.info("keeping %s=%s (set before configure)", key, os.environ[key])
            continue
        os.environ[key] = value
        applied[key] = value
        log.info("setting env variable %s=%s", key, value)
    return applied


def _configure_internal(gpu_infos: Sequence[Any], torch_platform: str) -> Dict[str, str]:
    """torchruntime's configuration step for GPUs and a platform the caller chose: ROCm's variables for a
    ROCm platform, the MPS fallback on a Mac; returns what was set."""
    if "rocm" in torch_platform:
        check_rocm_permissions()
        return set_rocm_env_vars(gpu_infos, torch_platform)
    if os_name == "Darwin":
        return set_mac_env_vars(gpu_infos, torch_platform)
    return {}


def check_rocm_permissions() -> None:
    """Warn (as torchruntime does) when detection found /dev/kfd closed to this user: ROCm cannot start then."""
    for problem in machine_report().problems:
        if problem.code.startswith("kfd"):
            log.warning("%s", problem.message)


def rocm_env(gpu_infos: Sequence[Any], torch_platform: str) -> Dict[str, str]:
    """ROCm's variables for these GPUs: torchruntime's choice of GPU family (HIP_VISIBLE_DEVICES), with
    HSA_OVERRIDE_GFX_VERSION from accelstack's facts where its tables know the GPU's gfx target: the
    override ``torch.json`` allows for it, or its own version (never another target's for one whose
    override is refused, such as RDNA1 or gfx1103)."""
    gpus = list(gpu_infos)
    if _theirs.original() is None or not gpus:
        return {}
    theirs: Any = sys.modules[_theirs.NAME + ".configuration"]
    env: Dict[str, str] = {}
    saved = theirs._set_env_vars
    theirs._set_env_vars = env.update
    try:
        theirs.set_rocm_env_vars(gpus, torch_platform)
    finally:
        theirs._set_env_vars = saved
    visible = env.get("HIP_VISIBLE_DEVICES", "")
    chosen = [gpus[int(i)] for i in visible.split(",") if i.isdigit() and int(i) < len(gpus)] if visible else gpus[:1]
    known = next((g for g in map(gpu_gfx, chosen) if g), "")
    if known and "HSA_OVERRIDE_GFX_VERSION" in env:
        override = matrix().gfx_overrides.get(known)
        env["HSA_OVERRIDE_GFX_VERSION"] = override.value if override is not None else gfx_version(known)
    return env


def set_rocm_env_vars(gpu_infos: Sequence[Any], torch_platform: str) -> Dict[str, str]:
    """Set :func:`rocm_env` (a variable the user set is kept); returns what was set."""
    return _set_env_vars(rocm_env(gpu_infos, torch_platform))


def set_mac_env_vars(gpu_infos: Sequence[Any], torch_platform: str) -> Dict[str, str]:
    """The MPS fallback: operations MPS lacks run on the CPU instead of failing."""
    return _set_env_vars({"PYTORCH_ENABLE_MPS_FALLBACK": "1"})
