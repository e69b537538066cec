"""Manifests: the knowledge of which build runs where, kept as data, and the resolver over it.

    from accelstack.manifests import Manifests, Request, resolve
    plan = resolve(report, Request(stack="torch", requirements=["torch<2.7"]), Manifests.builtin())
    plan.chosen, plan.commands, plan.env, [c.reason for c in plan.rejected]
"""
from __future__ import annotations

from .plan import BuildSpec, Candidate, Command, Plan, Request
from .resolve import Manifests, resolve
from .schema import (
    ExpiredManifestFormatError,
    GgmlManifest,
    GgmlTarget,
    load_manifest,
    load_manifest_file,
    load_verified,
    parse_manifest,
)
from .torch_matrix import TorchMatrix, builtin_torch_matrix

__all__ = [
    "BuildSpec",
    "Candidate",
    "Command",
    "ExpiredManifestFormatError",
    "GgmlManifest",
    "GgmlTarget",
    "Manifests",
    "Plan",
    "Request",
    "TorchMatrix",
    "builtin_torch_matrix",
    "load_manifest",
    "load_manifest_file",
    "load_verified",
    "parse_manifest",
    "resolve",
]
