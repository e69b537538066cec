"""The `accelstack` command: a thin layer that parses arguments, calls the library, and prints.

Each subcommand lives in ``accelstack/commands/<name>.py`` with ``register(subparsers)``; it sets
``func(args) -> int`` on its parser. Only this layer prints; errors become messages with a hint
and an exit code, never tracebacks (``ACCELSTACK_DEBUG=1`` shows them).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import List, Optional

from . import __version__
from .errors import AccelstackError

# One line per subcommand module, in the order `--help` lists them.
COMMAND_MODULES = [
    "accelstack.commands.detect",
    "accelstack.commands.verify",
    "accelstack.commands.generate",
    "accelstack.commands.plan",
    "accelstack.commands.install",
    "accelstack.commands.build",
    "accelstack.commands.fetch",
    "accelstack.commands.manifest",
    "accelstack.commands.serve",
    "accelstack.commands.channel",
    "accelstack.commands.bundle",
    "accelstack.commands.cache",
    "accelstack.commands.doctor",
    "accelstack.commands.completion",
]
# Which module registers each command: running one command imports only its module, so a
# no-op `accelstack install` does not pay for the engine's or the publisher's imports.
COMMANDS = {
    "detect": "accelstack.commands.detect",
    "verify": "accelstack.commands.verify",
    "generate": "accelstack.commands.generate",
    "plan": "accelstack.commands.plan",
    **{c: "accelstack.commands.install" for c in ("install", "status", "repair", "upgrade", "rollback", "uninstall", "gc")},
    "build": "accelstack.commands.build",
    "fetch": "accelstack.commands.fetch",
    "manifest": "accelstack.commands.manifest",
    "serve": "accelstack.commands.serve",
    "channel": "accelstack.commands.channel",
    "bundle": "accelstack.commands.bundle",
    "cache": "accelstack.commands.cache",
    "doctor": "accelstack.commands.doctor",
    "completion": "accelstack.commands.completion",
}

EPILOG = """\
first run on a new machine:
  accelstack detect            what accelerators this machine has, and what to use
  accelstack detect --json     the same as a JSON HardwareReport

every command accepts --json for machine-readable output; see `accelstack COMMAND --help`.
"""


def build_parser(command: Optional[str] = None) -> argparse.ArgumentParser:
    """The parser; with ``command``, only the module that registers it is imported."""
    parser = argparse.ArgumentParser(
        prog="accelstack",
        description="Find this machine's accelerator, pick the image-generation runtime that runs on it, "
        "install it safely and prove it works.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"accelstack {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = [COMMANDS[command]] if command in COMMANDS else COMMAND_MODULES
    for name in modules:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    first = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(first if first in COMMANDS else None)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    level = os.environ.get("ACCELSTACK_LOG", "").upper() or ("DEBUG" if os.environ.get("ACCELSTACK_DEBUG") else "")
    if level:  # the library logs diagnostics; show them on stderr when asked
        import logging

        logging.basicConfig(level=getattr(logging, level, logging.DEBUG), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return int(args.func(args) or 0)
    except AccelstackError as exc:
        if os.environ.get("ACCELSTACK_DEBUG"):
            raise
        from .commands.common import render_action

        command = render_action(exc.action.value)
        if getattr(args, "json", False):
            print(json.dumps({"error": type(exc).__name__, "code": exc.code, "message": exc.message, "hint": exc.hint,
                              "action": exc.action.value, "command": command}))
        else:
            print(f"accelstack: error: {exc.message}", file=sys.stderr)
            if exc.hint:
                print(f"  what to do: {exc.hint}", file=sys.stderr)
            if command:
                print(f"  {'run: ' if command.startswith('accelstack') else ''}{command}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("accelstack: interrupted", file=sys.stderr)
        return 130
