"""Manifest documents to typed knowledge: the envelope, then the body of its kind.

    parse_manifest(doc)       an already-decoded document -> GgmlManifest | TorchMatrix
    load_manifest(data)       bytes -> the same (no signature check)
    load_manifest_file(path)  a file the user pointed at; errors name the file

These do not check signatures or rollback: a manifest from anywhere but the user's own disk goes
through :class:`accelstack.manifests.trust.TrustedManifests`, which calls them after its checks.
The envelope is :mod:`~accelstack.manifests.envelope`, the ggml body
:mod:`~accelstack.manifests.ggml_manifest`, the torch body :mod:`~accelstack.manifests.torch_matrix`.
"""
from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Union

from ..errors import Action
from ..limits import MAX_JSON_BYTES
from .envelope import Envelope, check_envelope
from .errors import ManifestError, ManifestFormatError
from .fields import check_id, decode, join, read_document
from .ggml_manifest import GGML_BACKENDS, GgmlManifest, GgmlTarget, parse_ggml_manifest
from .torch_matrix import TorchMatrix, parse_torch_matrix

AnyManifest = Union[GgmlManifest, TorchMatrix]

__all__ = ["AnyManifest", "BODIES", "GGML_BACKENDS", "GgmlManifest", "GgmlTarget", "TorchMatrix",
           "load_manifest", "load_manifest_file", "parse_body", "parse_manifest"]


def parse_manifest(doc: Any, *, now: Optional[datetime] = None, check_expiry: bool = True) -> AnyManifest:
    """Check the envelope and body of an already-decoded manifest; return its typed form."""
    return parse_body(doc, check_envelope(doc, now=now, check_expiry=check_expiry))


def _parse_torch(doc: dict, envelope: Envelope) -> TorchMatrix:
    matrix = parse_torch_matrix(doc, envelope)
    _check_variant_names(doc)
    return matrix


#: The body parser of each manifest kind (``check_envelope`` has refused any other kind).
BODIES: Dict[str, Callable[[dict, Envelope], AnyManifest]] = {"ggml": parse_ggml_manifest, "torch": _parse_torch}


def parse_body(doc: dict, envelope: Envelope) -> AnyManifest:
    """The body of a document whose ``envelope`` was checked, parsed as its kind says."""
    return BODIES[envelope.kind](doc, envelope)


def _check_variant_names(doc: dict) -> None:
    """Torch variant names become index URLs and directory names: ids, checked like target ids.

    Runs after the matrix parsed, so every ``releases[i].variants[j].name`` is a string."""
    for i, release in enumerate(doc["releases"]):
        for j, variant in enumerate(release["variants"]):
            check_id(variant["name"], join(join(join(join("releases", i), "variants"), j), "name"), "variant name")


def load_manifest(data: Union[bytes, str], *, now: Optional[datetime] = None, check_expiry: bool = True) -> AnyManifest:
    """Parse and check manifest bytes (no signature check: see ``TrustedManifests``)."""
    return parse_manifest(decode(data), now=now, check_expiry=check_expiry)


def load_manifest_file(path: Union[str, Path], *, now: Optional[datetime] = None, check_expiry: bool = True) -> AnyManifest:
    """A manifest file the user pointed at; errors say which file."""
    p = Path(path)
    try:
        data = read_document(p, MAX_JSON_BYTES)
    except OSError as exc:
        raise ManifestError(f"cannot read manifest {p} ({exc.strerror or exc})", "check the path",
                            action=Action.FIX_INPUT, exit_code=2) from None
    try:
        return load_manifest(data, now=now, check_expiry=check_expiry)
    except ManifestFormatError as exc:
        exc.message = f"{p}: {exc.message}"
        exc.args = (exc.message,)
        raise
