"""Switching an already-imported torchruntime to accelstack's package, as far as Python allows.

``register()`` is one line when it runs before any ``import torchruntime``. When the real package
was imported first, its modules are already bound in other modules: ``import torchruntime`` binds
the package, ``from torchruntime.platform_detection import get_torch_platform`` binds a function.
Here every such module-level name, in every loaded module, is rebound to accelstack's counterpart,
and the real modules' own public names are rebound too (so ``torchruntime.install(...)`` through a
kept reference calls accelstack's). What cannot be found (a reference inside a function's defaults,
a closure, an object's attribute, a GPU record already made) still reaches the real torchruntime:
the caller is told, with a ``RuntimeWarning`` naming what was switched.
"""
from __future__ import annotations

import logging
import os
import sys
import types
import warnings
from typing import Dict, List

from ..torchruntime_shim import SHIM_DIR
from ._theirs import NAME as PRIVATE

__all__ = ["foreign_modules", "switch_in_place"]

log = logging.getLogger(__name__)


def _ours(module: object) -> bool:
    """accelstack's package, or the shim's ``torchruntime`` (importing it is what registers accelstack's)."""
    origin = str(getattr(module, "__file__", "") or "")
    return getattr(module, "__name__", "").startswith("accelstack.compat.torchruntime") or origin.startswith(SHIM_DIR + os.sep)


def foreign_modules(name: str) -> Dict[str, types.ModuleType]:
    """The loaded modules under ``name`` that are not accelstack's (the real torchruntime, imported first)."""
    return {n: m for n, m in list(sys.modules.items())
            if (n == name or n.startswith(name + ".")) and isinstance(m, types.ModuleType) and not _ours(m)}


def switch_in_place(name: str, ours: str, real: Dict[str, types.ModuleType]) -> List[str]:
    """Rebind the real modules' public names and every module-level reference to them; returns what was rebound."""
    replacement: Dict[int, object] = {}
    for module_name, module in real.items():
        counterpart = sys.modules.get(ours + module_name[len(name):])
        if counterpart is None:
            continue
        replacement[id(module)] = counterpart
        for attr, value in list(vars(module).items()):
            if attr.startswith("_") or not hasattr(counterpart, attr):
                continue
            new = getattr(counterpart, attr)
            if isinstance(value, (types.FunctionType, type)) or isinstance(value, types.ModuleType):
                replacement.setdefault(id(value), new)
            setattr(module, attr, new)
    switched: List[str] = []
    for holder_name, holder in list(sys.modules.items()):
        if holder is None or holder_name in real or holder_name.startswith((ours, PRIVATE)) or not isinstance(holder, types.ModuleType):
            continue
        try:
            names = list(vars(holder).items())
        except TypeError:
            continue
        for attr, value in names:
            new = replacement.get(id(value))
            if new is not None and new is not value:
                setattr(holder, attr, new)
                switched.append(f"{holder_name}.{attr}")
    return switched


def warn_late(name: str, real: Dict[str, types.ModuleType], switched: List[str]) -> None:
    shown = ", ".join(switched[:12]) + (f" and {len(switched) - 12} more" if len(switched) > 12 else "")
    message = (f"the real {name} was imported before accelstack's register() ({', '.join(sorted(real))}); "
               f"rebound to accelstack's: {shown or 'no module-level names'} and the real modules' own names. "
               f"References held elsewhere (function defaults, objects, GPU records already made) still reach the real "
               f"{name}: call register() before the first import of {name} (docs/torchruntime.md)")
    log.warning("%s", message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
