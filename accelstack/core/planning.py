"""Detect and plan: the machine, the trusted manifests, and the decision.

Manifests named in the settings are fetched here (the artifacts layer), verified by
``TrustedManifests`` (signature, envelope, expiry, rollback) and handed to the resolver. When no
published ggml build fits, the plan says ``needs-build``; the build itself happens in ``install``
so that planning stays fast and a dry run never compiles.
"""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Tuple, cast

from ..artifacts.errors import FetchError, OfflineError
from ..domain import Stack
from ..errors import Action, UsageError
from ..events import ProgressCallback, ProgressEvent, null_progress
from ..fsio import write_bytes, write_text
from ..hardware.report import HardwareReport
from ..installer.pip_runner import ensure_venv, python_version, venv_python
from ..limits import MAX_CONFIG_BYTES, MAX_JSON_BYTES, MAX_SIGNATURE_BYTES, MalformedInput, parse_json, read_capped
from ..manifests.channels import ChannelError, adhoc_channel_name, find, key_from_file, read_user_channels, trust_for
from ..manifests.plan import Plan, Request
from ..manifests.resolver import Manifests, resolve
from ..settings import Channel, Settings
from .detection import detect
from .fingerprint import hardware_fingerprint
from .sources import DocumentFetcher, LoadedManifest, NetworkDocuments, TrustedSet
from .stacks import stack_info

__all__ = ["LOCAL_SOURCE", "NO_CHANNEL_LINE", "DocumentFetcher", "NetworkDocuments", "LoadedManifest", "TrustedSet", "active_channels", "adhoc_channel_name",
           "configured_channels", "fetch_channel", "hardware_fingerprint", "load_manifests", "plan", "plan_sources", "remember_channels",
           "remembered_channels", "save_manifest", "saved_manifest", "target_interpreter", "target_version", "with_keys"]

log = logging.getLogger(__name__)
LOCAL_SOURCE = "local-build"
NO_CHANNEL_LINE = "no channel is configured, so there is no published build to download"




_NETWORK = NetworkDocuments()


def _channel_of(item: object, i: int) -> Optional[Channel]:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not isinstance(item.get("url"), str):
        return None
    lists = [[v for v in item.get(k, []) if isinstance(v, str)] if isinstance(item.get(k), list) else []
             for k in ("mirrors", "keys")]
    return Channel(item["name"], item["url"], lists[0], lists[1])


def remembered_channels(settings: Settings) -> List[Channel]:
    """The channels the last install used, with the keys it trusted them with (the home's
    ``settings.json``; an older file lists bare manifest URLs)."""
    try:
        data = parse_json(read_capped(settings.remembered, MAX_CONFIG_BYTES + 1), what=str(settings.remembered),
                          max_bytes=MAX_CONFIG_BYTES)  # read_capped: a FIFO there is refused, never waited on
    except (OSError, MalformedInput):
        return []
    if not isinstance(data, dict):
        return []
    out = [c for c in (_channel_of(item, i) for i, item in enumerate(data.get("channels", []) or [])) if c is not None]
    if not out:
        out = [Channel(adhoc_channel_name(u), u) for u in data.get("manifests", []) or [] if isinstance(u, str)]
    return out


def remember_channels(settings: Settings, channels: Sequence[Channel]) -> None:
    """Remember what an install used, keys as base64 text (a ``.pub`` path given once may move)."""
    if not channels:
        return
    doc = {"manifests": [c.url for c in channels],
           "channels": [{"name": c.name, "url": c.url, "mirrors": list(c.mirrors),
                         "keys": [key_from_file(k) if k.endswith(".pub") else k for k in c.keys]} for c in channels]}
    write_text(settings.remembered, json.dumps(doc, indent=2))


def with_keys(channel: Channel, keys: Sequence[str]) -> Channel:
    extra = [k for k in keys if k not in channel.keys]
    return Channel(channel.name, channel.url, list(channel.mirrors), list(channel.keys) + extra) if extra else channel


def configured_channels(settings: Settings) -> List[Channel]:
    """The embedding app's channels, then the user's (a user channel of the same name is shadowed)."""
    names = {c.name for c in settings.channels}
    return list(settings.channels) + [c for c in read_user_channels(settings) if c.name not in names]


def active_channels(settings: Settings, *, prefer_remembered: bool = False) -> List[Channel]:
    """The channels to read, in precedence: manifests named outright (``--manifest``, the app's
    ``manifests``), channels named by ``settings.channel`` (``--channel``), the app's channels,
    the user's channels, and the ones the last install used (first of all for ``status`` and
    ``upgrade``: ``prefer_remembered``). ``settings.trusted_keys`` (``--trusted-key``) are added
    to each, and remembered with it by an install. Empty: no channel is configured."""
    extra = list(settings.trusted_keys)
    if settings.manifests:
        return [Channel(adhoc_channel_name(u), u, [], extra) for u in settings.manifests]
    remembered = remembered_channels(settings)
    if settings.channel:
        configured = configured_channels(settings)
        chosen = []
        for name in settings.channel:
            c = find(configured, name) or find(remembered, name)
            if c is None:
                known = ", ".join(c.name for c in configured) or "none"
                raise ChannelError(f"no channel named {name!r} is configured (configured: {known})",
                                   "add the channel with its manifest URL and the publisher's key",
                                   action=Action.ADD_MANIFEST)
            chosen.append(with_keys(c, extra))
        return chosen
    if settings.channels:
        return [with_keys(c, extra) for c in settings.channels]
    if prefer_remembered and remembered:
        return [with_keys(c, extra) for c in remembered]
    return [with_keys(c, extra) for c in (configured_channels(settings) or remembered)]


def load_manifests(settings: Settings, *, record: bool = True, progress: ProgressCallback = null_progress,
                   channels: Optional[Sequence[Channel]] = None, prefer_remembered: bool = False,
                   fetcher: Optional[DocumentFetcher] = None) -> TrustedSet:
    """The builtin torch matrix plus the ggml manifest of every channel (``channels``, default
    :func:`active_channels`), each verified with its channel's keys before use; a channel's
    mirrors are tried in turn when its URL cannot be fetched.

    ``record=False`` checks rollback without raising the watermark (status, dry runs); ``fetcher``
    reads the documents (default: accelstack.artifacts over the network). Offline
    (``settings.offline``) each channel's manifest is the copy an install (or a bundle) verified
    last in this home, verified again: an :class:`OfflineError` names a channel without one."""
    manifests = Manifests.builtin()
    loaded: List[LoadedManifest] = []
    chosen = list(channels) if channels is not None else active_channels(settings, prefer_remembered=prefer_remembered)
    for channel in chosen:
        trusted = trust_for(channel, settings)  # a check with record=False only reads
        if settings.offline:  # never the network: the copy this home verified last, checked again
            data, sig, url = saved_manifest(settings, channel)
        else:
            data, sig, url = fetch_channel(channel, progress, fetcher if fetcher is not None else NetworkDocuments(settings.timeouts))
        verified = trusted.verify(data, sig, url, expect="ggml", record=record)
        if record and not settings.offline:
            save_manifest(settings, channel.name, data, sig)
        manifests.add(verified.manifest)
        loaded.append(LoadedManifest(url, verified.envelope.source, verified.envelope.version, channel.name))
    return TrustedSet(manifests, loaded, chosen)


def _saved_path(settings: Settings, name: str) -> Path:
    return settings.state_dir / "manifests" / f"{name}.json"


def save_manifest(settings: Settings, name: str, data: bytes, signature: Optional[bytes]) -> None:
    """Keep the manifest (and signature) of channel ``name`` an install verified, for offline runs."""
    path = _saved_path(settings, name)
    write_bytes(path, data, make_parents=True)
    sig = path.with_name(path.name + ".sig")
    if signature is not None:
        write_bytes(sig, signature, make_parents=True)
    else:
        sig.unlink(missing_ok=True)


def saved_manifest(settings: Settings, channel: Channel) -> Tuple[bytes, Optional[bytes], str]:
    """The manifest of ``channel`` kept by :func:`save_manifest` (offline mode reads only this)."""
    path = _saved_path(settings, channel.name)
    try:
        data = read_capped(path, MAX_JSON_BYTES + 1)  # a FIFO is refused, never waited on; too large fails the check
    except OSError:
        raise OfflineError(f"offline mode: the manifest of channel {channel.name} ({channel.url}) has not been read "
                           "by an install in this home, and offline it is not fetched",
                           "install from an offline bundle made on a machine with network access "
                           "(`accelstack bundle create`), or run once without --offline") from None
    try:
        sig: Optional[bytes] = read_capped(path.with_name(path.name + ".sig"), MAX_SIGNATURE_BYTES + 1)
    except OSError:
        sig = None
    return data, sig, channel.url


def plan_sources(settings: Settings, stack: str, *, record: bool = False, progress: ProgressCallback = null_progress,
                 prefer_remembered: bool = False, fetcher: Optional[DocumentFetcher] = None) -> TrustedSet:
    """What a plan for ``stack`` is made from, one answer for `plan` and `install`: the builtin
    knowledge, and for a stack that reads channels the active channels' verified manifests
    (:func:`load_manifests`; no ``channels``: none is configured)."""
    if not stack_info(stack).reads_channels:
        return TrustedSet(Manifests.builtin(), [], [])
    return load_manifests(settings, record=record, progress=progress, prefer_remembered=prefer_remembered,
                          fetcher=fetcher)


def fetch_channel(channel: Channel, progress: ProgressCallback,
                  fetcher: Optional[DocumentFetcher] = None) -> Tuple[bytes, Optional[bytes], str]:
    """The manifest and signature of ``channel``: from its URL, else from each mirror in turn."""
    docs = fetcher if fetcher is not None else _NETWORK
    failures = []
    for url in [channel.url, *channel.mirrors]:
        progress(ProgressEvent("message", "plan", message=f"reading manifest {url}"))
        try:
            return docs.document(url), docs.optional_document(url + ".sig"), url
        except FetchError as exc:
            failures.append(f"{url}: {exc.message}")
    raise FetchError(f"cannot get the manifest of channel {channel.name}: {'; '.join(failures)}"
                      if len(failures) > 1 else f"cannot get the manifest {failures[0]}",
                      hint="check the address and the network; nothing was changed", action=Action.CHECK_NETWORK)


def target_interpreter(settings: Settings, *, create: bool) -> str:
    """The torch target's interpreter: the venv's (created when ``create``), the one named, or this one."""
    if settings.torch_venv is not None:
        return ensure_venv(settings.torch_venv, settings.timeouts.venv) if create else str(venv_python(settings.torch_venv))
    python = settings.torch_python or sys.executable
    if not Path(python).exists():
        raise UsageError(f"the target interpreter {python} does not exist")
    return python


def target_version(settings: Settings) -> str:
    """The torch target's Python version ("3.11"); a venv not created yet will be made from this interpreter."""
    python = target_interpreter(settings, create=False)
    if python == sys.executable or not Path(python).exists():
        return "%d.%d" % sys.version_info[:2]
    return python_version(python, settings.timeouts.probe)


def plan(report: Optional[HardwareReport] = None, stack: str = "ggml", *, requirements: Sequence[str] = (),
         backend: Optional[str] = None, python: Optional[str] = None, settings: Optional[Settings] = None,
         manifests: Optional[Manifests] = None, on_progress: Optional[ProgressCallback] = None) -> Plan:
    """The plan for ``stack`` on the machine ``report`` describes (detected when not given).

    ``python`` is the torch target's version ("3.11"; default: the target environment's).
    ``manifests`` skips loading them from the settings (already verified by the caller)."""
    s = settings or Settings.resolve()
    progress = on_progress or null_progress
    report = report if report is not None else detect(settings=s)
    known = stack_info(stack)
    if known.needs_python and python is None:
        python = target_version(s)
    if manifests is None:
        manifests = plan_sources(s, known.name, progress=progress).manifests
    request = Request(stack=cast(Stack, known.name), requirements=list(requirements), backend=s.backend if backend is None else backend,
                      python=python or "", engine=s.torch_engine)
    return resolve(report, request, manifests)
