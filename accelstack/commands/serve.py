"""`accelstack serve`: the library as a local HTTP service for apps, with a status page.

The command parses its arguments into one ``Settings`` and a ``ServiceConfig``, announces where
the service listens, logs each job's start and end on stderr (a line for people, or with
``--json`` a JSON line: stdout keeps only the ``ready`` and ``result`` lines, so an app that reads
one line never has to drain it), and blocks until it is stopped; the service itself is
:mod:`accelstack.service`'s. Errors go over the wire as the CLI's own error line.
"""
from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, Optional

from ..errors import UsageError
from ..events import iso_utc
from ..service.jobs import Job
from ..service.server import Ready, ServiceConfig, serve
from .common import (
    FORMAT_VERSION,
    add_home_arguments,
    add_manifest_arguments,
    emit,
    error_line,
    optional_path,
    report_from,
    settings_from_args,
)
from .progress_format import duration

__all__ = ["register", "run", "job_log", "job_log_line"]


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
    p.add_argument("--models-dir", metavar="DIR", help="models that generate jobs may use, named by their place in it (checkpoints/sd15.safetensors, unet/flux.gguf)")
    add_home_arguments(p)
    add_manifest_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    models_dir = _models_dir(args.models_dir)
    s = settings_from_args(args)
    config = ServiceConfig(settings=s, host=args.host, port=args.port, allow_remote=args.allow_remote,
                           cors_origins=list(args.cors_origin), parent_pid=args.parent_pid,
                           models_dir=models_dir, detector=lambda: report_from(args, s),
                           describe=lambda command, exc: json.loads(error_line(command, exc)),
                           on_job=lambda job: _log(job_log(job), bool(args.json)))

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


def _models_dir(value: Optional[str]) -> Optional[Path]:
    """``--models-dir``: a folder that is there, or a usage error before the service starts (a typo
    would otherwise surface only as "unknown model" on the first generate job)."""
    path = optional_path(value)
    if path is not None and not path.is_dir():
        what = "does not exist" if not path.exists() else "is not a folder"
        raise UsageError(f"--models-dir {value} {what}",
                         "name the folder that holds the model files generate jobs may use")
    return path


def job_log(job: Job) -> Dict[str, Any]:
    """What the serve log says of a job that started or ended: the JSON line of ``serve --json``."""
    info = job.summary()
    seconds = _seconds(info["started_at"], info["finished_at"]) if info["finished_at"] else None
    error = info.get("error") or {}
    return {"event": "job", "command": "serve", "ts": iso_utc(datetime.now(timezone.utc).timestamp()), "job": job.id,
            "kind": job.kind, "state": info["state"], "seconds": seconds, "verdict": _verdict(info.get("result")),
            "code": error.get("code"), "message": error.get("message"), "hint": error.get("hint")}


def job_log_line(entry: Dict[str, Any]) -> str:
    """The same for people: ``<time>  job <id>  <kind> started``, then ``<kind> <state> in <duration>:
    <verdict, or the error and its hint>``."""
    state = "started" if entry["state"] == "running" else entry["state"]
    head = f"{entry['ts']}  job {entry['job']}  {entry['kind']} {state}"
    if entry["seconds"] is not None:
        head += f" {'after' if entry['state'] == 'cancelled' else 'in'} {duration(entry['seconds'])}"
    if entry["verdict"]:
        head += f": {entry['verdict']}"
    elif entry["message"] and entry["state"] != "cancelled":
        head += f": {entry['message']}" + (f" ({entry['hint']})" if entry["hint"] else "")
    return head


def _log(entry: Dict[str, Any], as_json: bool) -> None:
    text = json.dumps(entry, separators=(",", ":")) if as_json else job_log_line(entry)
    print(text, file=sys.stderr, flush=True)


def _seconds(start: str, end: str) -> Optional[float]:
    try:
        a, b = (datetime.strptime(t, "%Y-%m-%dT%H:%M:%S.%fZ") for t in (start, end))
    except ValueError:  # cancelled before it started: no start time
        return None
    return round((b - a).total_seconds(), 3)


def _verdict(result: Any) -> Optional[str]:
    """The verify verdict a job's result carries: verify's own, or that of an install's check."""
    if not isinstance(result, dict):
        return None
    for holder in (result, result.get("verification"), (result.get("receipt") or {}).get("verification")):
        if isinstance(holder, dict) and isinstance(holder.get("verdict"), str):
            return str(holder["verdict"])
    return None
