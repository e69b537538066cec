"""`accelstack bundle create`: one file that installs a runtime on a machine with no network."""
from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from .. import core
from ..serde import plural, size_text
from .common import add_engine_package_argument, add_home_arguments, emit, needs_subcommand, report_from, settings_from_args
from .progress import progress_renderer

__all__ = ["register", "run_create"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bundle",
        help="make an offline bundle: a channel's signed manifest and its builds (or a torch plan's wheels) in one file",
        description="Offline and air-gapped machines: `bundle create` (on a machine with network access) writes one "
        "tar file with a channel's signed manifest, its signature and the builds of the chosen targets; "
        "`accelstack install --bundle FILE --offline` installs from it with no network, checking the signature "
        "and every hash as an online install does. With --stack torch it holds the wheels of the torch plan "
        "(downloaded with pip for the target's Python and platform, each sha256 in the bundle's index), installed "
        "with pip --no-index --require-hashes.",
        epilog="examples:\n"
        "  accelstack bundle create -o runtime.tar                     the build this machine would install\n"
        "  accelstack bundle create --backend cuda --backend cpu -o gpu-and-cpu.tar\n"
        "  accelstack install --bundle runtime.tar --offline --trusted-key release.pub   on the offline machine\n"
        "  accelstack bundle create --stack torch --venv .venv -o torch.tar 'torch==2.6.*'   the torch build for this machine\n"
        "  accelstack install --bundle torch.tar --venv .venv                             on the offline machine",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bsub = p.add_subparsers(dest="bundle_command", metavar="ACTION")
    c = bsub.add_parser("create", help="write a bundle file",
                        description="Write one tar file holding a channel's signed manifest and the builds of the "
                        "chosen targets (default: the one this machine would install), or with --stack torch the wheels "
                        "of the torch plan, for `accelstack install --bundle FILE` on a machine without network.",
                        epilog="examples:\n  accelstack bundle create -o runtime.tar\n"
                        "  accelstack bundle create --all -o every-target.tar\n"
                        "  accelstack bundle create --stack torch --venv .venv -o torch.tar 'torch==2.6.*'",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("-o", "--out", required=True, metavar="FILE", help="the bundle file to write (a tar)")
    c.add_argument("--stack", choices=["ggml", "torch"], default="ggml")
    c.add_argument("--backend", action="append", default=[], help="every target of this backend (cpu, cuda, vulkan, ...); repeatable")
    c.add_argument("--target", action="append", default=[], metavar="ID", help="the target with this id; repeatable")
    c.add_argument("--all", action="store_true", help="every target of the manifest")
    c.add_argument("--channel", action="append", default=[], metavar="NAME", help="the channel to bundle (when several are configured)")
    c.add_argument("--manifest", action="append", default=[], metavar="URL", help="bundle this manifest instead of a channel's")
    c.add_argument("--trusted-key", action="append", default=[], metavar="KEY", help="a public key that signs the manifest")
    c.add_argument("--offline", action="store_true", help="take the builds from the download cache only")
    c.add_argument("--python", dest="target_python", metavar="PATH", help="torch: the interpreter the bundle is for (its Python version)")
    c.add_argument("--venv", metavar="DIR", help="torch: the virtual environment the bundle is for (its Python version)")
    c.add_argument("--python-version", default="", metavar="X.Y", help="torch: the target's Python version (default: the target's)")
    c.add_argument("--platform", action="append", default=[], metavar="TAG",
                   help="torch: a pip platform tag of the target (manylinux_2_28_x86_64, win_amd64, ...; default: this "
                   "machine's); repeatable")
    add_engine_package_argument(c)
    c.add_argument("requirements", nargs="*", metavar="REQUIREMENT", help="torch: pins such as 'torch==2.6.*'")
    c.add_argument("--hardware", metavar="FILE", help=argparse.SUPPRESS)
    c.add_argument("--replay", metavar="DIR", help=argparse.SUPPRESS)
    add_home_arguments(c)
    c.set_defaults(func=run_create)
    p.set_defaults(func=needs_subcommand(p))



def run_create(args: argparse.Namespace) -> int:
    s = settings_from_args(args)  # --backend here picks the bundle's targets, it is not a Settings field
    chosen = (args.all or args.backend or args.target) and core.stack_info(args.stack).reads_channels  # targets of a manifest
    core.check_bundle_output(Path(args.out).expanduser())  # before detection, a download or a build
    report = None if chosen else report_from(args, s)
    with progress_renderer(json_mode=args.json) as progress:
        summary = core.create_bundle(Path(args.out).expanduser(), settings=s, stack=args.stack, backends=args.backend,
                                targets=args.target, all_targets=args.all, report=report, requirements=args.requirements,
                                python_version=args.python_version, platforms=args.platform, on_progress=progress)
    if summary.python:  # a torch bundle: wheels for one Python
        text = (f"wrote {summary.path} ({size_text(summary.bytes)}, sha256 {summary.sha256}): torch {summary.targets[0]} "
                f"for Python {summary.python}, {plural(len(summary.artifacts), 'wheel')}\n"
                f"  install it offline: accelstack install --bundle {shlex.quote(summary.path)} --venv DIR")
    else:
        text = (f"wrote {summary.path} ({size_text(summary.bytes)}, sha256 {summary.sha256}): channel {summary.channel} "
                f"({summary.source} version {summary.version}), {plural(len(summary.targets), 'target')}: {', '.join(summary.targets)}\n"
                f"  install it offline: accelstack install --bundle {shlex.quote(summary.path)} --offline"
                + "".join(f" --trusted-key {shlex.quote(k)}" for k in summary.trusted_keys))
    emit(args, summary, text)
    return 0
