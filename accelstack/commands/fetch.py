"""`accelstack fetch`: download one file into the verified cache (for publishers and debugging)."""
from __future__ import annotations

import argparse
import os

from ..core.downloads import check_sha256, fetch_file
from ..errors import UsageError
from ..refs import ArtifactRef
from .common import emit, settings_from_args
from .progress import progress_renderer

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fetch",
        help="download a file by URL and sha256 into the verified cache",
        description="Download one file, known by its sha256 and size, from URL (and mirror URLs, tried in "
        "order) into accelstack's content-addressed cache, resuming a partial download and verifying the "
        "hash while streaming. Prints the cached path. Only https:// URLs are accepted (http:// on "
        "loopback and file:// for local mirrors).",
        epilog="examples:\n"
        "  accelstack fetch https://example.org/model.gguf --sha256 HEX --size 4368439584\n"
        "  accelstack fetch URL MIRROR_URL --sha256 HEX --size N --json   progress as JSON lines\n"
        "  accelstack fetch URL --sha256 HEX --size N --offline          only check the cache\n"
        "environment: ACCELSTACK_CACHE (cache directory), ACCELSTACK_OFFLINE=1 (no network)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("urls", nargs="+", metavar="URL", help="where to download from; extra URLs are mirrors")
    p.add_argument("--sha256", required=True, metavar="HEX", help="expected sha256 (64 hex digits)")
    p.add_argument("--size", required=True, type=int, metavar="BYTES", help="expected size in bytes")
    p.add_argument("--name", help="name for progress and messages (default: last part of the URL)")
    p.add_argument("--cache", metavar="DIR", help="cache directory (default: $ACCELSTACK_CACHE or the user cache dir)")
    p.add_argument("--offline", action="store_true", help="use only the cache; never touch the network")
    p.add_argument("--deep", action="store_true",
                   help="re-hash a cached copy even when its size, mtime and inode match its last check")
    p.add_argument("--connect-timeout", type=float, default=15.0, metavar="S", help="connect timeout (default 15 s)")
    p.add_argument("--read-timeout", type=float, default=60.0, metavar="S", help="read timeout (default 60 s)")
    p.add_argument("--retries", type=int, default=4, metavar="N", help="retries per mirror without progress (default 4)")
    p.add_argument("--json", action="store_true", help="progress as JSON lines, then a result line")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    sha = args.sha256.strip().lower()
    try:
        check_sha256(sha)
    except ValueError as exc:
        raise UsageError(f"--sha256: {exc}") from None
    if args.size < 0:
        raise UsageError("--size must be >= 0")
    if args.connect_timeout <= 0 or args.read_timeout <= 0:
        raise UsageError("timeouts must be positive")
    if args.retries < 0:
        raise UsageError("--retries must be >= 0")
    name = args.name or os.path.basename(args.urls[0].rstrip("/").split("?")[0]) or sha[:12]
    ref = ArtifactRef(name=name, sha256=sha, size=args.size, urls=list(args.urls))
    s = settings_from_args(args)  # --cache, --offline
    with progress_renderer(json_mode=args.json) as progress:
        path = fetch_file(ref, s, connect_timeout=args.connect_timeout, read_timeout=args.read_timeout,
                          retries=args.retries, deep=args.deep, progress=progress)
    emit(args, {"name": name, "sha256": sha, "size": args.size, "path": str(path)}, str(path))
    return 0
