"""What every command shares: Settings from arguments, the hardware report, hints as commands."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..errors import Action
from ..serde import to_dict

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


def settings_from(args: argparse.Namespace, **extra: Any):
    """One Settings for the whole command: arguments over ACCELSTACK_* variables over defaults."""
    import dataclasses

    from ..settings import Settings

    s = Settings.resolve(
        home=getattr(args, "home", None),
        manifests=list(getattr(args, "manifest", []) or []) or None,
        channel=list(getattr(args, "channel", []) or []) or None,
        trusted_keys=list(getattr(args, "trusted_key", []) or []) or None,
        insecure_unsigned=True if getattr(args, "insecure_unsigned", False) else None,
        offline=True if getattr(args, "offline", False) else None,
        allow_build=False if getattr(args, "no_build", False) else None,
        torch_engine=False if getattr(args, "no_engine", False) else None,
        **{k: v for k, v in extra.items() if v is not None},
    )
    wait = getattr(args, "wait", None)
    if wait is not None:
        s.timeouts = dataclasses.replace(s.timeouts, lock_wait=float(wait))
    return s


def report_from(args: argparse.Namespace, settings=None):
    """``--hardware FILE`` (a saved HardwareReport), ``--replay DIR`` (a capture), else this machine."""
    from ..core.detection import detect
    from ..hardware.report import HardwareReport
    from ..hardware.system import ReplaySystem
    from ..errors import UsageError
    from ..serde import loads

    if getattr(args, "hardware", None):
        try:
            text = Path(args.hardware).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read {args.hardware} ({exc.strerror or exc})",
                             "write one with `accelstack detect --json > report.json`") from None
        return loads(HardwareReport, text, what=args.hardware)
    if getattr(args, "replay", None):
        report = detect(ReplaySystem(args.replay), settings=settings)
        report.source = f"replay:{args.replay}"
        return report
    return detect(settings=settings)


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
            from ..errors import UsageError

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
