"""The user's channels: the signed manifest URLs (and their keys) that `install` reads.

``accelstack channel list | add | remove`` and an app's settings screen call these; where each
channel was configured is reported with it (the app's, the user's channels file, the last
install's remembered ones).
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Sequence, Tuple

from ..artifacts import FetchError, Transport, check_url, fetch_document
from ..errors import UsageError
from ..manifests.channels import (
    add_channel,
    channel_trust,
    check_channel,
    key_from_file,
    key_from_id,
    read_user_channels,
    remove_channel,
)
from ..settings import Channel, Settings
from .planning import remembered_channels

__all__ = ["CHECK_CONNECT_TIMEOUT", "CHECK_READ_TIMEOUT", "channel_trust", "list_channels", "add", "remove", "location",
           "try_once"]


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


CHECK_CONNECT_TIMEOUT = 5.0  # seconds: `channel add` tries the URL once, briefly


CHECK_READ_TIMEOUT = 15.0


def add(settings: Settings, name: str, url: str, *, mirrors: Sequence[str] = (), key_files: Sequence[str] = (),
        key_ids: Sequence[str] = (), replace: bool = False, check: bool = True) -> Channel:
    """Add the channel ``name`` to the user's channels file, signed by the keys in ``key_files``
    (``.pub``) and the already trusted ``key_ids``; at least one key is needed. ``check`` (the
    default; ``--no-check`` turns it off) tries the manifest's URL once first: an unreachable one
    is a :class:`UsageError` and nothing is added (a typo found now, not at the next install)."""
    where, also = location(url), [location(m) for m in mirrors]
    keys = [key_from_file(k) for k in key_files] + [key_from_id(k, settings) for k in key_ids]
    if not keys:
        raise UsageError("a channel needs the key that signs its manifest: give --key FILE or --key-id ID",
                         "ask the publisher for the public key (.pub)")
    channel = check_channel(Channel(name, where, also, list(dict.fromkeys(keys))))
    taken = not replace and any(c.name == channel.name for c in read_user_channels(settings))
    if check and not taken:  # a name already taken is refused below, with no network round trip
        try_once(where)
    return add_channel(settings, channel, replace=replace)


def try_once(where: str) -> None:
    """Read the manifest at ``where`` once, with short timeouts and no retries."""
    transport = Transport(connect_timeout=CHECK_CONNECT_TIMEOUT, read_timeout=CHECK_READ_TIMEOUT,
                          document_timeout=CHECK_READ_TIMEOUT)  # briefly, a dripping server included
    try:
        fetch_document(where, transport=transport)
    except FetchError as exc:
        raise UsageError(f"cannot read the channel's manifest {where}: {exc.message}",
                         "check the address; to add the channel anyway (a server that is down for now), "
                         "pass --no-check") from None
    finally:
        transport.close()


def remove(settings: Settings, name: str) -> Channel:
    """Remove the channel ``name`` from the user's channels file; return it."""
    return remove_channel(settings, name)
