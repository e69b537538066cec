"""``Manifests``: the knowledge one resolution uses, the torch matrix and the ggml variant manifests."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import List, Optional

from .ggml_manifest import GgmlManifest
from .torch_matrix import TorchMatrix, builtin_torch_matrix


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

    def labels(self, stack: str) -> List[str]:
        if stack == "torch":
            return [self.torch.envelope.label] if self.torch else []
        return [m.envelope.label for m in self.ggml]
