"""``torchruntime.utils``' device helpers: which torch backend is live in this interpreter, and its devices.

These answer from the installed torch itself, as torchruntime's do, in the order accelstack's
torch check uses (CUDA, which ROCm builds answer as, then XPU, DirectML, MPS, CPU). torch is
imported on first call: the rest of the compat interface works without it.
"""
from __future__ import annotations

import platform
from typing import Any, Tuple, Union

__all__ = ["CPU", "CUDA", "XPU", "MPS", "DIRECTML", "MTIA", "SUPPORTED_BACKENDS", "get_installed_torch_platform",
           "get_device_count", "get_device_name", "get_device"]

CPU, CUDA, XPU, MPS, DIRECTML, MTIA = "cpu", "cuda", "xpu", "mps", "directml", "mtia"
SUPPORTED_BACKENDS = (CPU, CUDA, XPU, MPS, DIRECTML, MTIA)


def _torch() -> Any:
    import torch  # heavy and optional: only when a caller asks about devices

    return torch


def _directml() -> Any:
    """The torch_directml module when it is installed and sees an adapter, else None."""
    try:
        import torch_directml
    except ImportError:
        return None
    return torch_directml if torch_directml.is_available() else None


def get_installed_torch_platform() -> Tuple[str, Any]:
    """(name, module) of the backend torch runs on here: ("cuda", torch.cuda), ..., ("cpu", torch.cpu)."""
    torch = _torch()
    if torch.cuda.is_available():
        return CUDA, torch.cuda
    if hasattr(torch, XPU) and torch.xpu.is_available():
        return XPU, torch.xpu
    dml = _directml()
    if dml is not None:
        return DIRECTML, dml
    if platform.system() == "Darwin" and hasattr(torch.backends, MPS) and torch.backends.mps.is_available():
        return MPS, getattr(torch, MPS, torch.backends.mps)
    if hasattr(torch, MTIA) and torch.mtia.is_available():
        return MTIA, torch.mtia
    return CPU, torch.cpu


def get_device_count() -> int:
    name, module = get_installed_torch_platform()
    if name == CPU or not hasattr(module, "device_count"):
        return 1
    return int(module.device_count())


def get_device_name(device: Any) -> str:
    """The name of ``device`` (a torch.device): the GPU's name on CUDA, XPU and DirectML, else "kind:index"."""
    name, module = get_installed_torch_platform()
    if name == DIRECTML:
        return str(module.device_name(device.index))
    if name in (CUDA, XPU):
        return str(module.get_device_name(device.index))
    return f"{name}:{device.index}"


def get_device(device: Union[int, str]) -> Any:
    """A torch device from an index (on the installed backend) or a string ("cuda:1", "cpu")."""
    torch = _torch()
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        position = int(index) if index else 0
    else:
        kind, position = get_installed_torch_platform()[0], int(device)
    if kind == DIRECTML:
        dml = _directml()
        if dml is not None:
            return dml.device(position)
    return torch.device(kind, position)
