"""accelstack: find the accelerator, pick the runtime that runs on it, install it safely, prove it works.

The public API is small and typed; every stage returns data that round-trips through JSON:

    from accelstack import detect, LiveSystem
    report = detect(LiveSystem())

Other names are imported on first use, so the CLI pays only for the command it runs.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# `detect` is both a subpackage and its main function: bind the function now, because importing
# the subpackage (which any later `import accelstack.detect...` does) would otherwise shadow it.
from .detect import detect  # noqa: E402

_EXPORTS = {
    "AccelstackError": "accelstack.errors",
    "HardwareReport": "accelstack.detect.report",
    "LiveSystem": "accelstack.detect.system",
    "ReplaySystem": "accelstack.detect.system",
    "CapturingSystem": "accelstack.detect.system",
    "resolve": "accelstack.manifests.resolve",
    "Manifests": "accelstack.manifests.resolve",
    "Request": "accelstack.manifests.plan",
    "Plan": "accelstack.manifests.plan",
    "fetch": "accelstack.artifacts",
    "ArtifactRef": "accelstack.artifacts.refs",
}

__all__ = ["__version__", "detect", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'accelstack' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
