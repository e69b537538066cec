"""The resolver's input (``Request``) and output (``Plan``): plain data that round-trips through JSON.

A Plan is the whole decision, explainable to a person and to a program: every candidate that was
considered, in preference order, accepted or rejected with the reason a person can act on; the
chosen one turned into concrete actions (pip/uv commands for torch, artifacts for ggml) and the
environment to set when the runtime starts.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ..domain import Backend, PlanStatus, Stack
from ..refs import ArtifactRef

__all__ = ["PLAN_FORMAT", "PYTHON_PLACEHOLDER", "STACKS", "BuildSpec", "Candidate", "Command", "Plan", "Request",
           "merge_identical_rejections"]

PLAN_FORMAT = 1
STACKS: Tuple[Stack, ...] = ("torch", "ggml")  # the order --help and error messages list them in
PYTHON_PLACEHOLDER = "{python}"  # commands name the target environment's interpreter this way


@dataclass
class Request:
    """What the caller wants.

    ``requirements`` are PEP 508 strings (``torch==2.6.*``, ``torchvision<0.22``) that narrow the
    choice; ``backend`` forces a backend (``cuda``, ``vulkan``) or a variant (``cu126``); ``python``
    is the target environment's version ("3.11"; empty: the one in the hardware report).
    ``cuda_driver`` is the NVIDIA driver policy: empty or ``minor-version`` (NVIDIA's rule: a CUDA
    12.x build runs on any R525+ driver when it has native code for the GPU), or ``strict`` (every
    build needs the driver of its full toolkit version, for those who want no reliance on it).
    ``engine`` false: torch alone, for an app that runs its own code on it.
    """

    stack: Stack = "torch"
    requirements: List[str] = field(default_factory=list)
    backend: str = ""
    python: str = ""
    cuda_driver: str = ""
    engine: bool = True  # torch: with the generation engine's packages (diffusers, transformers...)


@dataclass
class Candidate:
    """One build considered for this machine.

    ``code`` lets programs match on why: ``chosen``, ``accepted`` (works, ranks lower), and for
    rejections ``forced-backend``, ``platform``, ``api``, ``device``, ``kernels``, ``driver``,
    ``os-version``, ``glibc``, ``python``, ``requirement``, ``cpu-features``, ``no-artifact``.
    """

    name: str  # "cu128", "rocm6.4", "cpu", a ggml target id
    backend: Backend
    accepted: bool
    reason: str
    code: str = ""
    gpus: List[int] = field(default_factory=list)  # the GPUs it would run on (report indexes)
    torch_version: str = ""  # the torch release line it would install, "2.14"
    chosen: bool = False


@dataclass
class Command:
    """A command to run, as an argv list; ``{python}`` stands for the target interpreter."""

    tool: str  # "pip" | "uv"
    argv: List[str]
    why: str = ""

    def render(self, python: str = "python") -> str:
        return " ".join(shlex.quote(a.replace(PYTHON_PLACEHOLDER, python)) for a in self.argv)


@dataclass
class BuildSpec:
    """What a ggml build for this machine needs when no published artifact fits (or a better one could)."""

    backend: Backend
    os: str
    arch: str
    gpus: List[int] = field(default_factory=list)
    properties: Dict[str, str] = field(default_factory=dict)  # "sm": "12.0", "gfx": "gfx1103", "cpu_features": ...
    reason: str = ""
    # what a local build makes, decided by the resolver (manifests.build_targets): the publisher variant
    # ("cuda12", "cpu-noavx2", else the backend) and the GPU architectures it compiles (CUDA's "86", ROCm's
    # "gfx1100"; none for a CUDA GPU of unknown compute capability: every one of the variant)
    variant: str = ""
    archs: List[str] = field(default_factory=list)


@dataclass
class Plan:
    """The decision.

    ``status``: ``ready`` (something to install was chosen: commands or artifacts),
    ``needs-build`` (ggml: no published artifact fits; ``build`` says what a local build needs),
    ``unsatisfiable`` (nothing runs here as requested; the candidates say why).
    ``ok`` (derived, and written to JSON) is ``ready`` with nothing in ``conflicts``.
    """

    __derived__ = ("ok",)

    stack: Stack
    summary: str  # the decision in one sentence
    status: PlanStatus = "ready"
    request: Request = field(default_factory=Request)
    backend: str = ""
    variant: str = ""
    gpus: List[int] = field(default_factory=list)
    device_reason: str = ""  # why this device (when the machine has a choice)
    torch_version: str = ""  # release line, "2.14"
    packages: List[str] = field(default_factory=list)  # requirement strings installed
    index_url: str = ""  # "" -> PyPI
    commands: List[Command] = field(default_factory=list)  # pip, run in order
    uv_commands: List[Command] = field(default_factory=list)  # the same steps with uv, for those who use it
    optional_packages: List[str] = field(default_factory=list)  # offered, not installed (triton-windows)
    artifacts: List[ArtifactRef] = field(default_factory=list)
    cuda_libs: List[ArtifactRef] = field(default_factory=list)  # ggml cuda: NVIDIA runtime wheels shared in the home
    env: Dict[str, str] = field(default_factory=dict)  # set at launch
    build: Optional[BuildSpec] = None
    candidates: List[Candidate] = field(default_factory=list)
    conflicts: List[str] = field(default_factory=list)  # parts of the request that could not be met, with what would work
    notes: List[str] = field(default_factory=list)
    manifests: List[str] = field(default_factory=list)  # which data decided: "torch manifest 'builtin' version 1"
    format_version: int = PLAN_FORMAT

    @property
    def ok(self) -> bool:
        return self.status == "ready" and not self.conflicts

    @property
    def chosen(self) -> Optional[Candidate]:
        for c in self.candidates:
            if c.chosen:
                return c
        return None

    @property
    def rejected(self) -> List[Candidate]:
        return [c for c in self.candidates if not c.accepted]


_GPU_LABEL = re.compile(r"\bGPUs? \d+(?:[-,]\d+)*(?: \d+x)? ")


def _gpus_text(indexes: List[int]) -> str:
    if len(indexes) == 1:
        return f"GPU {indexes[0]} "
    span = f"{indexes[0]}-{indexes[-1]}" if indexes == list(range(indexes[0], indexes[-1] + 1)) else ",".join(map(str, indexes))
    return f"GPUs {span} {len(indexes)}x "


def merge_identical_rejections(candidates: List[Candidate]) -> List[Candidate]:
    """One rejection per problem: the same build rejected for the same reason on GPUs that differ only in
    their numbers (identical cards the grouping kept apart) is reported once, with the GPU list."""
    out: List[Candidate] = []
    first: Dict[Tuple[str, str, str], Candidate] = {}
    merged: List[Candidate] = []
    for c in candidates:
        if c.accepted or not c.gpus:
            out.append(c)
            continue
        key = (c.name, c.code, _GPU_LABEL.sub("\x00", c.reason))
        seen = first.get(key)
        if seen is None:
            first[key] = c
            out.append(c)
            continue
        seen.gpus = sorted(set(seen.gpus) | set(c.gpus))
        if seen not in merged:
            merged.append(seen)
    for c in merged:
        label = _gpus_text(c.gpus)
        c.reason = _GPU_LABEL.sub(label, c.reason)  # the label holds no backslash or group reference
    return out
