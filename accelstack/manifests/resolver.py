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

from typing import Callable, Dict

from ..hardware.report import HardwareReport
from .ggml_resolve import resolve_ggml
from .knowledge import Manifests
from .machine import Machine, machine_of
from .plan import Plan, Request
from .request import Requirements, check_request
from .torch_resolve import resolve_torch

__all__ = ["Manifests", "RESOLVERS", "resolve"]

Resolver = Callable[[Machine, Request, Requirements, Manifests], Plan]
#: The resolver of each stack (``check_request`` has refused any other).
RESOLVERS: Dict[str, Resolver] = {
    "torch": lambda machine, request, reqs, manifests: resolve_torch(machine, request, reqs, manifests.torch),
    "ggml": resolve_ggml,
}


def resolve(report: HardwareReport, request: Request, manifests: Manifests) -> Plan:
    """The plan for installing ``request.stack`` on the machine ``report`` describes."""
    reqs = check_request(request)
    machine = machine_of(report, request.python)
    plan = RESOLVERS[request.stack](machine, request, reqs, manifests)
    plan.manifests = manifests.labels(request.stack)
    return plan
