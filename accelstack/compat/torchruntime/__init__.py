"""A torchruntime-compatible interface backed by accelstack: ``import accelstack.compat.torchruntime as torchruntime``.

The calls keep torchruntime's names, arguments and return shapes (``install(packages, use_uv)``,
``configure()``, ``device_db.get_gpus()``, ``platform_detection.get_torch_platform(gpus, packages)``,
``utils.get_device(...)``, ``python -m accelstack.compat.torchruntime install|test|info``); the
answers are accelstack's: drivers and kernels checked, a transactional install, a real check.
Every difference is in docs/torchruntime.md.
"""
from __future__ import annotations

import sys
import types

from . import configuration, consts, device_db, gpu_db, installer, platform_detection, utils
from ._switch import foreign_modules, switch_in_place, warn_late
from .configuration import configure
from .device_db import GPU, get_gpus
from .errors import CompatUsageError, NoTorchRunsHere
from .installer import install
from .platform_detection import get_torch_platform
from .utils import get_device, get_installed_torch_platform, info

__all__ = ["configuration", "consts", "device_db", "gpu_db", "installer", "platform_detection", "utils",
           "configure", "GPU", "get_gpus", "CompatUsageError", "NoTorchRunsHere", "install", "get_torch_platform",
           "get_device", "get_installed_torch_platform", "info", "register"]

_SUBMODULES = ("configuration", "consts", "device_db", "gpu_db", "installer", "platform_detection", "utils",
               "utils.torch_device_utils", "utils.torch_test")


def register(name: str = "torchruntime") -> types.ModuleType:
    """Answer ``import torchruntime`` and ``from torchruntime.utils import get_device`` in this process
    with this package (an app whose code imports torchruntime's submodules by name calls it once).

    When the real torchruntime was imported first, every module-level name bound to it (its package,
    its modules, its functions and classes) in every loaded module is rebound to this package's, and a
    ``RuntimeWarning`` says so and what it could not reach (docs/torchruntime.md); returns this package."""
    real = foreign_modules(name)
    for sub in ("",) + tuple("." + s for s in _SUBMODULES):
        sys.modules[name + sub] = sys.modules[__name__ + sub]
    if real:
        for stale in [n for n in real if sys.modules.get(n) is real[n]]:
            del sys.modules[stale]  # a real submodule this package does not mirror is not imported again from the old files
        warn_late(name, real, switch_in_place(name, __name__, real))
    return sys.modules[__name__]
