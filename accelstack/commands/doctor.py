"""`accelstack doctor`: one report of everything a support request needs; `--bundle` for a bug report."""
from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any, List

from .. import core
from ..core.doctor import doctor, write_bundle
from ..errors import UsageError
from ..serde import plural, size_text
from .common import emit, what_to_do

__all__ = ["BUNDLE_SUFFIXES", "register", "render", "run"]

# What --bundle writes, by the name it is given (accelstack.core.doctor.write_bundle): any other
# name is refused, so a file is never a zip under another name.
BUNDLE_SUFFIXES = (".zip", ".tar.gz", ".tgz")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "doctor",
        help="everything a support request needs: versions, paths, channels, runtimes, caches, tools, hardware",
        description="One report of this installation: accelstack and Python versions, the paths in use and where "
        "each came from (argument, ACCELSTACK_* variable, default), channels and trusted keys, the active "
        "runtimes and their health, disk used per cache, which build tools are available, and the hardware "
        "with its problems. It only reads, and reports a broken part instead of failing on it. --bundle writes "
        "the report with a detection capture into one file to attach to a bug report.",
        epilog="examples:\n"
        "  accelstack doctor\n"
        "  accelstack doctor --json\n"
        "  accelstack doctor --bundle accelstack-report.zip     attach this file to a bug report\n"
        "  accelstack doctor --home /opt/accelstack --bundle report.tar.gz",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--home", metavar="DIR", help="runtime home (default: ACCELSTACK_HOME or the user data dir)")
    p.add_argument("--bundle", metavar="FILE", help="also write the report and a detection capture into FILE, "
                   f"a zip archive (or a gzipped tar): its name must end in {' or '.join(BUNDLE_SUFFIXES)}, "
                   "another name is refused (exit 2)")
    p.set_defaults(func=run)


def render(r: Any) -> str:
    a = r.accelstack
    lines: List[str] = [f"accelstack {a.get('version', '?')}  python {a.get('python', '?')}  {a.get('os', '')}",
                        f"  executable  {a.get('executable', '')}", "", "paths:"]
    for p in r.paths:
        lines.append(f"  {p.name:<12} {p.path}  [{p.origin}]" + ("" if p.exists else " (not created yet)"))
    lines += ["", "channels:"]
    lines += [f"  {c['name'] or '(manifest)'}  {c['url']}  signed by {c['trust']}; from {c['origin']}"
              for c in r.channels] or ["  none configured (accelstack channel add NAME URL --key FILE)"]
    lines.append("trusted keys: " + (", ".join(f"{k['keyid']} ({k['origin']})" for k in r.trusted_keys) or "none"))
    lines += ["", "runtimes:"]
    active = [rt for rt in r.runtimes if rt["active"] or rt["installed"]]
    for rt in active:
        health = "healthy" if rt["healthy"] else "NOT HEALTHY" if rt["active"] else "none active"
        lines.append(f"  {rt['stack']:<6} {rt['active'] or '-'}  {health}" +
                     (f", {rt['backend']}" if rt["backend"] else "") +
                     (f", from {rt['manifest_source']} v{rt['manifest_version']}" if rt["manifest_source"] else "") +
                     (f"; installed: {len(rt['installed'])}" if rt["installed"] else ""))
        lines += [f"         problem: {m}" for m in rt["problems"]]
    if not active:
        lines.append("  none installed (accelstack install)")
    lines += ["", "caches:"]
    lines += [f"  {c['name']:<10} {size_text(c['size']):>9}  {plural(c['entries'], 'entry', 'entries')}  {c['path']}" for c in r.caches]
    lines += ["", "tools:"]
    for t in r.toolchain:
        lines.append(f"  {t.name:<13} {t.version or 'found' if t.found else 'not found'}" + (f"  ({t.path})" if t.found else ""))
    lines.append("  can build:    " + ", ".join(f"{v} ({'yes' if not miss else 'missing ' + ' '.join(miss)})"
                                              for v, miss in r.can_build.items()))
    hw = r.hardware
    if hw:
        cpu, mem = hw.get("cpu", {}), hw.get("memory", {})
        lines += ["", "hardware:", f"  cpu         {cpu.get('model') or cpu.get('vendor') or '?'} "
                  f"({cpu.get('physical_cores') or '?'} cores)"
                  + (f", {size_text(mem['ram_total'])} RAM" if mem.get("ram_total") else "")]
        lines += [f"  gpu         {g.get('name')} ({g.get('vendor')}, {g.get('kind')})" for g in hw.get("gpus", [])] \
            or ["  gpu         none found"]
        usable = [api["name"] for api in hw.get("apis", []) if api.get("usable")]
        lines.append(f"  usable      {', '.join(usable) or 'cpu only'}")
        lines += [f"  problem     {p['message']}" + (f" ({what_to_do(p['hint'], '')})" if p.get("hint") else "")
                  for p in r.hardware_problems]
    if r.problems:
        lines += ["", "could not read:"] + [f"  {m}" for m in r.problems]
    lines += ["", f"{'OK' if r.ok else 'PROBLEMS FOUND'}  ({r.seconds:.1f} s)"]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    given = {"home": args.home}  # the core resolves the Settings itself, to say where each path came from
    if args.bundle and not Path(args.bundle).expanduser().is_dir() and not args.bundle.lower().endswith(BUNDLE_SUFFIXES):
        raise UsageError(f"--bundle {args.bundle}: the name must end in {' or '.join(BUNDLE_SUFFIXES)} (the file is an "
                         "archive of that kind)", f"for example --bundle {Path(args.bundle).stem or 'report'}.zip")
    if args.bundle:
        capturing = core.CapturingSystem(core.LiveSystem())
        report = doctor(None, given=given, system=capturing)
        work = Path(tempfile.mkdtemp(prefix="accelstack-doctor-"))
        try:
            capture = work / "capture"
            try:
                capturing.save(str(capture))
            except Exception as exc:  # the report still goes out without the capture
                report.problems.append(f"detection capture: {getattr(exc, 'message', exc)}")
                capture = None  # type: ignore[assignment]
            text = render(report)
            target = Path(args.bundle).expanduser()
            if target.is_dir():
                raise UsageError(f"--bundle {target} is a directory", "give a file name ending in .zip or .tar.gz")
            try:
                bundle = write_bundle(target, report, capture, text)
            except OSError as exc:
                raise UsageError(f"cannot write the bundle {target} ({exc.strerror or exc})",
                                 "give a writable path ending in .zip or .tar.gz") from None
        finally:
            shutil.rmtree(work, ignore_errors=True)
        result = {"report": report, "bundle": str(bundle.resolve())}
        emit(args, result, text + f"\n\nbundle written to {bundle.resolve()} (attach it to your support request)")
        return 0
    report = doctor(None, given=given)
    emit(args, {"report": report, "bundle": None}, render(report))
    return 0
