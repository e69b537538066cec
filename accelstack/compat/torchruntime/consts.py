"""torchruntime's vendor constants (PCI vendor ids), which callers compare ``GPU.vendor_id`` with."""
from __future__ import annotations

__all__ = ["AMD", "NVIDIA", "INTEL", "APPLE", "CONTACT_LINK"]

AMD = "1002"
NVIDIA = "10de"
INTEL = "8086"
APPLE = "106b"
CONTACT_LINK = "https://github.com/easydiffusion/torchruntime"  # kept: callers print it in their messages
