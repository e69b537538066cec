"""The enumerated values of the domain, as ``Literal`` types.

They stay plain strings in every JSON document (reports, plans, receipts, events are read by apps
and old versions), while ``mypy`` checks every place that writes one. The tuples list the values
at run time, for validation and ``--help`` texts.
"""
from __future__ import annotations

from typing import Literal, Tuple

Stack = Literal["ggml", "torch"]
STACKS: Tuple[Stack, ...] = ("ggml", "torch")

Vendor = Literal["nvidia", "amd", "intel", "apple", "other"]
VENDORS: Tuple[Vendor, ...] = ("nvidia", "amd", "intel", "apple", "other")

GpuKind = Literal["discrete", "integrated", "unknown"]
GPU_KINDS: Tuple[GpuKind, ...] = ("discrete", "integrated", "unknown")

ApiName = Literal["cuda", "rocm", "vulkan", "metal", "directml", "xpu", "cpu"]
API_NAMES: Tuple[ApiName, ...] = ("cuda", "rocm", "vulkan", "metal", "directml", "xpu", "cpu")

# torch: cuda rocm xpu mps directml cpu; ggml: cpu cpu-noavx2 cuda vulkan rocm metal sycl
Backend = Literal["cuda", "rocm", "xpu", "mps", "directml", "cpu", "cpu-noavx2", "vulkan", "metal", "sycl"]
BACKENDS: Tuple[Backend, ...] = ("cuda", "rocm", "xpu", "mps", "directml", "cpu", "cpu-noavx2", "vulkan", "metal", "sycl")

Severity = Literal["error", "warning", "info"]
SEVERITIES: Tuple[Severity, ...] = ("error", "warning", "info")

PlanStatus = Literal["ready", "needs-build", "unsatisfiable"]
PLAN_STATUSES: Tuple[PlanStatus, ...] = ("ready", "needs-build", "unsatisfiable")

EventKind = Literal["start", "advance", "end", "message"]
EVENT_KINDS: Tuple[EventKind, ...] = ("start", "advance", "end", "message")

Verdict = Literal["PASS", "FAIL"]
