"""What every command shares: Settings from arguments, the hardware report, hints as commands,
and the JSON Lines envelope (docs/json.md).

Kept light (the bottom modules and the core package's lazy names only): every command imports it,
``detect`` too, so it must not pull in detection, downloads or the engine itself.
"""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import shlex
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from .. import core, fsio
from ..errors import Action, UsageError
from ..serde import to_dict
from ..settings import Settings, Timeouts, debug_requested, log_level

__all__ = ["COMPLETES", "completes", "ACTION_COMMANDS", "ACTION_FLAGS", "ACTION_WORDS", "FORMAT_VERSION", "render_action", "run_command", "hint_of", "add_home_arguments", "add_engine_package_argument",
           "add_manifest_arguments", "settings_from_args", "report_from", "command_name", "result_line", "error_line",
           "emit", "needs_subcommand", "what_to_do", "problem_lines", "optional_path", "check_output_path", "configure_output",
           "printable"]

# How the CLI says each action: the library names the step, the command line says how. An error
# line's ``run`` is a command a person can paste (docs/json.md): a fixed one (``ACTION_COMMANDS``),
# or the command as typed with one more flag (``ACTION_FLAGS``); the steps that are words to follow
# (``ACTION_WORDS``) go in its hint. tests/test_words.py holds every action to that.
ACTION_COMMANDS: Dict[str, str] = {
    Action.INSTALL.value: "accelstack install",
    Action.REINSTALL.value: "accelstack install --force",
    Action.REPAIR.value: "accelstack repair",
    Action.UPGRADE.value: "accelstack upgrade",
    Action.VERIFY.value: "accelstack verify",
    Action.EXPLAIN_PLAN.value: "accelstack plan",
    Action.STATUS.value: "accelstack status",
    Action.ADD_MANIFEST.value: "accelstack channel add NAME URL --key FILE",
    Action.REPORT_BUG.value: "accelstack detect --capture DIR",
}
ACTION_FLAGS: Dict[str, str] = {
    Action.WAIT.value: "--wait 60",
    Action.CHOOSE_HOME.value: "--home DIR",
    Action.TRUST_KEY.value: "--trusted-key KEY",
    Action.ALLOW_UNSIGNED.value: "--insecure-unsigned",
    Action.GIVE_SOURCE.value: "--sdist PATH",
}
ACTION_WORDS: Dict[str, str] = {
    Action.WAIT.value: "retry later, or pass --wait SECONDS",
    Action.RETRY.value: "run the same command again",
    Action.CHOOSE_HOME.value: "pass --home DIR (or set ACCELSTACK_HOME) to a writable directory on one disk",
    Action.ADD_MANIFEST.value: "or pass --manifest URL, or install --bundle FILE",
    Action.INSTALL_TOOLCHAIN.value: "install the compiler named above, then run the same command again",
    Action.TRUST_KEY.value: "pass --trusted-key KEY (the publisher's public key)",
    Action.ALLOW_UNSIGNED.value: "pass --insecure-unsigned only for a mirror you control",
    Action.GIVE_SOURCE.value: "pass --sdist PATH of a local source distribution",
    Action.GO_ONLINE.value: "run without --offline (and unset ACCELSTACK_OFFLINE)",
    Action.FIX_CONFIG.value: "fix the file named above (or set ACCELSTACK_CONFIG to another)",
}
# What a hint that already gives an action's step in its own words says (``... or run once without
# --offline to download it``): such a hint gets no second copy of the step from ``ACTION_WORDS``.
ACTION_SAID: Dict[str, str] = {
    Action.GO_ONLINE.value: "without --offline",
}


def _value(action: Any) -> str:
    return str(getattr(action, "value", action) or "")


def render_action(action: str) -> str:
    """The action for people: ``run `COMMAND` `` (with the words that go with it), else the words
    to follow ("" for none)."""
    value = _value(action)
    run = run_command(value)
    words = ACTION_WORDS.get(value, "")
    if not run:
        return words
    return f"run `{run}`" + (f", {words}" if value in ACTION_COMMANDS and words else "")


STACK_ACTIONS = (Action.INSTALL.value, Action.REINSTALL.value)  # an error's ``stack`` says which stack these install


def run_command(action: str, argv: Optional[Sequence[str]] = None,
                parser: Optional[argparse.ArgumentParser] = None, stack: str = "") -> str:
    """The command that takes ``action``, or "" when it is words to follow: a fixed command (for
    an install, ``--stack STACK`` when the error names a stack: torch's missing packages are not
    the default stack's to install), or ``argv`` (the command line as typed, without ``accelstack``)
    with the flag the action adds, when ``parser`` (the whole command line's) shows that command
    takes it and it was not given."""
    value = _value(action)
    if value in ACTION_COMMANDS:
        if stack and value in STACK_ACTIONS:
            return ACTION_COMMANDS[Action.INSTALL.value] + f" --stack {stack}" + (" --force" if value == Action.REINSTALL.value else "")
        return ACTION_COMMANDS[value]
    flag = ACTION_FLAGS.get(value)
    name = flag.split()[0] if flag else ""
    if not flag or not argv or parser is None or name not in _parser_of(parser, argv)._option_string_actions:
        return ""
    if any(a == name or a.startswith(name + "=") for a in argv):
        return ""
    return " ".join(["accelstack", shlex.join(list(argv)), flag])


def _parser_of(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.ArgumentParser:
    """The (sub)parser that read ``argv``: ``channel add ...`` -> the one of ``channel add``."""
    words = [a for a in argv if not a.startswith("-")]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and words and words[0] in action.choices:
            return _parser_of(action.choices[words[0]], words[1:])
    return parser


def hint_of(exc: Any, argv: Optional[Sequence[str]] = None, parser: Optional[argparse.ArgumentParser] = None) -> str:
    """An error's hint with the words of its action when they say more than its ``run`` does."""
    action = _value(exc.action)
    run = run_command(action, argv, parser, getattr(exc, "stack", ""))
    words = ACTION_WORDS.get(action, "") if not run or action in ACTION_COMMANDS else ""
    hint = str(exc.hint or "")
    if not words or words in hint or (action in ACTION_SAID and ACTION_SAID[action] in hint):
        return hint
    return f"{hint}; {words}" if hint else words


COMPLETES = "accelstack_completes"  # an option's values for shell completion, where the command checks them itself


def completes(action: argparse.Action, values: Sequence[str]) -> argparse.Action:
    """Offer ``values`` when the option is completed (`accelstack completion`), with no argparse
    ``choices``: the command refuses a bad value with its own typed error and hint."""
    setattr(action, COMPLETES, list(values))
    return action


def add_home_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the result as JSON (progress as JSON lines)")
    p.add_argument("--home", metavar="DIR", help="runtime home (default: ACCELSTACK_HOME or the user data dir)")
    p.add_argument("--wait", type=float, default=None, metavar="S", help="wait up to S seconds for another accelstack to finish")


def add_engine_package_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-engine", action="store_true",
                   help="torch: torch alone, without the packages `accelstack generate --backend torch` needs "
                   "(diffusers, transformers, safetensors, accelerate)")


def add_manifest_arguments(p: argparse.ArgumentParser, *, installs: bool = True) -> None:
    """The manifest sources; ``installs=False`` (status: it only asks them for upgrades) says so
    and leaves out what only an install uses (--no-build)."""
    p.add_argument("--channel", action="append", default=[], metavar="NAME",
                   help="use this configured channel (`accelstack channel list`); repeatable. Default: every configured one")
    p.add_argument("--manifest", action="append", default=[], metavar="URL",
                   help=f"ggml manifest to {'install from' if installs else 'look for upgrades in'} (URL or path; "
                   "its .sig is fetched beside it). Repeatable.")
    p.add_argument("--insecure-unsigned", action="store_true", help="accept an unsigned manifest (a local mirror you control)")
    p.add_argument("--trusted-key", action="append", default=[], metavar="KEY", help="extra trusted public key (base64 or .pub file)")
    p.add_argument("--offline", action="store_true", help="use only the download cache, no network (or ACCELSTACK_OFFLINE=1)")
    if installs:
        p.add_argument("--no-build", action="store_true", help="never build a ggml runtime from source when no published build fits")
    p.add_argument("--hardware", metavar="FILE", help=argparse.SUPPRESS)
    p.add_argument("--replay", metavar="DIR", help=argparse.SUPPRESS)


def settings_from_args(args: Optional[argparse.Namespace], **overrides: Any) -> Settings:
    """The one Settings of a command: its flags over ``ACCELSTACK_*`` variables over the platform's
    defaults (``Settings.resolve``). The service gets its Settings the same way (``accelstack serve``).

    Read from ``args`` where a command has them, each meaning the same on every command:
    ``--home``, ``--cache``, ``--manifest``, ``--channel``, ``--trusted-key``, ``--insecure-unsigned``,
    ``--offline``, ``--no-build``, ``--no-engine``, ``--venv``, ``--python`` (as ``target_python``),
    ``--uv``, ``--wait``. ``overrides`` are Settings fields the command gives itself (None: not
    given): ``backend=args.backend`` where ``--backend`` is the backend to plan for (on other
    commands it names a runtime's, a build variant or bundle targets), the torch package indexes of
    install, repair and upgrade. ``args`` None: no flags at all."""
    def flag(name: str) -> Any:
        return getattr(args, name, None)

    def strings(name: str) -> Optional[List[str]]:  # repeatable flags; `manifest sign MANIFEST` is not one
        value = flag(name)
        return list(value) if isinstance(value, (list, tuple)) and value else None

    wait = flag("wait")
    given: Dict[str, Any] = {
        "home": flag("home"),
        "cache": flag("cache"),
        "manifests": strings("manifest"),
        "channel": strings("channel"),
        "trusted_keys": strings("trusted_key"),
        "insecure_unsigned": True if flag("insecure_unsigned") else None,
        "offline": True if flag("offline") else None,
        "allow_build": False if flag("no_build") else None,
        "torch_engine": False if flag("no_engine") else None,
        "torch_venv": optional_path(flag("venv")),
        "torch_python": flag("target_python"),
        "use_uv": True if flag("uv") else None,
        "timeouts": Timeouts(lock_wait=float(wait)) if wait is not None else None,
    }
    given.update(overrides)
    if given["trusted_keys"]:
        core.check_trusted_keys(given["trusted_keys"])
    return Settings.resolve(**{k: v for k, v in given.items() if v is not None})


def report_from(args: argparse.Namespace, settings: Optional[Settings] = None) -> Any:
    """``--hardware FILE`` (a saved HardwareReport), ``--replay DIR`` (a capture), else this machine
    (a ``--dry-run`` keeps nothing new in the detection cache)."""
    return core.report_for(settings, hardware=getattr(args, "hardware", None), replay=getattr(args, "replay", None),
                           write_cache=not getattr(args, "dry_run", False))


# The version of the JSON Lines contract (docs/json.md). Bumped only when a field is removed or
# changes meaning; adding fields keeps it (apps must ignore fields they do not know).
FORMAT_VERSION = 1


def command_name(args: argparse.Namespace) -> str:
    """The subcommand as typed (``channel add`` -> ``channel``), for the JSON envelope."""
    return str(getattr(args, "command", None) or "")


def result_line(command: str, data: Any, ok: bool = True) -> str:
    """The one final line of a successful (or completed-with-a-verdict) ``--json`` command."""
    result = to_dict(data)
    if not isinstance(result, dict):
        result = {"value": result}
    return json.dumps({"event": "result", "format_version": FORMAT_VERSION, "command": command,
                       "ok": bool(ok), "result": result}, separators=(",", ":"), default=str)


def error_line(command: str, exc: Any, argv: Optional[Sequence[str]] = None,
               parser: Optional[argparse.ArgumentParser] = None) -> str:
    """The one final line of a ``--json`` command that failed with an :class:`AccelstackError`:
    ``run`` only when there is a command to run (:func:`run_command`), words to follow in the hint."""
    action = _value(exc.action)
    line: Dict[str, Any] = {"event": "error", "format_version": FORMAT_VERSION, "command": command, "ok": False,
                            "error": type(exc).__name__, "code": exc.code, "message": exc.message,
                            "hint": hint_of(exc, argv, parser), "action": action}
    run = run_command(action, argv, parser, getattr(exc, "stack", ""))
    if run:
        line["run"] = run
    return json.dumps(line, separators=(",", ":"), default=str)


def emit(args: argparse.Namespace, data: Any, text: str, ok: bool = True) -> None:
    """Print a command's outcome: with ``--json`` its one final result line (commands print no
    other JSON themselves), else ``text`` for people. ``ok=False`` reports a completed command
    whose verdict is negative (a failed verify), which still exits 1."""
    if getattr(args, "json", False):
        sys.stdout.write(result_line(command_name(args), data, ok) + "\n")
        sys.stdout.flush()
    elif text:
        print(text)


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` safe for a terminal: each character that is not printable (ESC, BEL, a newline, a
    bidi override, a lone surrogate) as its Python escape. File and tensor names come from files
    anyone may have written; raw, they could retitle the window, clear it or forge lines of output.
    With ``lines`` (a message that holds a build log's last lines), newlines stay, each followed
    by an indent, so a name cannot pass for a line of accelstack's own."""
    if lines:
        return "\n    ".join(printable(line) for line in text.split("\n"))
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def needs_subcommand(p: argparse.ArgumentParser):
    """The ``func`` of a command group given no subcommand: its help (exit 2), or with ``--json``
    a usage error line (stdout stays JSON Lines)."""
    def run(args: argparse.Namespace) -> int:
        if getattr(args, "json", False):
            raise UsageError(f"`{p.prog}` needs a subcommand", f"see `{p.prog} --help`")
        p.print_help()
        return 2

    return run


def what_to_do(hint: str, action: str) -> str:
    """A hint with its action as the command to run (or the words to follow), for people."""
    said = render_action(action)
    return f"{hint} ({said})" if hint and said else hint or said


def problem_lines(problems: List[Any], indent: str = "  ") -> List[str]:
    return [f"{indent}problem: {what_to_do(p.message, getattr(p, 'action', ''))}" for p in problems]


def optional_path(value: Optional[str]) -> Optional[Path]:
    return Path(value).expanduser() if value else None


def _cannot(path: Path, what: str, reason: str, hint: str) -> UsageError:
    return UsageError(f"cannot write {what} to {path}: {reason}", hint, code="output-path")


def check_output_path(path: Path, what: str, *, folder: bool = False, parents: bool = True) -> Path:
    """Refuse, before any work, an output the command could not write (a usage error, code
    ``output-path``, as ``verify -o`` and ``generate -o``): see :func:`fsio.output_problem`;
    an existing regular file is for the command to replace or not."""
    problem = fsio.output_problem(path, folder=folder, parents=parents)
    if problem is not None:
        raise _cannot(path, what, *problem)
    return path


# The progress renderer: the commands that show progress import it themselves (when they are
# registered, before they run); ``detect`` and ``plan`` do not, and a cold ``detect --json`` does
# not pay for it (tests/test_import_cost.py).
_PROGRESS = "accelstack.commands.progress"


def configure_output(args: argparse.Namespace) -> None:
    """Once a command runs: ``-q``/``-v`` to the progress renderer, and library logs on stderr when
    asked for (``--debug`` or ``ACCELSTACK_DEBUG``; ``ACCELSTACK_LOG=LEVEL``).

    The renderer is configured when it is loaded, or when the verbosity is not its default (0):
    either way every renderer made afterwards sees this command's ``-q``/``-v``, and a command
    that renders nothing does not load it."""
    args.debug = bool(getattr(args, "debug", False) or debug_requested())
    verbosity = int(getattr(args, "verbosity", 0) or 0)
    if _PROGRESS in sys.modules or verbosity:
        importlib.import_module(_PROGRESS).configure(verbosity)
    level = log_level() or ("DEBUG" if args.debug else "")
    if level:  # the library logs diagnostics; show them on stderr when asked
        logging.basicConfig(level=getattr(logging, level, logging.DEBUG),
                            format="%(asctime)s %(name)s %(levelname)s %(message)s")
