"""Manifests: the knowledge of which build runs where, kept as data, and the resolver over it.

    from accelstack.manifests import Manifests, Request, resolve
    plan = resolve(report, Request(stack="torch", requirements=["torch<2.7"]), Manifests.builtin())
    plan.chosen, plan.commands, plan.env, [c.reason for c in plan.rejected]

A ggml manifest from a publisher is checked by :class:`TrustedManifests` (signature, envelope,
expiry, rollback) before it joins ``Manifests``; see ``docs/resolve.md``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:  # the names, for type checkers; at run time each loads on first use
    from .errors import ExpiredManifestFormatError
    from .ggml_manifest import GgmlManifest, GgmlTarget
    from .knowledge import Manifests
    from .plan import BuildSpec, Candidate, Command, Plan, Request
    from .resolver import resolve
    from .schema import load_manifest, load_manifest_file, parse_manifest
    from .torch_matrix import TorchMatrix, builtin_torch_matrix
    from .trust import TrustedManifests, VerifiedManifest

# Loaded on first use: a receipt's plan (`.plan`) is read on every `accelstack generate`, which must not
# pay for the resolver, the torch matrix and packaging (~25 ms; tests/engine/request/test_generate_imports.py).
_EXPORTS = {
    "ExpiredManifestFormatError": ".errors", "GgmlManifest": ".ggml_manifest", "GgmlTarget": ".ggml_manifest",
    "Manifests": ".knowledge", "BuildSpec": ".plan", "Candidate": ".plan", "Command": ".plan", "Plan": ".plan",
    "Request": ".plan", "resolve": ".resolver", "load_manifest": ".schema", "load_manifest_file": ".schema",
    "parse_manifest": ".schema", "TorchMatrix": ".torch_matrix", "builtin_torch_matrix": ".torch_matrix",
    "TrustedManifests": ".trust", "VerifiedManifest": ".trust",
}

__all__ = [
    "BuildSpec", "Candidate", "Command", "ExpiredManifestFormatError", "GgmlManifest", "GgmlTarget", "Manifests", "Plan",
    "Request", "TorchMatrix", "TrustedManifests", "VerifiedManifest", "builtin_torch_matrix", "load_manifest",
    "load_manifest_file", "parse_manifest", "resolve",
]

if not TYPE_CHECKING:  # a type checker sees the names above, and no others
    __getattr__ = lazy_exports(__name__, _EXPORTS, globals())


def __dir__() -> list:
    return sorted(set(globals()) | set(_EXPORTS))
