"""What the home records on disk: receipts and the ``active`` pointer, and how a receipt reads.

A receipt is everything needed to check, repair and explain one installed runtime. Paths in it
are relative to the home (a copied or moved home keeps working); a torch receipt's ``path`` is
the target interpreter, which lives outside the home and stays absolute.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from ..domain import Stack
from ..manifests.plan import Plan
from ..refs import ArtifactRef
from ..serde import from_dict, to_dict
from ..verdict import VerifyReport

__all__ = ["RECEIPT_FORMAT", "InstalledFile", "Receipt", "Active", "now_iso", "dump_receipt", "load_receipt",
           "stamp_files"]

RECEIPT_FORMAT = 2  # 2: typed plan/artifacts/verification, ggml paths relative to the home


@dataclass
class InstalledFile:
    """One installed file and, as the verified-blob cache keeps them, its mtime and inode when it
    was last hashed: ``status`` compares those instead of re-hashing (0: not recorded, a receipt
    written before they were; ``repair`` records them)."""

    path: str  # relative to the runtime directory, '/'-separated
    sha256: str
    size: int
    mtime_ns: int = 0
    inode: int = 0

    def stamp(self, st: os.stat_result) -> None:
        """Record the stat of the file just hashed to ``sha256`` (not if its size says it changed since)."""
        if st.st_size == self.size:
            self.mtime_ns, self.inode = st.st_mtime_ns, st.st_ino

    def stat_matches(self, st: os.stat_result) -> Optional[bool]:
        """Whether ``st`` is the file as hashed (size, mtime, inode); None when none were recorded."""
        if st.st_size != self.size:
            return False
        if not self.mtime_ns and not self.inode:
            return None
        return st.st_mtime_ns == self.mtime_ns and st.st_ino == self.inode


@dataclass
class Receipt:
    """One installed runtime: where it is, what it came from, what it contains, how it was verified."""

    __derived__ = ("origin",)

    id: str
    stack: Stack
    backend: str
    path: str  # ggml: the runtime directory relative to the home; torch: the target interpreter
    plan: Plan
    manifest_source: str = ""
    manifest_version: int = 0
    artifacts: List[ArtifactRef] = field(default_factory=list)
    files: List[InstalledFile] = field(default_factory=list)
    hardware_fingerprint: str = ""
    env: Dict[str, str] = field(default_factory=dict)  # to set when launching it
    installed_at: str = ""
    verified_at: str = ""
    verification: VerifyReport = field(default_factory=lambda: VerifyReport(ok=False, reason="not verified", runtime="", backend=""))
    format_version: int = RECEIPT_FORMAT
    channel: str = ""  # the channel its manifest was read from; "" for a --manifest URL, a bundle or a local build
    manifest_url: str = ""  # where the manifest was read
    package: str = ""  # the distribution installed, with its version: what a bug report needs
    package_version: str = ""
    # the latest check of other model families (verify --family): beside the runtime's own, never in its place
    families: List[str] = field(default_factory=list)
    families_verified_at: str = ""
    families_ok: Optional[bool] = None

    @property
    def origin(self) -> str:
        """Where it came from, in words: "channel stable, manifest my-channel v2, stable-diffusion-cpp-python 0.4.7";
        a manifest named by URL alone shows its URL instead of a channel name."""
        if self.manifest_source == "local-build":
            parts = ["built locally from source"]
        else:
            parts = [f"channel {self.channel}"] if self.channel else []
            if self.manifest_source:
                parts.append(f"manifest {self.manifest_source} v{self.manifest_version}"
                             + (f" ({self.manifest_url})" if self.manifest_url and not self.channel else ""))
        if self.package:
            parts.append(f"{self.package} {self.package_version}".strip())
        return ", ".join(parts) or "unknown (installed before accelstack recorded it)"


@dataclass
class Active:
    """What is active per stack, and what was before (for rollback)."""

    active: Dict[str, str] = field(default_factory=dict)  # stack -> runtime id
    previous: Dict[str, str] = field(default_factory=dict)
    changed_at: str = ""


def stamp_files(root: Path, files: List[InstalledFile]) -> List[InstalledFile]:
    """Record each file's stat under ``root`` right after it was hashed (a file that went away
    keeps no stamp: the check that finds it missing says so)."""
    for f in files:
        try:
            f.stamp(os.stat(root / f.path))
        except OSError:
            pass
    return files


def now_iso() -> str:
    """UTC with microseconds: receipts installed in the same second still sort in install order."""
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


def dump_receipt(receipt: Receipt) -> str:
    return json.dumps(to_dict(receipt), indent=2)


def load_receipt(text: str, where: str) -> Receipt:
    data = json.loads(text)
    if isinstance(data, dict) and data.get("format_version", 1) < 2:
        data = _upgrade_v1(data)
    return from_dict(Receipt, data, where)


def _upgrade_v1(data: dict) -> dict:
    """Format 1 kept the verification as a free dict; its ``ok`` and reason carry over."""
    ver = data.get("verification")
    if isinstance(ver, dict) and "runtime" not in ver:
        data["verification"] = {"ok": bool(ver.get("ok")), "reason": str(ver.get("reason", "")), "runtime": str(data.get("path", "")),
                                "backend": str(data.get("backend", "")), "check": str(ver.get("check", "verify"))}
    return data
