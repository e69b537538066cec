"""The `accelstack` command: a thin layer that parses arguments, calls the library, and prints.

Each subcommand lives in ``accelstack/commands/<name>.py`` with ``register(subparsers)``; it sets
``func(args) -> int`` on its parser (``args.parser`` is the parser that read the line), and has its
line in :data:`COMMAND_TABLE`. Only this layer prints; errors become messages with a hint and an
exit code, never tracebacks (``--debug`` or ``ACCELSTACK_DEBUG=1`` shows them).

Exit codes, the same for every command (docs/json.md): 0 ok, 1 failure, 2 usage error,
3 cannot be done on this machine, 130 interrupted (Ctrl-C), 141 the reader closed the pipe, 143
terminated (SIGTERM, handled like Ctrl-C: cleaned up, the state said). With
``--json`` (before or after the subcommand) stdout holds JSON Lines only: events, then one
``result`` or ``error`` line.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import os
import signal
import sys
from types import ModuleType
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, cast

from . import __version__
from .errors import SIGTERM_EXIT, AccelstackError, Interrupted, Terminated, UsageError

__all__ = ["BUILD_WIDTH", "COMMAND_TABLE", "COMMANDS", "COMMAND_MODULES", "EPILOG", "GLOBAL_FLAGS", "ParseError", "Parser",
           "build_parser", "subparsers_of", "main"]

# Every command, in the order `--help` lists them: its name, the module under accelstack.commands
# that registers it, and its one-line help. `accelstack --help` is built from this table alone, and
# running a command imports only its module, so a no-op `accelstack install` does not pay for the
# engine's or the publisher's imports. tests/test_completion.py checks each line against the help
# its module registers, so the two cannot drift apart.
COMMAND_TABLE: Tuple[Tuple[str, str, str], ...] = (
    ("detect", "detect", "report this machine's CPU, GPUs, drivers and usable accelerator APIs"),
    ("verify", "verify", "prove that a runtime generates on this machine (synthesized probe model, no download)"),
    ("generate", "generate", "generate images from a prompt with a model file (headless)"),
    ("model", "model", "inspect a model file: its family, size, weight types, and the companion files it still needs"),
    ("plan", "plan", "decide which torch or ggml build to install here, with the reasons"),
    ("install", "install", "first run: detect, plan, fetch, install, verify and activate a runtime"),
    ("repair", "install", "rebuild a damaged state file, restore missing or corrupt runtime files, re-verify"),
    ("upgrade", "install", "install the newest fitting runtime side by side, verify it, switch"),
    ("rollback", "install", "switch back to the previous runtime"),
    ("uninstall", "install", "remove the installed ggml runtimes"),
    ("gc", "install", "remove inactive runtimes (keeping the previous one) and unused downloads"),
    ("status", "status", "what is installed and active, and whether it still fits this machine"),
    ("build", "build", "compile a ggml runtime wheel for one backend variant (for publishers)"),
    ("fetch", "fetch", "download a file by URL and sha256 into the verified cache"),
    ("manifest", "manifest", "create signing keys, sign and verify manifests (for publishers)"),
    ("serve", "serve", "run accelstack as a local HTTP service (JSON API + status page) for apps"),
    ("channel", "channel", "list, add and remove channels: where signed prebuilt runtimes come from"),
    ("bundle", "bundle", "make an offline bundle: a channel's signed manifest and its builds (or a torch plan's "
     "wheels) in one file"),
    ("cache", "cache", "list and purge the download, build, probe, verify, detect and service caches"),
    ("doctor", "doctor", "everything a support request needs: versions, paths, channels, runtimes, caches, tools, "
     "hardware"),
    ("completion", "completion", "print a shell completion script (bash, zsh, fish or PowerShell)"),
)
# Which module registers each command, and each module once, in the order of the table.
COMMANDS: Dict[str, str] = {name: f"accelstack.commands.{module}" for name, module, _ in COMMAND_TABLE}
COMMAND_MODULES: List[str] = list(dict.fromkeys(COMMANDS.values()))
# `completion` describes every command, so it is the one that imports them all.
LOADS_ALL = "completion"

EPILOG = """\
first run on a new machine:
  accelstack detect            what accelerators this machine has, and what to use
  accelstack install           install the runtime that fits, and check it generates
  accelstack verify            check the installed runtime again

every command accepts --json (JSON Lines for apps, docs/json.md), -q, -v and --debug;
see `accelstack COMMAND --help`. Shell completion: `accelstack completion bash|zsh|fish|powershell`.
exit codes: 0 ok, 1 failure, 2 usage error, 3 cannot be done on this machine, 130 interrupted,
143 terminated (SIGTERM).
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


# The width of the formatters argparse makes while the parser is built (to check each argument's
# metavar, to name a subcommand group's prog): nothing they format is printed.
BUILD_WIDTH = 78


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors reach ``main`` (so ``--json`` gets an error line too).

    argparse makes a formatter on every ``add_argument``, and a formatter given no width asks
    ``shutil`` for the terminal's (importing shutil loads bz2 and lzma: ~1.5 ms of every cold
    ``accelstack detect --json``). Only the help and usage that are printed need that width, so
    only they ask for it, as argparse does: their text is the same as argparse's own."""

    _printing = False

    def error(self, message: str):
        raise ParseError(self, message)

    def _get_formatter(self) -> argparse.HelpFormatter:
        if self._printing:
            return super()._get_formatter()
        make = cast("Callable[..., argparse.HelpFormatter]", self.formatter_class)  # typeshed's names prog alone
        return make(prog=self.prog, width=BUILD_WIDTH)

    def format_help(self) -> str:
        self._printing = True
        try:
            return super().format_help()
        finally:
            self._printing = False

    def format_usage(self) -> str:
        self._printing = True
        try:
            return super().format_usage()
        finally:
            self._printing = False


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


def build_parser(command: Optional[str] = None, *, load: bool = True) -> argparse.ArgumentParser:
    """The parser. With ``command``, only the module that registers it is imported (``completion``:
    every one, since it describes them all); without, every module, or with ``load=False`` (what
    ``accelstack --help`` and a mistyped command need) none: one placeholder per command, from
    :data:`COMMAND_TABLE`, so the help still lists them all."""
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
    if command is None and not load:
        for name, _, help_line in COMMAND_TABLE:
            sub.add_parser(name, help=help_line)
    else:
        modules = [COMMANDS[command]] if command in COMMANDS and command != LOADS_ALL else COMMAND_MODULES
        for module in modules:
            importlib.import_module(module).register(sub)
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
    args.debug = bool(getattr(args, "debug", False) or getattr(args, "g_debug", False))
    for dest in ("g_json", "g_q", "g_v", "g_debug"):
        if hasattr(args, dest):
            delattr(args, dest)


def _shared() -> ModuleType:
    """``accelstack.commands.common``, loaded once a command runs or an error is reported: the one
    import this module defers, so ``--version`` and ``--help`` load no command code."""
    from .commands import common

    return common


def _print_error(args_json: bool, command: str, exc: AccelstackError, argv: Optional[List[str]] = None,
                 parser: Optional[argparse.ArgumentParser] = None) -> None:
    """The error, with ``run`` the command line as typed plus the flag its action adds, where the
    command takes it (``argv`` and ``parser``)."""
    common = _shared()
    if args_json:
        sys.stdout.write(common.error_line(command, exc, argv, parser) + "\n")
        sys.stdout.flush()
        return
    hint, run = common.hint_of(exc, argv, parser), common.run_command(exc.action.value, argv, parser, exc.stack)
    # messages quote file names and argv: for people, control characters (ESC...) as escapes
    print(f"accelstack: error: {common.printable(exc.message, lines=True)}", file=sys.stderr)
    if hint:
        print(f"  what to do: {common.printable(hint)}", file=sys.stderr)
    if run:
        print(f"  run: {common.printable(run)}", file=sys.stderr)


# what a shell reports for a command whose reader went away (128 + SIGPIPE): `accelstack plan | head -1`
CLOSED_PIPE = 141


def _terminated(signum: int, frame: Any) -> None:
    """SIGTERM becomes :class:`Terminated` where the program is, as SIGINT becomes KeyboardInterrupt;
    a second one ends the process at once, as the default would."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise Terminated()


@contextlib.contextmanager
def _sigterm_like_ctrl_c() -> Iterator[None]:
    """While a command runs, SIGTERM cleans up and reports like Ctrl-C (an app's installer stops
    accelstack with ``Popen.terminate()``). A handler someone else set (an embedding app) is kept."""
    mine = False
    try:
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _terminated)
            mine = True
    except ValueError:  # not the main thread: signals are not this thread's to handle
        pass
    try:
        yield
    finally:
        if mine:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def main(argv: Optional[List[str]] = None) -> int:
    """Run one command; its exit code. A reader that closed the pipe early ends it quietly
    (:data:`CLOSED_PIPE`), as `yes | head -1` does: no traceback, no complaint at exit. SIGTERM
    is handled like Ctrl-C, with its own status (:data:`~accelstack.errors.SIGTERM_EXIT`)."""
    try:
        with _sigterm_like_ctrl_c():
            code = _main(argv)
        sys.stdout.flush()  # what is still buffered fails here, not at interpreter exit
        return code
    except Terminated:  # before a command ran (or after it said its last line)
        return SIGTERM_EXIT
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)  # the exit's own flush has nowhere to fail now
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return CLOSED_PIPE


def entry() -> None:
    """The ``accelstack`` program (and ``python -m accelstack``): :func:`main`, then the exit. The
    interpreter's teardown would first run the garbage collector over every object the run made
    (25 ms after a generate, on each image); they are frozen out of its reach instead, as nothing
    needs collecting now (files are closed, output flushed, atexit hooks still run)."""
    code = main()
    gc.freeze()
    sys.exit(code)


def _main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    first = next((a for a in argv if not a.startswith("-")), None)
    command = first if first in COMMANDS else ""
    if not command and argv[:1] in (["-V"], ["--version"]):  # without building every command's parser
        print(f"accelstack {__version__}")
        return 0
    parser = build_parser(command or None, load=False)
    try:
        args = parser.parse_args(argv)
    except ParseError as exc:  # a usage error: exit 2, as an error line with --json
        if "--json" in argv:
            _print_error(True, command, UsageError(exc.message, f"see `{exc.parser.prog} --help`"))
        else:
            exc.parser.print_usage(sys.stderr)
            print(f"{exc.parser.prog}: error: {_shared().printable(exc.message)}", file=sys.stderr)
        return 2
    _merge_global_flags(args)
    if not getattr(args, "func", None):
        if args.json:
            _print_error(True, command, UsageError("no command given", "see `accelstack --help`"))
        else:
            parser.print_help()
        return 2
    args.parser = parser  # `completion` describes the whole command line from it
    _shared().configure_output(args)  # --debug or ACCELSTACK_DEBUG, verbosity, library logs
    try:
        return int(args.func(args) or 0)
    except AccelstackError as exc:
        if args.debug:
            raise
        _print_error(args.json, str(args.command or ""), exc, argv, parser)
        return exc.exit_code
    except KeyboardInterrupt as exc:  # Ctrl-C (130), or SIGTERM (Terminated, 143)
        err = Interrupted.by(exc)
        _print_error(args.json, str(args.command or ""), err)
        return err.exit_code
