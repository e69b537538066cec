"""The user's channels: the signed manifest URLs (and their keys) that `install` reads.

``accelstack channel list | add | remove`` and an app's settings screen call these; where each
channel was configured is reported with it (the app's, the user's channels file, the last
install's remembered ones).
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Sequence, Tuple

from ..artifacts import check_url
from ..errors import UsageError
from ..manifests.channels import add_channel, channel_trust, key_from_file, key_from_id, read_user_channels, remove_channel
from ..settings import Channel, Settings
from .planning import remembered_channels

__all__ = ["channel_trust", "list_channels", "add", "remove", "location"]


def list_channels(settings: Settings) -> List[Tuple[Channel, str]]:
    """Every channel accelstack reads, with where it was configured: the app's, then the user's
    channels file, then the last install's (those not named already)."""
    found: List[Tuple[Channel, str]] = [(c, "app") for c in settings.channels]
    found += [(c, f"user ({settings.channels_file})") for c in read_user_channels(settings)]
    names = {c.name for c, _ in found}
    found += [(c, f"last install ({settings.home})") for c in remembered_channels(settings) if c.name not in names]
    return found


def location(text: str) -> str:
    """A URL as given (refused now if it could never be fetched), or a local path made absolute."""
    if "://" in text:
        check_url(text)
        return text
    return str(Path(text).expanduser().resolve())


def add(settings: Settings, name: str, url: str, *, mirrors: Sequence[str] = (), key_files: Sequence[str] = (),
        key_ids: Sequence[str] = (), replace: bool = False) -> Channel:
    """Add the channel ``name`` to the user's channels file, signed by the keys in ``key_files``
    (``.pub``) and the already trusted ``key_ids``; at least one key is needed."""
    where, also = location(url), [location(m) for m in mirrors]
    keys = [key_from_file(k) for k in key_files] + [key_from_id(k, settings) for k in key_ids]
    if not keys:
        raise UsageError("a channel needs the key that signs its manifest: give --key FILE or --key-id ID",
                         "ask the publisher for the public key (.pub)")
    return add_channel(settings, Channel(name, where, also, list(dict.fromkeys(keys))), replace=replace)


def remove(settings: Settings, name: str) -> Channel:
    """Remove the channel ``name`` from the user's channels file; return it."""
    return remove_channel(settings, name)
