"""`accelstack serve`: the library as a local HTTP service for apps, with a status page.

The command parses its arguments into one ``Settings`` and a ``ServiceConfig``, announces where
the service listens, and blocks until it is stopped; the service itself is
:mod:`accelstack.service`'s.
"""
from __future__ import annotations

import argparse
import json
import sys

from ..service.server import Ready, ServiceConfig, serve
from .common import (
    FORMAT_VERSION,
    add_home_arguments,
    add_manifest_arguments,
    emit,
    optional_path,
    report_from,
    settings_from_args,
)

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="run accelstack as a local HTTP service (JSON API + status page) for apps",
        description="Serve the accelstack API on 127.0.0.1: hardware report, plans, status, and install / repair / "
        "upgrade / verify / generate as jobs with live progress (Server-Sent Events). Every request needs the token "
        "written to the token file at start; the status page gets it from the URL printed here. Runs until stopped "
        "(Ctrl-C or SIGTERM cancel running jobs cleanly).",
        epilog="examples:\n"
        "  accelstack serve                          any free port; open the printed URL in a browser\n"
        "  accelstack serve --port 8765 --json       for an app: one JSON line {\"url\", \"token_file\"}\n"
        "  accelstack serve --parent-pid $$          stop when the app that started it ends\n"
        "see docs/serve.md for the API.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--port", type=int, default=0, metavar="N", help="port to listen on (default 0: any free port)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; others need --allow-remote)")
    p.add_argument("--allow-remote", action="store_true", help="allow a non-loopback address (the token is still required)")
    p.add_argument("--parent-pid", type=int, default=None, metavar="PID", help="stop when the process PID ends")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="a web origin (http://localhost:3000) whose pages may call the API. Repeatable.")
    p.add_argument("--models-dir", metavar="DIR", help="models that generate jobs may use, named by file name")
    add_home_arguments(p)
    add_manifest_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    s = settings_from_args(args)
    config = ServiceConfig(settings=s, host=args.host, port=args.port, allow_remote=args.allow_remote,
                           cors_origins=list(args.cors_origin), parent_pid=args.parent_pid,
                           models_dir=optional_path(args.models_dir), detector=lambda: report_from(args, s))

    def announce(ready: Ready) -> None:
        if args.json:  # an event line (the result line comes when the service stops)
            print(json.dumps({"event": "ready", "format_version": FORMAT_VERSION, "command": "serve",
                              **ready.to_dict(), "page_url": ready.page_url}), flush=True)
            return
        print(f"accelstack service listening on {ready.url}\n"
              f"  status page: {ready.page_url}\n"
              f"  token file:  {ready.token_file} (send 'Authorization: Bearer <token>')\n"
              "  stop with Ctrl-C", flush=True)

    stopped = serve(config, announce)
    text = f"accelstack service stopped ({stopped.reason})" + ("" if stopped.clean else "; a job was still ending")
    print(text, file=sys.stderr, flush=True)  # for people, also beside a --json result line
    if args.json:
        emit(args, stopped, "")
    return 0
