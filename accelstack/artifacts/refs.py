"""Re-export of :class:`accelstack.refs.ArtifactRef` for older imports; new code imports ``accelstack.refs``."""
from __future__ import annotations

from ..refs import ArtifactRef

__all__ = ["ArtifactRef"]
