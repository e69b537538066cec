"""The `accelstack` command: a thin layer that parses arguments, calls the library, and prints.

Each subcommand lives in ``accelstack/commands/<name>.py`` with ``register(subparsers)``; it sets
``func(args) -> int`` on its parser. Only this layer prints; errors become messages with a hint
and an exit code, never tracebacks (``--debug`` or ``ACCELSTACK_DEBUG=1`` shows them).

Exit codes, the same for every command (docs/json.md): 0 ok, 1 failure, 2 usage error,
3 cannot be done on this machine, 130 interrupted. With ``--json`` (before or after the
subcommand) stdout holds JSON Lines only: events, then one ``result`` or ``error`` line.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import List, Optional, Tuple

from . import __version__
from .errors import AccelstackError, UsageError

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
  accelstack install           install the runtime that fits, and check it generates
  accelstack verify            check the installed runtime again

every command accepts --json (JSON Lines for apps, docs/json.md), -q, -v and --debug;
see `accelstack COMMAND --help`. Shell completion: `accelstack completion bash|zsh|fish`.
exit codes: 0 ok, 1 failure, 2 usage error, 3 cannot be done on this machine, 130 interrupted.
"""

# Flags every command accepts, before or after its name. The top-level copies have their own
# dests (an argparse subparser would overwrite a shared dest with its default) and are merged
# into ``json``/``verbosity``/``debug`` after parsing.
GLOBAL_FLAGS = {
    "--json": dict(action="store_true", help="JSON Lines on stdout: events, then one result or error line"),
    "-q": dict(action="count", help="less output: no progress, only the answer and errors"),
    "-v": dict(action="count", help="more output (repeatable)"),
    "--debug": dict(action="store_true", help="show tracebacks and debug logs (or ACCELSTACK_DEBUG=1)"),
}
LONG_NAMES = {"-q": "--quiet", "-v": "--verbose"}


class ParseError(Exception):
    """argparse refused the command line; ``main`` reports it as a usage error (exit 2)."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser
        self.message = message


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors reach ``main`` (so ``--json`` gets an error line too)."""

    def error(self, message: str):
        raise ParseError(self, message)


def _flag_names(flag: str) -> List[str]:
    return [flag] + ([LONG_NAMES[flag]] if flag in LONG_NAMES else [])


def _add_global_flags(p: argparse.ArgumentParser, top: bool) -> None:
    """Add the global flags ``p`` does not define itself. On subcommands they default to
    SUPPRESS, so a flag given before the subcommand is not reset by the subcommand's default."""
    for flag, kw in GLOBAL_FLAGS.items():
        names = [n for n in _flag_names(flag) if n not in p._option_string_actions]
        if len(names) != len(_flag_names(flag)):
            continue  # the command defines it (or its short form) itself
        dest = "g_" + flag.lstrip("-") if top else {"-q": "quiet", "-v": "verbose"}.get(flag, flag.lstrip("-"))
        p.add_argument(*names, dest=dest, default=None if top else argparse.SUPPRESS, **kw)  # type: ignore[arg-type]


def subparsers_of(parser: argparse.ArgumentParser) -> List[Tuple[str, argparse.ArgumentParser]]:
    """Every (command path, parser) below ``parser``: ``[("detect", p), ("channel add", p)...]``."""
    found: List[Tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sp in action.choices.items():
                found.append((name, sp))
                found += [(f"{name} {n}", p) for n, p in subparsers_of(sp)]
    return found


def build_parser(command: Optional[str] = None) -> argparse.ArgumentParser:
    """The parser; with ``command``, only the module that registers it is imported."""
    parser = Parser(
        prog="accelstack",
        description="Find this machine's accelerator, pick the image-generation runtime that runs on it, "
        "install it safely and prove it works.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-V", "--version", action="version", version=f"accelstack {__version__}")
    _add_global_flags(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    modules = [COMMANDS[command]] if command in COMMANDS else COMMAND_MODULES
    for name in modules:
        importlib.import_module(name).register(sub)
    for _, sp in subparsers_of(parser):
        _add_global_flags(sp, top=False)
    return parser


def _merge_global_flags(args: argparse.Namespace) -> None:
    """``json``, ``verbosity`` (-1 quiet, 0, 1+ verbose) and ``debug`` from wherever they were given."""
    args.json = bool(getattr(args, "json", False) or getattr(args, "g_json", False))
    quiet = (getattr(args, "quiet", None) or 0) + (getattr(args, "g_q", None) or 0)
    verbose = (getattr(args, "verbose", None) or 0) + (getattr(args, "g_v", None) or 0)
    args.quiet = quiet > 0
    args.verbosity = -1 if quiet else verbose
    args.debug = bool(getattr(args, "debug", False) or getattr(args, "g_debug", False)
                      or os.environ.get("ACCELSTACK_DEBUG"))
    for dest in ("g_json", "g_q", "g_v", "g_debug"):
        if hasattr(args, dest):
            delattr(args, dest)


def _configure_output(args: argparse.Namespace) -> None:
    """Verbosity to the progress renderer, and library logs on stderr when asked for."""
    from .commands import progress

    configure = getattr(progress, "configure", None)
    if configure is not None:
        configure(args.verbosity)
    level = os.environ.get("ACCELSTACK_LOG", "").upper() or ("DEBUG" if args.debug else "")
    if level:  # the library logs diagnostics; show them on stderr when asked
        import logging

        logging.basicConfig(level=getattr(logging, level, logging.DEBUG), format="%(asctime)s %(name)s %(levelname)s %(message)s")


def _print_error(args_json: bool, command: str, exc: AccelstackError) -> None:
    from .commands.common import error_line, render_action

    if args_json:
        sys.stdout.write(error_line(command, exc) + "\n")
        sys.stdout.flush()
        return
    run = render_action(exc.action.value)
    print(f"accelstack: error: {exc.message}", file=sys.stderr)
    if exc.hint:
        print(f"  what to do: {exc.hint}", file=sys.stderr)
    if run:
        print(f"  {'run: ' if run.startswith('accelstack') else ''}{run}", file=sys.stderr)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    first = next((a for a in argv if not a.startswith("-")), None)
    command = first if first in COMMANDS else ""
    if not command and argv[:1] in (["-V"], ["--version"]):  # without building every command's parser
        print(f"accelstack {__version__}")
        return 0
    parser = build_parser(command or None)
    try:
        args = parser.parse_args(argv)
    except ParseError as exc:  # a usage error: exit 2, as an error line with --json
        if "--json" in argv:
            _print_error(True, command, UsageError(exc.message, f"see `{exc.parser.prog} --help`"))
        else:
            exc.parser.print_usage(sys.stderr)
            print(f"{exc.parser.prog}: error: {exc.message}", file=sys.stderr)
        return 2
    _merge_global_flags(args)
    if not getattr(args, "func", None):
        if args.json:
            _print_error(True, command, UsageError("no command given", "see `accelstack --help`"))
        else:
            parser.print_help()
        return 2
    _configure_output(args)
    try:
        return int(args.func(args) or 0)
    except AccelstackError as exc:
        if args.debug:
            raise
        _print_error(args.json, str(args.command or ""), exc)
        return exc.exit_code
    except KeyboardInterrupt:
        from .errors import Interrupted

        _print_error(args.json, str(args.command or ""), Interrupted("interrupted"))
        return 130
