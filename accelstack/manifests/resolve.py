"""``resolve(report, request, manifests) -> Plan``: which build to install on this machine, and why.

Pure and deterministic: the same report, request and manifests give the same plan, byte for byte
once serialized; nothing here reads the clock, the environment or the disk (the CLI does that,
e.g. for ``ACCELSTACK_BACKEND``). Unknown or unsupported hardware never raises: it gets the CPU
build, or a plan that says nothing runs here and why. Only a malformed *request* (an unknown
stack, a requirement that is not PEP 508) raises :class:`~accelstack.errors.UsageError`.

The knowledge is in the manifests (``data/torch.json``, ggml variant manifests); this module only
walks it: candidates in preference order (backend tier, then device, then newest build), each
checked against the machine, the first accepted one chosen.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Dict, List, Optional, Sequence, Tuple

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet

from ..detect.report import HardwareReport
from ..errors import UsageError
from .plan import STACKS, Plan, Request
from .schema import GgmlManifest
from .torch_matrix import TorchMatrix, builtin_torch_matrix

TORCH_FAMILY = ("torch", "torchvision", "torchaudio")


@dataclass
class Manifests:
    """The knowledge a resolution uses: the torch matrix and any ggml variant manifests."""

    torch: Optional[TorchMatrix] = None
    ggml: List[GgmlManifest] = field(default_factory=list)

    @classmethod
    def builtin(cls, now: Optional[datetime] = None) -> "Manifests":
        """The data shipped with accelstack (the torch matrix; ggml manifests come from publishers)."""
        return cls(torch=builtin_torch_matrix(now))

    def add(self, manifest: object) -> None:
        if isinstance(manifest, TorchMatrix):
            self.torch = manifest
        elif isinstance(manifest, GgmlManifest):
            self.ggml.append(manifest)
        else:
            raise TypeError(f"not a parsed manifest: {type(manifest).__name__}")

    def labels(self, stack: str) -> List[str]:
        if stack == "torch":
            return [self.torch.envelope.label] if self.torch else []
        return [m.envelope.label for m in self.ggml]


@dataclass
class Requirements:
    """The user's requirements, split into what narrows the torch choice and what is passed through."""

    specs: Dict[str, SpecifierSet] = field(default_factory=dict)  # torch family name -> specifier
    texts: Dict[str, str] = field(default_factory=dict)  # name -> the requirement as the user wrote it
    others: List[str] = field(default_factory=list)  # other packages, installed from PyPI as given


def parse_requirements(texts: Sequence[str]) -> Requirements:
    out = Requirements()
    for text in texts:
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            raise UsageError(f"requirement {text!r} is not valid ({exc})", "write it like torch==2.6.* or 'torchvision<0.22'") from None
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        if name in TORCH_FAMILY and not req.url:
            prev = out.specs.get(name)
            out.specs[name] = req.specifier if prev is None else prev & req.specifier
            out.texts[name] = text if name not in out.texts else f"{out.texts[name]}, {text}"
        else:
            out.others.append(text)
    return out


def check_request(request: Request) -> Requirements:
    if request.stack not in STACKS:
        raise UsageError(f"unknown stack {request.stack!r}", f"use one of: {', '.join(STACKS)}")
    if request.python and not re.match(r"^\d+\.\d+(\.\d+)?$", request.python.strip()):
        raise UsageError(f"--python {request.python!r} is not a Python version", "write it like 3.11")
    return parse_requirements(request.requirements)


def resolve(report: HardwareReport, request: Request, manifests: Manifests) -> Plan:
    """The plan for installing ``request.stack`` on the machine ``report`` describes."""
    reqs = check_request(request)
    from .machine import machine_of

    machine = machine_of(report, request.python)
    if request.stack == "torch":
        from .torch_resolve import resolve_torch

        plan = resolve_torch(machine, request, reqs, manifests.torch)
    else:
        from .ggml_resolve import resolve_ggml

        plan = resolve_ggml(machine, request, reqs, manifests)
    plan.manifests = manifests.labels(request.stack)
    return plan


# -- helpers shared by the stacks ------------------------------------------------------------
def format_range(lines: Sequence[str], universe: Sequence[str]) -> str:
    """Release lines as compact text: ["2.7", "2.8", "2.9"] -> "2.7–2.9" (runs within ``universe``)."""
    pos = {line: i for i, line in enumerate(universe)}
    items = sorted(set(lines), key=lambda s: pos.get(s, 1 << 30))
    runs: List[List[str]] = []
    for line in items:
        if runs and pos.get(line, -5) == pos.get(runs[-1][-1], -9) + 1:
            runs[-1].append(line)
        else:
            runs.append([line])
    return ", ".join(r[0] if len(r) == 1 else f"{r[0]}\u2013{r[-1]}" for r in runs)


def cuda_kernels_for(cc: str, sm: Sequence[str], ptx: Sequence[str]) -> Optional[str]:
    """How a GPU of compute capability ``cc`` runs a CUDA build, or None when it cannot (cached)."""
    return _kernels(cc, tuple(sm), tuple(ptx))


@functools.lru_cache(maxsize=1024)
def _kernels(cc: str, sm: Tuple[str, ...], ptx: Tuple[str, ...]) -> Optional[str]:
    """How a GPU of compute capability ``cc`` runs a CUDA build, or None when it cannot.

    Device code (SASS) for X.y runs on X.z with z >= y; "X.ya" (arch-specific) code only on X.y;
    PTX for X.y is JIT-compiled on any GPU of compute capability X.y or newer.
    """
    from .machine import cc_parts

    gpu = cc_parts(cc)
    if gpu is None:
        return None
    best: Optional[Tuple[int, int, str]] = None
    for s in sm:
        specific = s.endswith("a")
        parts = cc_parts(s.rstrip("a"))
        if parts is None:
            continue
        ok = parts == gpu if specific else (parts[0] == gpu[0] and parts[1] <= gpu[1])
        if ok and (best is None or parts > best[:2]):
            best = (parts[0], parts[1], f"sm_{parts[0]}{parts[1]}{'a' if specific else ''}")
    if best:
        return best[2]
    for p in sorted(ptx, key=lambda t: cc_parts(t.rstrip("a")) or (0, 0), reverse=True):
        parts = cc_parts(p.rstrip("a"))
        if parts is not None and parts <= gpu:
            return f"compute_{parts[0]}{parts[1]} (PTX, compiled on first use)"
    return None


def visible_devices_env(machine, vendor: str, chosen: List[int], api: str) -> Dict[str, str]:
    """The variables that keep a runtime on ``chosen`` when the vendor has other GPUs too."""
    all_gpus = [g.index for g in machine.vendor_gpus(vendor)]
    if not chosen or set(chosen) >= set(all_gpus):
        return {}
    ordinals = ",".join(map(str, machine.ordinals(vendor, chosen, api)))
    if vendor == "nvidia":
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ordinals}
    if vendor == "amd":
        return {"HIP_VISIBLE_DEVICES": ordinals}
    if vendor == "intel":
        return {"ZE_AFFINITY_MASK": ordinals}
    return {}
