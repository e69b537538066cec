"""Manifests read from files as given (``accelstack plan --manifest FILE``), beside the built-in
knowledge, and the backend names they know. Nothing here checks a signature: a plan made from
such files says so, and an install from a manifest checks it."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence, Union

from ..manifests.knowledge import ANY_BACKEND, Manifests
from ..manifests.schema import load_manifest_file

__all__ = ["ANY_BACKEND", "Manifests", "manifests_with"]


def manifests_with(paths: Sequence[Union[str, Path]]) -> Manifests:
    """The built-in manifests with each file of ``paths`` added (a ggml variant manifest, or a
    torch matrix that replaces the built-in one)."""
    manifests = Manifests.builtin()
    for path in paths:
        manifests.add(load_manifest_file(path))
    return manifests
