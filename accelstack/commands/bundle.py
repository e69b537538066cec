"""`accelstack bundle create`: one file that installs a runtime on a machine with no network."""
from __future__ import annotations

import argparse
from pathlib import Path

from .common import add_home_arguments, emit, report_from, settings_from
from .progress import progress_renderer

MiB = 1024 * 1024


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bundle",
        help="make an offline bundle: a channel's signed manifest and its builds in one file",
        description="Offline and air-gapped machines: `bundle create` (on a machine with network access) writes one "
        "tar file with a channel's signed manifest, its signature and the builds of the chosen targets; "
        "`accelstack install --bundle FILE --offline` installs from it with no network, checking the signature "
        "and every hash as an online install does.",
        epilog="examples:\n"
        "  accelstack bundle create -o runtime.tar                     the build this machine would install\n"
        "  accelstack bundle create --backend cuda --backend cpu -o gpu-and-cpu.tar\n"
        "  accelstack install --bundle runtime.tar --offline --trusted-key release.pub   on the offline machine",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bsub = p.add_subparsers(dest="bundle_command", metavar="ACTION")
    c = bsub.add_parser("create", help="write a bundle file")
    c.add_argument("-o", "--out", required=True, metavar="FILE", help="the bundle file to write (a tar)")
    c.add_argument("--stack", choices=["ggml", "torch"], default="ggml")
    c.add_argument("--backend", action="append", default=[], help="every target of this backend (cpu, cuda, vulkan, ...); repeatable")
    c.add_argument("--target", action="append", default=[], metavar="ID", help="the target with this id; repeatable")
    c.add_argument("--all", action="store_true", help="every target of the manifest")
    c.add_argument("--channel", action="append", default=[], metavar="NAME", help="the channel to bundle (when several are configured)")
    c.add_argument("--manifest", action="append", default=[], metavar="URL", help="bundle this manifest instead of a channel's")
    c.add_argument("--trusted-key", action="append", default=[], metavar="KEY", help="a public key that signs the manifest")
    c.add_argument("--offline", action="store_true", help="take the builds from the download cache only")
    c.add_argument("--hardware", metavar="FILE", help=argparse.SUPPRESS)
    c.add_argument("--replay", metavar="DIR", help=argparse.SUPPRESS)
    add_home_arguments(c)
    c.set_defaults(func=run_create)
    p.set_defaults(func=lambda args: _usage(p))


def _usage(p: argparse.ArgumentParser) -> int:
    p.print_help()
    return 2


def run_create(args: argparse.Namespace) -> int:
    from ..core.bundles import create_bundle

    s = settings_from(args)
    chosen = args.all or args.backend or args.target
    report = None if chosen else report_from(args, s)
    with progress_renderer(json_mode=args.json) as progress:
        summary = create_bundle(Path(args.out).expanduser(), settings=s, stack=args.stack, backends=args.backend,
                                targets=args.target, all_targets=args.all, report=report, on_progress=progress)
    emit(args, summary, f"wrote {summary.path} ({summary.bytes / MiB:.1f} MiB): channel {summary.channel} "
         f"({summary.source} version {summary.version}), target(s) {', '.join(summary.targets)}\n"
         f"  install it offline: accelstack install --bundle {summary.path} --offline")
    return 0
