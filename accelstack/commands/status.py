"""`accelstack status`: what is installed and active, and whether it still fits this machine.

Its own module (not beside install, repair and upgrade) so that reading the state imports no
install, download or engine code: tests/test_import_cost.py pins what it may import.
"""
from __future__ import annotations

import argparse
import textwrap

from .. import core
from .common import add_home_arguments, add_manifest_arguments, emit, report_from, settings_from_args
from .progress import progress_renderer
from .status_text import is_damaged, status_text

__all__ = ["register", "run_status"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "status", help="what is installed and active, and whether it still fits this machine",
        description=textwrap.fill(
            "List the installed runtimes per stack: the active one and the previous one (for rollback), "
            "where each came from (channel, manifest version, package version), whether its files are unchanged since "
            "install (their size, mtime and inode compared with the receipt, not re-hashed; --deep re-hashes every "
            "file), whether it still fits this machine's hardware and driver, and whether a newer build is published. "
            "Reads only.", 92),
        epilog="examples:\n"
        "  accelstack status\n"
        "  accelstack status --deep                          re-hash every installed file against its receipt\n"
        "  accelstack status --json                          one result line for an app\n"
        "  accelstack status --offline                       without checking the channels for upgrades",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--deep", action="store_true", help="re-hash every file of the active runtimes against their "
                   "receipts (slower: reads every byte) instead of comparing size, mtime and inode")
    add_home_arguments(p)
    add_manifest_arguments(p, installs=False)
    p.set_defaults(func=run_status)


def run_status(args) -> int:
    s = settings_from_args(args)
    with progress_renderer(json_mode=args.json) as progress:  # only --deep reports progress (the hashing)
        stats = core.status(report=report_from(args, s), settings=s, deep=args.deep, on_progress=progress)
    damaged = [st.stack for st in stats if is_damaged(st)]
    emit(args, {"home": str(s.home), "stacks": stats}, status_text(s.home, stats), ok=not damaged)
    return 1 if damaged else 0  # docs/json.md: a damaged state is a negative verdict (ok false, exit 1)
