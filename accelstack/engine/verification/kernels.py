"""Which of a model file's weight kernels a family probe ran (``verify --model``).

A probe proves the family's graph on this device, but only with its own weight types: the probes are
stored F8_E5M2, which stable-diffusion.cpp widens to F16 as it loads them (src/model.cpp
``load_tensors``: F8_E4M3 and F8_E5M2 to F16, F64 to F32; every other type loads as stored), and the
Z-Image probe's matrices are Q4_0. A user's Q4_K or Q8_0 file multiplies with other kernels, which the
probe never ran: the verdict names them instead of claiming "this family's kernels".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

from ..probes.families import ModelFamily, family_spec

__all__ = ["KernelCoverage", "kernel_type", "probe_kernel_types", "kernel_coverage"]

WIDENED = {"F8_E4M3": "F16", "F8_E5M2": "F16", "F64": "F32"}  # src/model.cpp load_tensors
PROBE_STORED = "F8_E5M2"  # accelstack.engine.probes.model DTYPE
QUANTIZED_PROBE = ("Q4_0", "F16")  # the GGUF probe's matrices and the rest (accelstack.engine.probes.gguf)


def kernel_type(dtype: str) -> str:
    """The type a weight stored as ``dtype`` computes with once stable-diffusion.cpp has loaded it."""
    return WIDENED.get(dtype, dtype)


def probe_kernel_types(probe: str) -> List[str]:
    """The weight types family ``probe``'s probe computes with."""
    return list(QUANTIZED_PROBE) if family_spec(probe).quantized else [kernel_type(PROBE_STORED)]


@dataclass
class KernelCoverage:
    """A model file's weight types as they load, split into those its family's probe ran and those it did not."""

    file_types: List[str] = field(default_factory=list)  # the file's, as they load, most parameters first
    probe_types: List[str] = field(default_factory=list)
    ran: List[str] = field(default_factory=list)
    not_run: List[str] = field(default_factory=list)
    statement: str = ""


def kernel_coverage(model: ModelFamily) -> KernelCoverage:
    """What ``verify --model`` proved for ``model``: the probe's graph, and which of the file's weight kernels."""
    loaded = list(dict.fromkeys(kernel_type(t) for t in model.weight_types))
    probe = probe_kernel_types(model.probe)
    ran = [t for t in loaded if t in probe]
    not_run = [t for t in loaded if t not in probe]
    stored = ", ".join(model.weight_types) or "none read"
    head = (f"the runtime ran the {model.probe} family's graph with a reduced probe of random "
            f"{'/'.join(probe)} weights; the file itself was inspected, not loaded")
    if not_run:
        tail = (f"its {', '.join(not_run)} weights were not run (the file stores {stored}; the probe ran "
                + (", ".join(ran) if ran else "none of its weight types") + "): `accelstack generate` with the "
                "file runs those kernels")
    else:
        tail = f"the probe ran every weight type this file loads as ({', '.join(loaded)})"
    return KernelCoverage(loaded, probe, ran, not_run, f"{head}; {tail}")
