"""``torchruntime.gpu_db.get_nvidia_arch``: the compute capability of NVIDIA GPUs, from accelstack's detection.

torchruntime guesses the architecture from the marketing name; accelstack's detection has the
compute capability the driver reports (or its own table's, by PCI id). Names are matched against
the GPUs detected on this machine.
"""
from __future__ import annotations

from typing import Iterable, Optional

from ...hardware.protocol import System
from ._machine import machine_report

__all__ = ["get_nvidia_arch"]


def get_nvidia_arch(device_names: Iterable[str], system: Optional[System] = None) -> float:
    """The lowest compute capability (8.6, 12.0) among this machine's NVIDIA GPUs with these names
    (``system``: a replayed capture's); 0 if none is known."""
    names = set(device_names)
    ccs = []
    for g in machine_report(system).gpus:
        if g.vendor == "nvidia" and g.compute_capability and (g.name in names or not names):
            try:
                ccs.append(float(g.compute_capability))
            except ValueError:
                continue
    return min(ccs) if ccs else 0
