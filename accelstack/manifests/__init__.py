"""Manifests: the knowledge of which build runs where, kept as data, and the resolver over it.

    from accelstack.manifests import Manifests, Request, resolve
    plan = resolve(report, Request(stack="torch", requirements=["torch<2.7"]), Manifests.builtin())
    plan.chosen, plan.commands, plan.env, [c.reason for c in plan.rejected]

A ggml manifest from a publisher is checked by :class:`TrustedManifests` (signature, envelope,
expiry, rollback) before it joins ``Manifests``; see ``docs/resolve.md``.
"""
from __future__ import annotations

from .errors import ExpiredManifestFormatError
from .ggml_manifest import GgmlManifest, GgmlTarget
from .knowledge import Manifests
from .plan import BuildSpec, Candidate, Command, Plan, Request
from .resolve import resolve
from .schema import load_manifest, load_manifest_file, parse_manifest
from .torch_matrix import TorchMatrix, builtin_torch_matrix
from .trust import TrustedManifests, VerifiedManifest

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
    "TrustedManifests",
    "VerifiedManifest",
    "builtin_torch_matrix",
    "load_manifest",
    "load_manifest_file",
    "parse_manifest",
    "resolve",
]
