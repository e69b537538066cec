"""The hardware fingerprint a receipt keeps: what, if it changes, may make the installed runtime the wrong one.

Its own module so that `status`, which compares it, loads no planning or manifests code.
"""
from __future__ import annotations

import hashlib
import json

from ..hardware.report import HardwareReport

__all__ = ["hardware_fingerprint"]


def hardware_fingerprint(report: HardwareReport) -> str:
    """What, if it changes, may make the installed runtime the wrong one (GPU, driver, OS, CPU)."""
    material = {
        "os": [report.os.name, report.os.arch],
        "cpu": report.cpu.features,
        "gpus": [[g.vendor, g.pci_device_id or g.name, g.driver_version, g.compute_capability, g.gfx_target] for g in report.gpus],
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]
