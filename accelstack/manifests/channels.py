"""Channels: named manifest URLs with the keys that must sign them, and the user's channels file.

A channel (:class:`~accelstack.settings.Channel`) names where signed ggml manifests come from
(``url``, then ``mirrors``) and which public keys may sign them (``keys``). Trust is pinned per
channel: a channel with keys is verified with those keys only (:func:`trust_for`), so a key
trusted for one channel never signs for another.

The user's channels live in ``Settings.channels_file`` (``channels.json``, written by
``accelstack channel add``); a hand-written ``channels.yaml`` beside it is read too. Both are
someone else's documents: bounded parsers (:mod:`accelstack.limits`), every field checked, keys
parsed before they are stored, so a bad file is a typed error naming the file and the entry.

    {"format": "accelstack-channels", "version": 1,
     "channels": [{"name": "stable", "url": "https://host/ggml-manifest.json",
                   "mirrors": ["https://mirror/ggml-manifest.json"], "keys": ["<base64 public key>"]}]}
"""
from __future__ import annotations

import base64
import errno
import hashlib
import json
from pathlib import Path
from typing import Any, Iterable, List, Optional, Sequence

from ..errors import AccelstackError, Action
from ..fsio import write_bytes
from ..limits import MAX_CONFIG_BYTES, MAX_TEXT_LENGTH, MalformedInput, parse_json, parse_yaml
from ..settings import Channel, Settings
from .errors import ManifestError
from .fields import ID_RULE, check_id, read_document
from .keys import TrustStore, parse_public_key
from .rollback import RollbackStore
from .trust import TrustedManifests

FORMAT = "accelstack-channels"
FORMAT_VERSION = 1
MAX_CHANNELS = 256  # a person's list of channels; more is not a list a person wrote
MAX_MIRRORS = 16
MAX_CHANNEL_KEYS = 8  # current + next during a rotation, a few co-signers
YAML_NAME = "channels.yaml"

__all__ = ["Channel", "ChannelError", "add_channel", "adhoc_channel_name", "channel_trust", "check_channel", "key_from_file", "key_from_id",
           "read_user_channels", "remove_channel", "trust_for", "write_user_channels"]


class ChannelError(AccelstackError):
    """A channel definition or the channels file is wrong, or a named channel is not configured."""

    default_action = Action.FIX_CONFIG


def check_channel(channel: Channel, where: str = "channel") -> Channel:
    """``channel`` with its fields checked: a valid name, a URL, bounded mirrors and valid keys."""
    try:
        check_id(channel.name, f"{where}.name", "channel name")
    except ManifestError:
        raise ChannelError(f"{where}: {channel.name!r} is not a valid channel name", f"use {ID_RULE}",
                           action=Action.FIX_INPUT) from None
    for i, url in enumerate([channel.url, *channel.mirrors]):
        if not isinstance(url, str) or not url.strip() or len(url) > MAX_TEXT_LENGTH or "\x00" in url:
            raise ChannelError(f"{where}: manifest address #{i + 1} is empty, too long or not text",
                               "give the URL (or path) of the channel's ggml-manifest.json", action=Action.FIX_INPUT)
    if len(channel.mirrors) > MAX_MIRRORS or len(channel.keys) > MAX_CHANNEL_KEYS:
        raise ChannelError(f"{where}: at most {MAX_MIRRORS} mirrors and {MAX_CHANNEL_KEYS} keys per channel",
                           action=Action.FIX_INPUT)
    for key in channel.keys:
        try:
            if key.endswith(".pub"):
                key_from_file(key)
            else:
                parse_public_key(key, f"{where}: key")
        except ManifestError as exc:
            raise ChannelError(exc.message, "give the publisher's public key (a .pub file or its base64 text)",
                               action=Action.TRUST_KEY) from None
    return channel


def adhoc_channel_name(url: str) -> str:
    """The channel name of a manifest named by URL alone (``--manifest``)."""
    return "manifest-" + hashlib.sha256(url.encode()).hexdigest()[:12]


def trust_for(channel: Channel, settings: Settings) -> TrustedManifests:
    """The :class:`~accelstack.manifests.trust.TrustedManifests` that checks ``channel``'s manifest:
    its own keys only when it has some (pinned), else the globally trusted keys; the home's
    rollback state and ``insecure_unsigned`` as ``settings`` say. The rollback state is the
    channel's own, per key: what one channel's keys signed never moves another's, and the channel
    keeps the source its first trusted manifest had (:mod:`~accelstack.manifests.rollback`)."""
    s = settings
    adhoc = channel.name == adhoc_channel_name(channel.url)  # named by URL alone: kept by its source, per key
    if channel.keys:
        return TrustedManifests(keys=channel.keys, user_keys_dir=None, include_package_keys=False,
                                rollback_state=s.rollback_state, insecure_unsigned=s.insecure_unsigned, channel=channel.name,
                                by_source=adhoc)
    return TrustedManifests(keys=s.trusted_keys, user_keys_dir=s.user_keys_dir, rollback_state=s.rollback_state,
                            insecure_unsigned=s.insecure_unsigned, channel=channel.name, by_source=adhoc)


def channel_trust(channel: Channel) -> str:
    """How ``channel`` is trusted, for listings: its pinned key ids, or the global keys."""
    if not channel.keys:
        return "globally trusted keys"
    return "keys " + ", ".join(TrustStore([TrustStore.key_arg(k) for k in channel.keys], include_package=False).keyids)


def key_from_file(path: str) -> str:
    """The base64 text of the public key in the ``.pub`` file ``path`` (what a channel stores)."""
    try:
        data = read_document(path, 16 * 1024)
    except (OSError, ManifestError) as exc:
        detail = exc.message if isinstance(exc, ManifestError) else (exc.strerror or str(exc))
        raise ChannelError(f"cannot read the public key {path} ({detail})", "give the publisher's .pub file",
                           action=Action.TRUST_KEY, exit_code=2) from None
    try:
        raw = parse_public_key(data, str(path))
    except ManifestError as exc:
        raise ChannelError(exc.message, "give the publisher's .pub file", action=Action.TRUST_KEY) from None
    return base64.b64encode(raw).decode("ascii")


def key_from_id(keyid: str, settings: Settings) -> str:
    """The base64 text of an already trusted key (shipped, or in the user's trusted-keys directory) by its id."""
    store = TrustStore(user_dir=settings.user_keys_dir)
    key = store.get(keyid.strip().lower())
    if key is None:
        raise ChannelError(f"no trusted key has the id {keyid!r} (known: {', '.join(store.keyids) or 'none'})",
                           f"put the publisher's .pub file in {settings.user_keys_dir}, or give it with --key FILE",
                           action=Action.TRUST_KEY)
    return base64.b64encode(key.raw).decode("ascii")


# -- the user's channels file ---------------------------------------------------------------------


def _entries(doc: Any, what: str) -> List[Channel]:
    if isinstance(doc, dict):
        items = doc.get("channels", [])
        if doc.get("format", FORMAT) != FORMAT or not isinstance(doc.get("version", FORMAT_VERSION), int) \
                or doc.get("version", FORMAT_VERSION) > FORMAT_VERSION:
            raise ChannelError(f"{what} is not an accelstack channels file of a version this accelstack reads",
                               "update accelstack, or remove the file and add the channels again",
                               action=Action.UPDATE_ACCELSTACK)
    elif doc is None:
        items = []
    else:
        raise ChannelError(f"{what}: expected an object with a 'channels' list", "fix the file or remove it")
    if not isinstance(items, list) or len(items) > MAX_CHANNELS:
        raise ChannelError(f"{what}: 'channels' must be a list of at most {MAX_CHANNELS} entries", "fix the file")
    out: List[Channel] = []
    for i, item in enumerate(items):
        where = f"{what}: channels[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not isinstance(item.get("url"), str):
            raise ChannelError(f"{where} needs a 'name' and a 'url' (text)", "fix the file")
        lists = []
        for key in ("mirrors", "keys"):
            value = item.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ChannelError(f"{where}.{key} must be a list of strings", "fix the file")
            lists.append(list(value))
        unknown = set(item) - {"name", "url", "mirrors", "keys"}
        if unknown:
            raise ChannelError(f"{where}: unknown {'field' if len(unknown) == 1 else 'fields'} {', '.join(sorted(unknown))}", "fix the file")
        out.append(check_channel(Channel(item["name"], item["url"], lists[0], lists[1]), where))
    names = [c.name for c in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ChannelError(f"{what}: {'channel' if len(dupes) == 1 else 'channels'} {', '.join(dupes)} defined twice", "keep one entry per name")
    return out


def _read(path: Path, yaml: bool) -> List[Channel]:
    try:
        data = read_document(path, MAX_CONFIG_BYTES)
    except FileNotFoundError:
        return []
    except (OSError, ManifestError) as exc:
        detail = exc.message if isinstance(exc, ManifestError) else (exc.strerror or str(exc))
        raise ChannelError(f"cannot read the channels file {path} ({detail})", "fix or remove the file") from None
    try:
        doc = parse_yaml(data, what=str(path)) if yaml else parse_json(data, what=str(path), max_bytes=MAX_CONFIG_BYTES)
    except MalformedInput as exc:
        raise ChannelError(exc.message, exc.hint or "fix or remove the file") from None
    return _entries(doc, str(path))


def read_user_channels(settings: Settings) -> List[Channel]:
    """The user's channels: ``channels.json`` (managed), then those only in a hand-written ``channels.yaml``."""
    managed = _read(settings.channels_file, yaml=False)
    names = {c.name for c in managed}
    written = [c for c in _read(settings.channels_file.with_name(YAML_NAME), yaml=True) if c.name not in names]
    return managed + written


def write_user_channels(settings: Settings, channels: Sequence[Channel]) -> Path:
    """Replace ``channels.json`` atomically (a crash leaves the old file or the new one)."""
    doc = {"format": FORMAT, "version": FORMAT_VERSION,
           "channels": [{"name": c.name, "url": c.url, "mirrors": list(c.mirrors), "keys": list(c.keys)} for c in channels]}
    # 0600: the user's own configuration, as it has always been written
    try:
        return write_bytes(settings.channels_file, (json.dumps(doc, indent=2) + "\n").encode("utf-8"), mode=0o600,
                           make_parents=True)
    except OSError as exc:  # the file is as it was
        raise _write_error(settings, exc) from None


def _write_error(settings: Settings, exc: OSError) -> ChannelError:
    """Why the channels file could not be written, naming the folder and what to do: a full disk
    is a failure (exit 1); a configuration folder that cannot be made or written, a usage error (2)."""
    path, folder = settings.channels_file, settings.channels_file.parent
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return ChannelError(f"cannot write the channels file {path}: {reason}; nothing was changed",
                            f"free some space on the disk of {folder}", action=Action.FREE_DISK, code="disk-full")
    return ChannelError(f"cannot write the channels file {path}: the configuration folder {folder} cannot be made or "
                        f"written to ({reason}); nothing was changed",
                        f"make {folder} a folder you can write to, or choose another configuration folder "
                        "(ACCELSTACK_CONFIG_DIR)", action=Action.FIX_INPUT, code="output-path", exit_code=2)


def add_channel(settings: Settings, channel: Channel, *, replace: bool = False) -> Channel:
    """Add ``channel`` to the user's channels file (``replace`` an existing one of the same name)."""
    check_channel(channel)
    current = _read(settings.channels_file, yaml=False)
    if any(c.name == channel.name for c in current) and not replace:
        raise ChannelError(f"a channel named {channel.name!r} is already configured",
                           "remove it first, or replace it", action=Action.FIX_INPUT)
    write_user_channels(settings, [c for c in current if c.name != channel.name] + [channel])
    return channel


def remove_channel(settings: Settings, name: str) -> Channel:
    """Remove the channel ``name`` from the user's channels file; return it."""
    current = _read(settings.channels_file, yaml=False)
    found = [c for c in current if c.name == name]
    if not found:
        in_yaml = any(c.name == name for c in _read(settings.channels_file.with_name(YAML_NAME), yaml=True))
        raise ChannelError(f"no channel named {name!r} in {settings.channels_file}",
                           f"it is defined in {settings.channels_file.with_name(YAML_NAME)}: edit that file" if in_yaml
                           else "list the configured channels", action=Action.FIX_INPUT)
    write_user_channels(settings, [c for c in current if c.name != name])
    RollbackStore(settings.rollback_state).forget(name)  # added again, it binds to its source anew
    return found[0]


def find(channels: Iterable[Channel], name: str) -> Optional[Channel]:
    return next((c for c in channels if c.name == name), None)
