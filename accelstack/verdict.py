"""``VerifyReport``: the one answer to "does this runtime work here", for ggml and torch alike.

It lives below every stage because three of them meet on it: the engine produces it, the
installer stores it in each receipt (a runtime is activated only with a PASS), and the core
returns it from ``verify``. Plain data that round-trips through JSON.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .domain import Verdict

__all__ = ["DeviceInfo", "VerifyCheck", "PixelStats", "VerifyReport"]


@dataclass
class DeviceInfo:
    """The compute device the runtime uses, as the runtime itself reports it."""

    name: str = ""
    description: str = ""
    kind: str = ""  # cpu, gpu, igpu, accel
    memory_total: Optional[int] = None
    memory_free: Optional[int] = None


@dataclass
class VerifyCheck:
    name: str
    ok: bool
    detail: str = ""


@dataclass
class PixelStats:
    distinct: int
    mean: float
    saturated: float  # fraction of pixels whose channels are all 0 or all 255


@dataclass
class VerifyReport:
    """The verdict. ``reason`` is empty on PASS, else what failed, in words.

    ``check`` names what was run: ``verify`` (a real generation), ``torch`` (torch operations
    and a diffusers step in the target interpreter), ``import`` (the library loads; the cheap
    check a caller may choose). ``details`` holds what only one kind of check knows.
    """

    ok: bool
    reason: str
    runtime: str
    backend: str
    check: str = "verify"
    device: Optional[DeviceInfo] = None
    load_seconds: Optional[float] = None
    step_seconds: Optional[float] = None
    its_per_second: Optional[float] = None
    generate_seconds: Optional[float] = None
    probe_seconds: float = 0.0  # synthesis time (0 when the probe came from the cache)
    probe_path: str = ""
    probe_temporary: bool = False  # the probe was synthesized for this run and is removed after it
    image: str = ""
    total_seconds: float = 0.0
    checks: List[VerifyCheck] = field(default_factory=list)
    pixels: Optional[PixelStats] = None
    cpu_mean_diff: Optional[float] = None
    cpu_max_diff: Optional[int] = None
    log_tail: List[str] = field(default_factory=list)
    details: Dict[str, Any] = field(default_factory=dict)

    __derived__ = ("verdict",)

    @property
    def verdict(self) -> Verdict:
        return "PASS" if self.ok else "FAIL"
