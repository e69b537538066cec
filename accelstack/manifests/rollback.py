"""Rollback protection: the highest manifest version seen per source, never to go down.

An attacker who can serve files (a compromised mirror, a captive portal) could otherwise replay
an old, validly signed manifest that lists builds with known bugs. The state lives per runtime
home (``Settings.rollback_state``), so ``install`` and ``manifest verify --record`` share it.
Only :class:`~accelstack.manifests.trust.TrustedManifests` decides when a version is recorded.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Dict, Optional, Union

from ..fsio import write_bytes
from ..limits import MAX_SIGNATURE_BYTES, MalformedInput, parse_json
from .errors import ManifestError, ManifestRollbackError, ManifestStateError

__all__ = ["STATE_FORMAT", "RollbackStore"]

STATE_FORMAT = "accelstack-manifest-versions"


class RollbackStore:
    """The highest manifest version seen per source, in a small JSON file (atomic writes, locked)."""

    _thread_lock = threading.Lock()

    def __init__(self, path: Union[str, Path]) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RollbackStore({str(self.path)!r})"

    def _read(self) -> Dict[str, int]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise ManifestError(f"cannot read manifest version state {self.path} ({exc})") from None
        try:
            doc = parse_json(text, what=f"manifest version state {self.path}", max_bytes=MAX_SIGNATURE_BYTES * 16)
            versions = doc["sources"]
            if doc.get("format") != STATE_FORMAT or not isinstance(versions, dict):
                raise ValueError("unexpected layout")
            out = {}
            for source, entry in versions.items():
                v = entry["version"] if isinstance(entry, dict) else entry
                if isinstance(v, bool) or not isinstance(v, int):
                    raise ValueError(f"version of {source!r} is not an integer")
                out[source] = v
            return out
        except (MalformedInput, ValueError, KeyError, TypeError) as exc:
            # Refusing is safer than silently forgetting what was seen (that would allow a rollback).
            raise ManifestError(
                f"manifest version state {self.path} is corrupt ({exc})",
                "delete the file to start over (rollback protection restarts from the next manifest)",
            ) from None

    def _write(self, versions: Dict[str, int]) -> None:
        doc = {"format": STATE_FORMAT, "sources": {s: {"version": v} for s, v in sorted(versions.items())}}
        write_bytes(self.path, (json.dumps(doc, indent=2) + "\n").encode("utf-8"), mode=0o600, make_parents=True)

    def _lock(self) -> Any:
        # filelock takes ~10 ms to import and only recording a version needs it (plans never do)
        import filelock

        self.path.parent.mkdir(parents=True, exist_ok=True)
        return filelock.FileLock(str(self.path) + ".lock")

    def highest(self, source: str) -> Optional[int]:
        return self._read().get(source)

    def check(self, source: str, version: int, *, record: bool = True) -> None:
        """Refuse ``version`` if lower than the highest seen for ``source``; with ``record``,
        remember it as the highest if it is. Without ``record`` nothing is written, not even a
        lock file (the state is replaced atomically, so reading it needs no lock): a plan or a
        dry run leaves the home as it was."""
        if not record:
            self._refuse_older(source, version, self._read())
            return
        try:
            with self._thread_lock, self._lock():
                versions = self._read()
                self._refuse_older(source, version, versions)
                seen = versions.get(source)
                if seen is None or version > seen:
                    versions[source] = version
                    self._write(versions)
        except OSError as exc:
            raise ManifestStateError(f"cannot record manifest versions in {self.path} ({exc.strerror or exc})",
                                     "the runtime home must be writable; choose another one or fix its permissions") from None

    @staticmethod
    def _refuse_older(source: str, version: int, versions: Dict[str, int]) -> None:
        seen = versions.get(source)
        if seen is not None and version < seen:
            raise ManifestRollbackError(
                f"manifest '{source}' version {version} is older than version {seen} already seen (rollback)",
                "someone may be serving an outdated manifest; get the current one from the publisher",
            )
