"""The enumerated values of the domain, as ``Literal`` types.

They stay plain strings in every JSON document (reports, plans, receipts, events are read by apps
and old versions), while ``mypy`` checks every place that writes one. Where code needs the values
at run time (validation, ``--help`` texts), a tuple is derived from the ``Literal``, so each set of
values is written once.
"""
from __future__ import annotations

from typing import Literal, Tuple, get_args

__all__ = ["Stack", "STACKS", "Vendor", "GpuKind", "GPU_KINDS", "ApiName", "Backend", "BACKENDS", "Severity",
           "SEVERITIES", "PlanStatus", "EventKind", "Verdict", "RUNTIME_LIBS_NOTE", "RUNTIME_LIBS_NOTE_FORMAT"]

Stack = Literal["ggml", "torch"]
STACKS: Tuple[Stack, ...] = get_args(Stack)

Vendor = Literal["nvidia", "amd", "intel", "apple", "other"]

GpuKind = Literal["discrete", "integrated", "unknown"]
GPU_KINDS: Tuple[GpuKind, ...] = get_args(GpuKind)

ApiName = Literal["cuda", "rocm", "vulkan", "metal", "directml", "xpu", "cpu"]

# torch: cuda rocm xpu mps directml cpu; ggml: cpu cpu-noavx2 cuda vulkan rocm metal sycl
Backend = Literal["cuda", "rocm", "xpu", "mps", "directml", "cpu", "cpu-noavx2", "vulkan", "metal", "sycl"]
BACKENDS: Tuple[Backend, ...] = get_args(Backend)

Severity = Literal["error", "warning", "info"]
SEVERITIES: Tuple[Severity, ...] = get_args(Severity)

PlanStatus = Literal["ready", "needs-build", "unsatisfiable"]

EventKind = Literal["start", "advance", "end", "message"]

Verdict = Literal["PASS", "FAIL"]


# The note a runtime directory keeps of its outside libraries (a CUDA build's shared cudart and
# cuBLAS): written by the installer (accelstack.installer.cuda_libs), read by the engine when it
# starts a worker (accelstack.engine.runtime). One name and format for both layers.
RUNTIME_LIBS_NOTE = ".accelstack-libs.json"
RUNTIME_LIBS_NOTE_FORMAT = 1
