"""`accelstack channel list | add | remove`: the user's channels (signed manifest URLs and their keys)."""
from __future__ import annotations

import argparse
from typing import List

from ..core import channels
from ..settings import Channel
from .common import emit, needs_subcommand, settings_from_args

__all__ = ["register", "run_list", "run_add", "run_remove"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "channel",
        help="list, add and remove channels: where signed prebuilt runtimes come from",
        description="A channel is a named manifest URL (with mirrors) and the public keys that must sign it (one or more). "
        "`install`, `status` and `upgrade` read every configured channel (or those named with --channel). Trust "
        "is pinned per channel: its keys verify its manifest and no other.",
        epilog="examples:\n"
        "  accelstack channel add stable https://host/ggml-manifest.json --key release.pub\n"
        "  accelstack channel add stable URL --key current.pub --key next.pub --replace   during a key rotation\n"
        "  accelstack channel list --json\n"
        "  accelstack channel remove stable",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    csub = p.add_subparsers(dest="channel_command", metavar="ACTION")

    ls = csub.add_parser("list", help="the configured channels (the app's, the user's, and the last install's)",
                         description="List every channel accelstack reads: those the embedding app configured, the "
                         "user's channels file, and the channels the last install used; each with its mirrors, the "
                         "keys that must sign it and where it was configured.",
                         epilog="examples:\n  accelstack channel list\n  accelstack channel list --json", formatter_class=argparse.RawDescriptionHelpFormatter)
    ls.add_argument("--json", action="store_true", help="print the result as JSON")
    ls.add_argument("--home", metavar="DIR", help="runtime home whose last install's channels are listed too")
    ls.set_defaults(func=run_list)

    add = csub.add_parser("add", help="add a channel to the user's channels file",
                          description="Add a named channel: the URL of a signed ggml-manifest.json (its .sig beside "
                          "it) and the public keys that must sign it (one or more). The URL is checked now (https, or a local path) and read "
                          "once: an unreachable one is refused, and --no-check adds it anyway (offline: not read).",
                          epilog="examples:\n  accelstack channel add stable https://host/ggml-manifest.json --key release.pub\n"
                          "  accelstack channel add stable URL --mirror https://mirror/ggml-manifest.json --key release.pub --replace",
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    add.add_argument("name", help="the channel's name (lowercase letters, digits, '.', '_', '+', '-')")
    add.add_argument("url", help="the URL (or path) of its ggml-manifest.json; the .sig is read beside it")
    add.add_argument("--mirror", action="append", default=[], metavar="URL", help="another address of the same manifest")
    add.add_argument("--key", action="append", default=[], metavar="FILE", help="a public key (.pub) that signs it; repeatable")
    add.add_argument("--key-id", action="append", default=[], metavar="ID",
                     help="an already trusted key (shipped, or in the trusted-keys directory) by its id")
    add.add_argument("--replace", action="store_true", help="replace a channel of the same name")
    add.add_argument("--no-check", dest="check", action="store_false",
                     help="add it without trying its URL first (by default the manifest is read once, and an "
                          "unreachable URL is refused)")
    add.add_argument("--json", action="store_true", help="print the result as JSON")
    add.set_defaults(func=run_add)

    rm = csub.add_parser("remove", help="remove a channel from the user's channels file",
                         description="Remove a channel from the user's channels file. Runtimes installed from it stay "
                         "installed; `accelstack upgrade` no longer looks there.",
                         epilog="examples:\n  accelstack channel remove beta", formatter_class=argparse.RawDescriptionHelpFormatter)
    rm.add_argument("name")
    rm.add_argument("--json", action="store_true", help="print the result as JSON")
    rm.set_defaults(func=run_remove)

    p.set_defaults(func=needs_subcommand(p))



def _row(channel: Channel, origin: str) -> dict:
    return {"name": channel.name, "url": channel.url, "mirrors": list(channel.mirrors), "keys": list(channel.keys),
            "trust": channels.channel_trust(channel), "origin": origin}


def run_list(args: argparse.Namespace) -> int:
    rows: List[dict] = [_row(c, origin) for c, origin in channels.list_channels(settings_from_args(args))]
    lines = [f"{r['name']}  {r['url']}" + "".join(f"\n    mirror {m}" for m in r["mirrors"])
             + f"\n    signed by {r['trust']}; from {r['origin']}" for r in rows]
    emit(args, {"channels": rows}, "\n".join(lines) or "no channel is configured (add one: accelstack channel add NAME URL --key FILE)")
    return 0


def run_add(args: argparse.Namespace) -> int:
    s = settings_from_args(args)
    channel = channels.add(s, args.name, args.url, mirrors=args.mirror, key_files=args.key, key_ids=args.key_id,
                           replace=args.replace, check=args.check and not s.offline)
    row = _row(channel, f"user ({s.channels_file})")
    emit(args, row, f"added channel {channel.name}: {channel.url}, signed by {row['trust']}\n  in {s.channels_file}")
    return 0


def run_remove(args: argparse.Namespace) -> int:
    channel = channels.remove(settings_from_args(args), args.name)
    emit(args, _row(channel, "removed"), f"removed channel {channel.name} ({channel.url})")
    return 0
