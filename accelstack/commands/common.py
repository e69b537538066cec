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
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from .. import core
from ..errors import Action, UsageError
from ..serde import to_dict
from ..settings import Settings, Timeouts, debug_requested, log_level

__all__ = ["ACTION_COMMANDS", "FORMAT_VERSION", "render_action", "add_home_arguments", "add_engine_package_argument",
           "add_manifest_arguments", "settings_from_args", "report_from", "command_name", "result_line", "error_line",
           "emit", "needs_subcommand", "what_to_do", "problem_lines", "optional_path", "configure_output"]

# How the CLI says each action: the library names the step, the command line says how.
ACTION_COMMANDS: Dict[str, str] = {
    Action.INSTALL.value: "accelstack install",
    Action.REINSTALL.value: "accelstack install --force",
    Action.REPAIR.value: "accelstack repair",
    Action.UPGRADE.value: "accelstack upgrade",
    Action.VERIFY.value: "accelstack verify",
    Action.EXPLAIN_PLAN.value: "accelstack plan",
    Action.STATUS.value: "accelstack status",
    Action.WAIT.value: "retry later, or pass --wait SECONDS",
    Action.RETRY.value: "run the same command again",
    Action.CHOOSE_HOME.value: "pass --home DIR (or set ACCELSTACK_HOME) to a writable directory on one disk",
    Action.ADD_MANIFEST.value: "accelstack channel add NAME URL --key FILE (or pass --manifest URL, or install --bundle FILE)",
    Action.INSTALL_TOOLCHAIN.value: "install the compiler named above, then run the same command again",
    Action.TRUST_KEY.value: "pass --trusted-key KEY (the publisher's public key)",
    Action.ALLOW_UNSIGNED.value: "pass --insecure-unsigned only for a mirror you control",
    Action.GIVE_SOURCE.value: "pass --sdist PATH of a local source distribution",
    Action.GO_ONLINE.value: "run without --offline (and unset ACCELSTACK_OFFLINE)",
    Action.FIX_CONFIG.value: "fix the file, or pass --config PATH",
    Action.REPORT_BUG.value: "accelstack detect --capture DIR",
}


def render_action(action: str) -> str:
    return ACTION_COMMANDS.get(str(getattr(action, "value", action)), "")


def add_home_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the result as JSON (progress as JSON lines)")
    p.add_argument("--home", metavar="DIR", help="runtime home (default: ACCELSTACK_HOME or the user data dir)")
    p.add_argument("--wait", type=float, default=None, metavar="S", help="wait up to S seconds for another accelstack to finish")


def add_engine_package_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-engine", action="store_true",
                   help="torch: torch alone, without the packages `accelstack generate --backend torch` needs "
                   "(diffusers, transformers, safetensors, accelerate)")


def add_manifest_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--channel", action="append", default=[], metavar="NAME",
                   help="use this configured channel (`accelstack channel list`); repeatable. Default: every configured one")
    p.add_argument("--manifest", action="append", default=[], metavar="URL",
                   help="ggml manifest to install from (URL or path; its .sig is fetched beside it). Repeatable.")
    p.add_argument("--insecure-unsigned", action="store_true", help="accept an unsigned manifest (a local mirror you control)")
    p.add_argument("--trusted-key", action="append", default=[], metavar="KEY", help="extra trusted public key (base64 or .pub file)")
    p.add_argument("--offline", action="store_true", help="use only the download cache, no network (or ACCELSTACK_OFFLINE=1)")
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


def error_line(command: str, exc: Any) -> str:
    """The one final line of a ``--json`` command that failed with an :class:`AccelstackError`."""
    action = getattr(exc.action, "value", exc.action)
    return json.dumps({"event": "error", "format_version": FORMAT_VERSION, "command": command, "ok": False,
                       "error": type(exc).__name__, "code": exc.code, "message": exc.message,
                       "hint": exc.hint, "action": action, "run": render_action(action)},
                      separators=(",", ":"), default=str)


def emit(args: argparse.Namespace, data: Any, text: str, ok: bool = True) -> None:
    """Print a command's outcome: with ``--json`` its one final result line (commands print no
    other JSON themselves), else ``text`` for people. ``ok=False`` reports a completed command
    whose verdict is negative (a failed verify), which still exits 1."""
    if getattr(args, "json", False):
        sys.stdout.write(result_line(command_name(args), data, ok) + "\n")
        sys.stdout.flush()
    elif text:
        print(text)


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
    cmd = render_action(action)
    said = f"run `{cmd}`" if cmd.startswith("accelstack") else cmd
    return f"{hint} ({said})" if hint and said else hint or said


def problem_lines(problems: List[Any], indent: str = "  ") -> List[str]:
    return [f"{indent}problem: {what_to_do(p.message, getattr(p, 'action', ''))}" for p in problems]


def optional_path(value: Optional[str]) -> Optional[Path]:
    return Path(value).expanduser() if value else None


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
