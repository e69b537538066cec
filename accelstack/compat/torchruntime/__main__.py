"""``python -m accelstack.compat.torchruntime install|test|info``: torchruntime's command line, on accelstack.

The commands and arguments are torchruntime's (``install [--uv] [package specs...]``,
``test [all|import|devices|compile|math|functions]``, ``info``); this is the compat interface's
one printing part: the library calls log, and here their log lines are shown. Exit codes are
accelstack's: 0 done, 1 failed (the previous torch is kept), 2 bad arguments, 3 no torch build
runs on this machine as asked.
"""
from __future__ import annotations

import argparse
import logging
import sys
from typing import List, Optional

# absolute imports: with the shim on PYTHONPATH this file also runs as ``python -m torchruntime``
from accelstack.compat.torchruntime.installer import DEFAULT_PACKAGES, install
from accelstack.compat.torchruntime.utils import info
from accelstack.compat.torchruntime.utils.torch_test import TESTS, run_tests
from accelstack.compat.torchruntime_shim import SHIM_DIR
from accelstack.errors import AccelstackError

__all__ = ["main", "parser"]

# "python -m torchruntime" when the shim (accelstack.compat.torchruntime_shim) answers for torchruntime
PROG = "python -m " + (__spec__.name.rsplit(".", 1)[0] if __spec__ is not None else "accelstack.compat.torchruntime")
EXAMPLES = f"""examples:
  {PROG} install
      torch, torchaudio and torchvision, the build for this machine's GPU
  {PROG} install --uv "torch>=2.4" torchaudio
  {PROG} install "torch==2.13.*" torchvision
      pins are kept: the build is the best one the pins allow on this machine
  {PROG} test
      every check (import, devices, compile, math, functions); test math: the torch workload alone
  {PROG} info
      the GPUs, the recommended torch platform and why, and its environment variables

exit codes: 0 done, 1 failed (the previous torch is kept), 2 bad arguments,
3 no torch build runs on this machine as asked (the message says why).
the differences from torchruntime are listed in docs/torchruntime.md."""


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES,
                                 description="torchruntime's commands, answered by accelstack: the torch build that "
                                             "runs on this machine, installed into this Python and checked.")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    inst = sub.add_parser("install", help="install torch packages for this machine into this Python",
                          description="Install the packages (default: " + " ".join(DEFAULT_PACKAGES) + ") from the torch "
                                      "build accelstack plans for this machine, into the Python running this command. "
                                      "pip's --upgrade and --force are understood; the previous torch comes back if "
                                      "the install or its check fails.")
    inst.add_argument("--uv", action="store_true", help="run uv instead of pip (when uv is on PATH)")
    inst.add_argument("packages", nargs="*", metavar="PACKAGE", help="package specs in pip's format: torch==2.13.* torchvision")
    test = sub.add_parser("test", help="check the installed torch (accelstack's torch check)",
                          description="Check the torch in this Python: import, its devices, and accelstack's torch "
                                      "workload (compared with the CPU) on the best device. torch.compile is not checked.")
    test.add_argument("check", nargs="?", default="all", choices=("all",) + TESTS, help="which check (default: all)")
    sub.add_parser("info", help="show the GPUs, the recommended torch platform and its environment variables",
                   description="Show the GPUs accelstack detects, the torch platform it would install and why, and "
                               "the environment variables configure() would set.")
    sub.add_parser("shim", help="print the folder that, on PYTHONPATH, makes 'import torchruntime' accelstack's",
                   description="Print the folder to put on PYTHONPATH so that 'import torchruntime' and 'python -m "
                               "torchruntime', in this process and every subprocess, run accelstack's answers with no "
                               "change to the app: PYTHONPATH=\"$(python -m accelstack.compat.torchruntime shim)\" python app.py")
    return ap


def _show_logs() -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger("accelstack.compat")
    log.addHandler(handler)
    log.setLevel(logging.INFO)


def main(argv: Optional[List[str]] = None) -> int:
    ap = parser()
    args, extra = ap.parse_known_args(argv)
    if args.command is None:
        ap.print_help()
        return 2
    if extra and args.command != "install":
        ap.error(f"unrecognized arguments: {' '.join(extra)}")
    _show_logs()
    try:
        if args.command == "install":
            summary = install(list(args.packages) + list(extra) or None, use_uv=args.uv)
            if summary is not None:  # None: packages without torch, run as pip commands (their output shown)
                print(f"installed: {summary.plan.summary}" if summary.changed else "already installed: nothing to do")
        elif args.command == "test":
            failed = False
            for result in run_tests(args.check):
                word = "SKIP" if result.skipped else ("OK" if result.ok else "FAIL")
                print(f"[{word}] {result.name}: {result.detail}")
                failed = failed or not result.ok
            return 1 if failed else 0
        elif args.command == "shim":
            print(SHIM_DIR)
        else:
            info()
    except AccelstackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
