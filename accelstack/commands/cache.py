"""`accelstack cache list | purge`: what accelstack keeps in its caches, and removing it."""
from __future__ import annotations

import argparse
import sys
from typing import List

from ..core.caches import CACHES, cache_infos, purge
from ..errors import UsageError
from ..serde import plural, size_text
from .common import emit, printable, settings_from_args

__all__ = ["register", "run_list", "run_purge"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "cache",
        help="list and purge the download, build, probe, verify, detect and service caches",
        description="accelstack keeps these caches: downloads (verified runtime "
        "archives), builds (ggml runtimes compiled here, and their source), probe (the verify probe model's "
        "value pools), verify (verify's probe images, and the records that let a later verify generate once), "
        "detect (the kept Vulkan enumeration) and service (the job folders of services that have stopped). "
        "Everything in them can be made again. `list` shows where each is and how much it holds; `purge` removes "
        "what accelstack wrote there, and nothing else (no links, no files of yours, never the runtime home).",
        epilog="examples:\n"
        "  accelstack cache list\n"
        "  accelstack cache list --json\n"
        "  accelstack cache purge --dry-run              what purging everything would free\n"
        "  accelstack cache purge probe --yes            remove the verify probe\n"
        "  accelstack cache purge builds                 asks first (on a terminal)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    csub = p.add_subparsers(dest="cache_command", metavar="ACTION")
    ls = csub.add_parser(
        "list", help="each cache: where it is, its size and entries",
        description="Where each cache is, how many entries accelstack wrote there and how much space they take.",
        epilog="examples:\n  accelstack cache list\n  accelstack cache list -v        every entry\n"
        "  accelstack cache list --json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ls.add_argument("--home", metavar="DIR", help=argparse.SUPPRESS)
    ls.set_defaults(func=run_list)
    pg = csub.add_parser(
        "purge", help="remove what accelstack wrote in a cache",
        description="Remove accelstack's entries from one cache, or all. Never removes a symbolic link or what "
        "it points to, a file accelstack did not write, the runtime home, or an entry another accelstack process "
        "is using; lock files stay. Installed runtimes keep working: a later install or repair downloads, builds "
        "or synthesizes again what it needs.",
        epilog="examples:\n  accelstack cache purge --dry-run\n  accelstack cache purge downloads --yes\n"
        "  accelstack cache purge all --yes --json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    pg.add_argument("which", nargs="?", default="all", choices=[*CACHES, "all"],
                    help="the cache to purge (default: all)")
    pg.add_argument("--yes", "-y", action="store_true", help="do not ask (needed when not on a terminal)")
    pg.add_argument("--dry-run", action="store_true", help="say what would be removed and how much it frees; remove nothing")
    pg.add_argument("--home", metavar="DIR", help="the runtime home (never removed, even inside a cache)")
    pg.set_defaults(func=run_purge)
    p.set_defaults(func=lambda args: _usage(p))


def _usage(p: argparse.ArgumentParser) -> int:
    raise UsageError("say what to do: `accelstack cache list` or `accelstack cache purge`",
                     "see `accelstack cache --help`")


def run_list(args: argparse.Namespace) -> int:
    infos = cache_infos(settings_from_args(args))
    lines: List[str] = []
    for info in infos:
        state = "" if info.exists else " (not created yet)"
        lines.append(f"{info.name:<10} {size_text(info.size):>9}  {plural(info.count, 'entry', 'entries')}  {info.path}{state}")
        lines.append(f"{'':<10} {info.description}")
        if getattr(args, "verbosity", 0) > 0:
            lines += [f"{'':<12}{e.name}  {size_text(e.size)}  ({e.kind})" for e in info.entries]
        lines += [f"{'':<10} left alone: {printable(n)} ({w})" for n, w in info.written_by.items()]
        other = [printable(n) for n in info.other if n not in info.written_by]
        if other:
            lines.append(f"{'':<10} left alone (not written by accelstack): {', '.join(other[:5])}"
                         + (f" and {len(other) - 5} more" if len(other) > 5 else ""))
    total = sum(i.size for i in infos)
    lines.append(f"total {size_text(total)}; remove with `accelstack cache purge [{'|'.join(CACHES)}|all]`")
    emit(args, {"caches": infos, "total_size": total}, "\n".join(lines))
    return 0


def _confirm(question: str) -> bool:
    sys.stderr.write(question + " [y/N] ")
    sys.stderr.flush()
    try:
        answer = input()
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def run_purge(args: argparse.Namespace) -> int:
    s = settings_from_args(args)
    which = list(CACHES) if args.which == "all" else [args.which]
    if not args.dry_run and not args.yes:
        if not sys.stdin.isatty():
            raise UsageError("cache purge needs --yes when it cannot ask (not on a terminal)",
                             "add --yes, or --dry-run to see what would be removed")
        infos = cache_infos(s, which)
        listing = ", ".join(f"{i.name} {size_text(i.size)} ({i.path})" for i in infos)
        if not _confirm(f"remove accelstack's entries from: {listing}?"):
            emit(args, {"dry_run": False, "caches": which, "bytes_freed": 0, "removed": [], "kept": [],
                        "cancelled": True}, "nothing removed", ok=False)
            return 1
    report = purge(which, s, dry_run=args.dry_run)
    verb = "would free" if report.dry_run else "freed"
    text = [f"{verb} {size_text(report.bytes_freed)} from {', '.join(which)}: {len(report.removed)} "
            f"entr{'y' if len(report.removed) == 1 else 'ies'} {'to remove' if report.dry_run else 'removed'}"]
    if getattr(args, "verbosity", 0) > 0:
        text += [f"  {'would remove' if report.dry_run else 'removed'} {p}" for p in report.removed]
    text += [f"  kept {k}" for k in report.kept]
    emit(args, {**report.__dict__, "cancelled": False}, "\n".join(text))
    return 0
