"""Drop-in interfaces of other tools, backed by accelstack, so an app switches with one import line.

``accelstack.compat.torchruntime`` answers torchruntime's calls (``install``, ``configure``,
``device_db.get_gpus``, ``platform_detection.get_torch_platform``, ``utils.get_device``...) with
accelstack's detection, plans, transactional install and checks. It sits above the core, beside
the CLI: it resolves ``Settings`` and calls the core as an app would. docs/torchruntime.md lists
every place where its answers differ from torchruntime's, and why.
"""
from __future__ import annotations

__all__: list = []
