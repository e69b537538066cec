"""``torchruntime.utils``: the device helpers, and ``info()``, the one call whose job is to show text.

``info()`` prints, as torchruntime's does (Easy Diffusion calls it to log the machine at start);
``info_text()`` returns the same text for a caller that shows it itself.
"""
from __future__ import annotations

import sys
from typing import List, Optional, TextIO

from .._machine import machine_report, torch_plan
from ..configuration import planned_env
from ..device_db import gpus_of
from ..platform_detection import get_torch_platform
from . import torch_device_utils, torch_test
from .torch_device_utils import (
    SUPPORTED_BACKENDS,
    get_device,
    get_device_count,
    get_device_name,
    get_installed_torch_platform,
)

__all__ = ["torch_device_utils", "torch_test", "SUPPORTED_BACKENDS", "get_device", "get_device_count", "get_device_name", "get_installed_torch_platform",
           "info", "info_text"]


def info_text() -> str:
    """The GPUs, the recommended torch platform (with accelstack's reason) and the configuration."""
    report = machine_report()
    lines: List[str] = ["--- GPUs ---"]
    gpus = gpus_of(report)
    lines += [f"{i}. {gpu}" for i, gpu in enumerate(gpus)] or ["No GPUs found!"]
    lines += ["", "--- RECOMMENDED TORCH PLATFORM ---"]
    p = torch_plan(report)
    if p.ok:
        lines += [get_torch_platform(gpus), f"(accelstack installs {p.summary})"]
    else:
        lines += [f"none: {p.summary}"]
    lines += ["", "--- CONFIGURATION ---"]
    lines += [f"{k}={v}" for k, v in sorted(planned_env().items())] or ["(no environment variables needed)"]
    return "\n".join(lines)


def info(out: Optional[TextIO] = None) -> None:
    """Print :func:`info_text` (to ``out``, default stdout), as ``torchruntime.info()`` does."""
    stream = out if out is not None else sys.stdout
    stream.write(info_text() + "\n")
    stream.flush()
