"""What to fetch: the one type shared by manifests (which name files) and artifacts (which fetch them).

It lives below every stage so that importing a Plan does not load the HTTP stack.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

__all__ = ["ArtifactRef"]


@dataclass
class ArtifactRef:
    """A file known by content: any of ``urls`` must serve exactly ``size`` bytes hashing to ``sha256``.

    ``urls`` are mirrors, tried in order. ``name`` is the file name it is installed under
    (a wheel's name matters to pip).
    """

    name: str
    sha256: str  # lowercase hex
    size: int
    urls: List[str] = field(default_factory=list)
