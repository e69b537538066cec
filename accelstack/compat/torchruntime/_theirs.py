"""torchruntime's own package, loaded under a private name, for the answers a caller asks of it.

``register()`` makes ``torchruntime`` mean accelstack's package, so the real one (a dependency of
accelstack: its PCI database names GPUs for detection) is loaded here from its installed files as
``accelstack_torchruntime_original``: the compat interface asks it for torchruntime's platform
answer, which it keeps wherever accelstack's facts say that answer runs, and returns as it is to a
caller that asks for the ``torchruntime`` policy.
"""
from __future__ import annotations

import importlib.util
import sys
import threading
import types
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

__all__ = ["NAME", "package_dir", "original", "torchruntime_platform"]

NAME = "accelstack_torchruntime_original"
_LOCK = threading.RLock()  # re-entered when a patched lookup asks torchruntime again


def package_dir() -> Optional[Path]:
    """The folder of the installed torchruntime distribution (whatever ``sys.modules`` says it is)."""
    try:
        folder = Path(str(metadata.distribution("torchruntime").locate_file("torchruntime")))
    except metadata.PackageNotFoundError:
        return None
    return folder if (folder / "__init__.py").is_file() else None


def original() -> Optional[types.ModuleType]:
    """The real torchruntime package (its ``platform_detection`` loaded), or None when it is not installed."""
    with _LOCK:
        if NAME + ".platform_detection" in sys.modules:
            return sys.modules[NAME]
        folder = package_dir()
        if folder is None:
            return None
        spec = importlib.util.spec_from_file_location(NAME, folder / "__init__.py", submodule_search_locations=[str(folder)])
        if spec is None or spec.loader is None:
            return None
        package = importlib.util.module_from_spec(spec)
        sys.modules[NAME] = package
        try:
            spec.loader.exec_module(package)  # imports its installer, device_db, platform_detection...
        except Exception:
            for name in [n for n in sys.modules if n == NAME or n.startswith(NAME + ".")]:
                del sys.modules[name]
            raise
        return package


def torchruntime_platform(gpus: Sequence[Any], packages: Sequence[str], os_name: str, arch: str, py_version: Any,
                          nvidia_arch: Optional[Callable[[Any], float]] = None) -> str:
    """torchruntime's ``get_torch_platform`` for ``gpus`` on the platform given (its prints and
    ``NotImplementedError`` included); ``nvidia_arch`` replaces its architecture lookup."""
    package = original()
    if package is None:
        raise NotImplementedError("torchruntime is not installed, so its own answer cannot be asked for")
    theirs: Any = sys.modules[NAME + ".platform_detection"]
    with _LOCK:  # its answer is read from module globals: set them for this call only
        saved = (theirs.os_name, theirs.arch, theirs.py_version, theirs.get_nvidia_arch)
        theirs.os_name, theirs.arch, theirs.py_version = os_name, arch, py_version
        if nvidia_arch is not None:
            theirs.get_nvidia_arch = nvidia_arch
        try:
            return str(theirs.get_torch_platform(list(gpus), packages=list(packages)))
        finally:
            theirs.os_name, theirs.arch, theirs.py_version, theirs.get_nvidia_arch = saved
