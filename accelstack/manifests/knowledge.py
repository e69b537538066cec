"""``Manifests``: the knowledge one resolution uses, the torch matrix and the ggml variant manifests."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import List, Optional, Union

from .ggml_manifest import GGML_BACKENDS, GgmlManifest
from .torch_matrix import TORCH_BACKENDS, TorchMatrix, builtin_torch_matrix

__all__ = ["Manifests", "ANY_BACKEND"]

ANY_BACKEND = frozenset(TORCH_BACKENDS) | frozenset(GGML_BACKENDS)  # a backend of some stack: not a typo
_BACKENDS = {"torch": TORCH_BACKENDS, "ggml": GGML_BACKENDS}  # each stack's own backends, by its envelope kind


@dataclass
class Manifests:
    """The knowledge a resolution uses: the torch matrix and any ggml variant manifests."""

    torch: Optional[TorchMatrix] = None
    ggml: List[GgmlManifest] = field(default_factory=list)

    @classmethod
    def builtin(cls, now: Optional[datetime] = None) -> Manifests:
        """The data shipped with accelstack (the torch matrix; ggml manifests come from publishers)."""
        return cls(torch=builtin_torch_matrix(now))

    def add(self, manifest: object) -> None:
        if isinstance(manifest, TorchMatrix):
            self.torch = manifest
        elif isinstance(manifest, GgmlManifest):
            self.ggml.append(manifest)
        else:
            raise TypeError(f"not a parsed manifest: {type(manifest).__name__}")

    def documents(self) -> List[Union[TorchMatrix, GgmlManifest]]:
        """Every manifest held, the torch matrix first."""
        return ([self.torch] if self.torch else []) + list(self.ggml)

    def backend_choices(self, stack: str) -> List[str]:
        """What a request for ``stack`` may force: its backends, then the variants (torch) or
        target ids (ggml) of the manifests held."""
        names: List[str] = list(_BACKENDS.get(stack, ()))
        for m in self.documents():
            if m.envelope.kind == stack:
                names += sorted({v.name for r in m.releases for v in r.variants} if isinstance(m, TorchMatrix)
                                else {t.id for t in m.targets})
        return names

    def labels(self, stack: str) -> List[str]:
        """The labels of the manifests of ``stack`` (each envelope names its stack: its ``kind``)."""
        return [m.envelope.label for m in self.documents() if m.envelope.kind == stack]
