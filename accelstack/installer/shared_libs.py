"""The shared CUDA library folders as a receipt names them (``<home>/shared/cuda/<sha256>/``), read only.

Apart from :mod:`.cuda_libs` (which unpacks and links them, with the wheel installer and version
parsing) so that `accelstack status`, which only checks them, loads neither.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import List, Optional

from ..refs import ArtifactRef
from .home import Home, read_state
from .records import InstalledFile, Receipt

__all__ = ["SHARED", "CONTENTS", "shared_root", "shared_files", "shared_refs"]

SHARED = ("shared", "cuda")  # <home>/shared/cuda/<sha256 of the wheel>/
CONTENTS = "contents.json"  # in a shared directory: what was unpacked, for the reuse check
_SHA = re.compile(r"^[0-9a-f]{64}\Z")
_WHEEL = re.compile(r"^(?P<dist>[A-Za-z0-9][A-Za-z0-9._]*)-(?P<version>[0-9][A-Za-z0-9.+!_]*)(-[0-9][^-]*)?-[^-]+-[^-]+-[^-]+\.whl\Z")


def shared_root(home: Home) -> Path:
    return home.root.joinpath(*SHARED)


def shared_files(d: Path, ref: ArtifactRef) -> Optional[List[InstalledFile]]:
    """What ``d``'s contents record says was unpacked from ``ref`` (hash, size, mtime, inode per
    file, as a receipt keeps its runtime's); None when the record is missing, unreadable or names
    another wheel. A record older than the stamps has sizes only."""
    try:
        data = json.loads(read_state(d / CONTENTS))
        if data.get("sha256") != ref.sha256:
            return None
        return [InstalledFile(path=str(f["path"]), sha256=str(f.get("sha256", "")), size=int(f["size"]),
                              mtime_ns=int(f.get("mtime_ns", 0)), inode=int(f.get("inode", 0))) for f in data["files"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def shared_refs(receipt: Receipt) -> List[ArtifactRef]:
    """The library wheels a receipt names as unpacked into ``shared/cuda`` (those it lists beside
    the plan's own artifacts: the runtime's wheel)."""
    own = {a.sha256 for a in receipt.plan.artifacts}
    return [a for a in receipt.artifacts if a.sha256 not in own and _SHA.match(a.sha256) and _WHEEL.match(a.name)]
