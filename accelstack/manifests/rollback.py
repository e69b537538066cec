"""Rollback protection: the highest manifest version seen, never to go down, per channel and key.

An attacker who can serve files (a compromised mirror, a captive portal) could otherwise replay
an old, validly signed manifest that lists builds with known bugs. The state lives per runtime
home (``Settings.rollback_state``), so ``install`` and ``manifest verify --record`` share it.
Only :class:`~accelstack.manifests.trust.TrustedManifests` decides when a version is recorded.

A channel's state is kept per channel name and per signing key: ``{channel: {keyid: {source,
version}}}``. A manifest of a channel is checked against the entries of the keys that verify that
channel now (its pinned keys, or the global ones), so a key trusted for one channel (or given for
one bundle) can neither raise another channel's watermark nor change the source it expects. The
first trusted manifest of a channel binds it to its ``source``; a manifest of another source is
refused after that (the same publisher's old "beta" manifest served at a mirror). A check with no
channel (``manifest verify``, a library caller's own manifest) uses the per-source table, as
older accelstack did; a channel never reads it (any trusted key could have raised it). A manifest
named by URL alone (``install --manifest URL``) is kept as the channel of its source
(:func:`source_channel`), per key: an older version of it at another address is still a rollback,
and another key's manifest claiming the same source moves nothing of it.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Dict, Iterable, Optional, Tuple, Union

from ..fsio import write_bytes
from ..limits import MAX_SIGNATURE_BYTES, MalformedInput, parse_json, read_capped
from .errors import ManifestError, ManifestRollbackError, ManifestStateError

__all__ = ["STATE_FORMAT", "RollbackStore", "source_channel"]

STATE_FORMAT = "accelstack-manifest-versions"

_Entry = Tuple[str, int]  # (source, version)
_State = Tuple[Dict[str, int], Dict[str, Dict[str, _Entry]]]  # per source; per channel, per key id


def source_channel(source: str) -> str:
    """The state key of manifests named by URL alone, by the source they claim (no channel name
    has a colon)."""
    return f"source:{source}"


def _version(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"version of {what} is not an integer")
    return v


class RollbackStore:
    """The highest manifest version seen per channel and key (and per source for checks without
    a channel), in a small JSON file (atomic writes, locked)."""

    _thread_lock = threading.Lock()

    def __init__(self, path: Union[str, Path]) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RollbackStore({str(self.path)!r})"

    def _read(self) -> _State:
        try:
            text = read_capped(self.path, MAX_SIGNATURE_BYTES * 16 + 1)  # a FIFO is refused, never waited on
        except FileNotFoundError:
            return {}, {}
        except OSError as exc:
            raise ManifestError(f"cannot read manifest version state {self.path} ({exc.strerror or exc})") from None
        try:
            doc = parse_json(text, what=f"manifest version state {self.path}", max_bytes=MAX_SIGNATURE_BYTES * 16)
            versions = doc["sources"]
            channels = doc.get("channels", {})
            if doc.get("format") != STATE_FORMAT or not isinstance(versions, dict) or not isinstance(channels, dict):
                raise ValueError("unexpected layout")
            sources = {}
            for source, entry in versions.items():
                sources[source] = _version(entry["version"] if isinstance(entry, dict) else entry, repr(source))
            per_channel: Dict[str, Dict[str, _Entry]] = {}
            for name, keys in channels.items():
                if not isinstance(keys, dict):
                    raise ValueError(f"channel {name!r} is not an object")
                per_channel[name] = {}
                for keyid, entry in keys.items():
                    if not isinstance(entry, dict) or not isinstance(entry.get("source"), str):
                        raise ValueError(f"channel {name!r}: key {keyid!r} has no source")
                    per_channel[name][keyid] = (entry["source"], _version(entry.get("version"), f"channel {name!r}"))
            return sources, per_channel
        except (MalformedInput, ValueError, KeyError, TypeError) as exc:
            # Refusing is safer than silently forgetting what was seen (that would allow a rollback).
            raise ManifestError(
                f"manifest version state {self.path} is corrupt ({exc})",
                "delete the file to start over (rollback protection restarts from the next manifest)",
            ) from None

    def _write(self, state: _State) -> None:
        sources, channels = state
        doc: Dict[str, Any] = {"format": STATE_FORMAT, "sources": {s: {"version": v} for s, v in sorted(sources.items())}}
        if channels:
            doc["channels"] = {name: {k: {"source": s, "version": v} for k, (s, v) in sorted(keys.items())}
                               for name, keys in sorted(channels.items())}
        write_bytes(self.path, (json.dumps(doc, indent=2) + "\n").encode("utf-8"), mode=0o600, make_parents=True)

    def _lock(self) -> Any:
        # filelock takes ~10 ms to import and only recording a version needs it (plans never do)
        import filelock

        self.path.parent.mkdir(parents=True, exist_ok=True)
        return filelock.FileLock(str(self.path) + ".lock")

    def highest(self, source: str) -> Optional[int]:
        """The highest version recorded for ``source`` by checks without a channel."""
        return self._read()[0].get(source)

    def channel_state(self, channel: str) -> Dict[str, _Entry]:
        """What was recorded for ``channel``: ``{keyid: (source, version)}``."""
        return dict(self._read()[1].get(channel, {}))

    def forget(self, channel: str) -> bool:
        """Drop what was recorded for ``channel`` (the user removed it); whether there was anything."""
        if channel not in self._read()[1]:  # nothing to drop: no lock file, no home made
            return False
        try:
            with self._thread_lock, self._lock():
                state = self._read()
                if state[1].pop(channel, None) is None:
                    return False
                self._write(state)
                return True
        except OSError as exc:
            raise ManifestStateError(f"cannot record manifest versions in {self.path} ({exc.strerror or exc})",
                                     "the runtime home must be writable; choose another one or fix its permissions") from None

    def check(self, source: str, version: int, *, record: bool = True, channel: Optional[str] = None,
              keys: Iterable[str] = (), signers: Iterable[str] = ()) -> None:
        """Refuse ``version`` if lower than the highest seen; with ``record``, remember it as the
        highest if it is. Without ``record`` nothing is written, not even a lock file (the state
        is replaced atomically, so reading it needs no lock): a plan or a dry run leaves the home
        as it was.

        With ``channel``: the entries of ``keys`` (the keys that verify the channel now) decide,
        a manifest of another source than theirs is refused, and only the entries of ``signers``
        (the trusted keys whose valid signatures it carries) are raised. Without: per source."""
        keys, signers = set(keys), list(signers)
        if not record or (channel is not None and not signers):
            self._refuse(source, version, self._read(), channel, keys)
            return
        try:
            with self._thread_lock, self._lock():
                state = self._read()
                self._refuse(source, version, state, channel, keys)
                if self._raise(state, source, version, channel, signers):
                    self._write(state)
        except OSError as exc:
            raise ManifestStateError(f"cannot record manifest versions in {self.path} ({exc.strerror or exc})",
                                     "the runtime home must be writable; choose another one or fix its permissions") from None

    def refuse_older_signed(self, source: str, version: int, signers: Iterable[str]) -> None:
        """Refuse ``version`` of ``source`` when a higher version of that source, signed by one of
        ``signers``, was recorded under any channel name: for a bundle, whose channel name is not
        signed, the signed source and key alone decide (issue 47). Reads only."""
        signers = set(signers)
        seen = max((v for keys in self._read()[1].values() for k, (src, v) in keys.items() if k in signers and src == source),
                   default=None)
        if seen is not None and version < seen:
            raise ManifestRollbackError(
                f"manifest '{source}' version {version} is older than version {seen} already seen, signed by the same "
                "key (rollback)",
                "someone may be serving an outdated manifest; get the current one from the publisher",
            )

    @staticmethod
    def _raise(state: _State, source: str, version: int, channel: Optional[str], signers: Iterable[str]) -> bool:
        sources, channels = state
        if channel is None:
            seen = sources.get(source)
            if seen is None or version > seen:
                sources[source] = version
                return True
            return False
        entries = channels.setdefault(channel, {})
        changed = False
        for keyid in signers:
            old = entries.get(keyid)
            if old is None or old[0] != source or version > old[1]:
                entries[keyid] = (source, version if old is None or old[0] != source else max(version, old[1]))
                changed = True
        return changed

    @staticmethod
    def _refuse(source: str, version: int, state: _State, channel: Optional[str], keys: Iterable[str]) -> None:
        if channel is None:
            seen = state[0].get(source)
            label = f"manifest '{source}'"
        else:
            entries = [e for k, e in state[1].get(channel, {}).items() if k in set(keys)]
            expected = sorted({s for s, _ in entries})
            if expected and expected != [source]:
                raise ManifestRollbackError(
                    f"channel {channel} serves manifests of source '{expected[0]}', and this one is of source "
                    f"'{source}': another manifest of the same publisher, not this channel's",
                    "someone may be serving another of the publisher's manifests at the channel's address; get the "
                    "current one from the publisher (if the publisher renamed the channel's source, remove the "
                    "channel and add it again)",
                )
            seen = max((v for _, v in entries), default=None)
            label = f"channel {channel}: manifest '{source}'"
        if seen is not None and version < seen:
            raise ManifestRollbackError(
                f"{label} version {version} is older than version {seen} already seen (rollback)",
                "someone may be serving an outdated manifest; get the current one from the publisher",
            )
