"""`accelstack install | status | repair | upgrade | rollback | uninstall | gc`: runtimes on disk.

Each command parses its arguments into one ``Settings``, calls the core, and renders its events
and result; the work itself is :mod:`accelstack.core`'s.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import add_home_arguments, add_manifest_arguments, emit, optional_path, problem_lines, report_from, settings_from
from .progress import progress_renderer

MiB = 1024 * 1024


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "install",
        help="first run: detect, plan, fetch, install, verify and activate a runtime",
        description="Install the runtime that fits this machine. ggml (default): a stable-diffusion.cpp build, "
        "fetched from a signed manifest or built from source, installed into its own directory and activated "
        "only after it generates an image here. torch: the planned PyTorch wheel installed into a Python "
        "environment, checked there, and rolled back to what was there before if it does not work. A second "
        "run on a healthy install does nothing.",
        epilog="examples:\n"
        "  accelstack install                               ggml runtime for this machine\n"
        "  accelstack install --manifest https://host/ggml-manifest.json\n"
        "  accelstack install --channel stable                from a channel added with `accelstack channel add`\n"
        "  accelstack install --bundle runtime.tar --offline  from an offline bundle (`accelstack bundle create`)\n"
        "  accelstack install --dry-run --json              what would be installed (touches nothing)\n"
        "  accelstack install --stack torch --venv .venv    the right torch build into .venv",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--stack", choices=["ggml", "torch"], default="ggml")
    p.add_argument("--backend", default=None, help="force a backend (cuda, vulkan, cpu, ...) or ACCELSTACK_BACKEND")
    p.add_argument("--dry-run", action="store_true", help="show what would be installed and stop; nothing on disk changes")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation (installs never prompt when not on a terminal)")
    p.add_argument("--force", action="store_true", help="reinstall even if the same runtime is installed")
    p.add_argument("--python", dest="target_python", metavar="PATH", help="torch: the interpreter to install into (default: this one)")
    p.add_argument("--venv", metavar="DIR", help="torch: install into this virtual environment (created if missing)")
    p.add_argument("--uv", action="store_true", help="torch: use uv instead of pip when available")
    p.add_argument("--bundle", metavar="FILE", help="install from an offline bundle, with no network (ggml: signature "
                   "and hashes checked as online, the key from the bundle's configured channel or --trusted-key; "
                   "torch: the bundled wheels into --venv/--python, pip --no-index --require-hashes)")
    p.add_argument("requirements", nargs="*", metavar="REQUIREMENT", help="torch: pins such as 'torch==2.6.*'")
    add_home_arguments(p)
    add_manifest_arguments(p)
    p.set_defaults(func=run_install)

    p = sub.add_parser("status", help="what is installed and active, and whether it still fits this machine")
    add_home_arguments(p)
    add_manifest_arguments(p)
    p.set_defaults(func=run_status)

    p = sub.add_parser("repair", help="rebuild a damaged state file, restore missing or corrupt runtime files, re-verify")
    add_home_arguments(p)
    p.add_argument("--offline", action="store_true", help="use only the download cache")
    p.set_defaults(func=run_repair)

    p = sub.add_parser("upgrade", help="install the newest fitting runtime side by side, verify it, switch")
    p.add_argument("--backend", default=None)
    add_home_arguments(p)
    add_manifest_arguments(p)
    p.set_defaults(func=run_upgrade)

    p = sub.add_parser("rollback", help="switch back to the previous runtime")
    add_home_arguments(p)
    p.set_defaults(func=run_rollback)

    p = sub.add_parser("uninstall", help="remove the installed ggml runtimes")
    add_home_arguments(p)
    p.add_argument("--yes", "-y", action="store_true")
    p.set_defaults(func=run_uninstall)

    p = sub.add_parser("gc", help="remove inactive runtimes (keeping the previous one) and unused downloads")
    add_home_arguments(p)
    p.set_defaults(func=run_gc)


def run_install(args) -> int:
    from .. import core

    s = settings_from(args, backend=args.backend, torch_venv=optional_path(args.venv), torch_python=args.target_python,
                      use_uv=True if args.uv else None)
    report = report_from(args, s)
    if args.bundle:
        from ..core.bundles import install_bundle
        from ..errors import UsageError

        if args.dry_run or args.manifest or args.requirements:
            raise UsageError("--bundle installs what the bundle holds, from the bundle alone (no --dry-run, --manifest or requirements)")
        with progress_renderer(json_mode=args.json) as progress:
            summary = install_bundle(Path(args.bundle).expanduser(), settings=s, report=report, force=args.force,
                                     on_progress=progress)
        emit(args, summary, _install_text(summary))
        return 0
    with progress_renderer(json_mode=args.json) as progress:
        summary = core.plan_and_install(report, args.stack, requirements=args.requirements, settings=s, force=args.force,
                                        dry_run=args.dry_run, on_progress=progress)
    emit(args, summary, _install_text(summary))
    return 0


def _install_text(summary) -> str:
    plan = summary.plan
    lines = list(summary.notes) + [f"plan: {plan.summary}"]
    lines += [f"recovered: {r}" for r in summary.recovered]
    if summary.dry_run:
        if summary.would_build:
            lines.append(f"dry run: would build the {summary.would_build} variant from source, then install and verify it")
        else:
            lines.append(f"dry run: would install runtime {summary.runtime}")
        for a in plan.artifacts:
            lines.append(f"  {a.name}  {a.size / MiB:.1f} MiB  sha256 {a.sha256[:16]}…")
        lines += [f"  $ {c.render()}" for c in plan.commands]
        return "\n".join(lines)
    r = summary.receipt
    if not summary.changed:
        lines.append(f"runtime {summary.runtime} is already installed and active: nothing to do")
        return "\n".join(lines)
    where = f" (previous: {summary.previous}, kept for `accelstack rollback`)" if summary.previous else ""
    lines.append(f"installed and activated runtime {summary.runtime}{where}")
    if r is not None:
        v = r.verification
        lines.append(f"  {r.path}: {len(r.files)} files; {v.check} check {v.verdict}" + (f" on {v.device.name}" if v.device else ""))
    if summary.timings:
        lines.append("  " + ", ".join(f"{k} {v:.2f} s" for k, v in summary.timings.items()))
    return "\n".join(lines)


def run_status(args) -> int:
    from .. import core

    s = settings_from(args)
    stats = core.status(report=report_from(args, s), settings=s)
    lines = [f"runtime home: {s.home}"]
    for st in stats:
        if not st.installed and not st.active:
            lines.append(f"{st.stack}: nothing installed")
            lines += problem_lines(st.problems)
            continue
        lines.append(f"{st.stack}: active {st.active or '(none)'}" + (f", previous {st.previous}" if st.previous else "")
                     + ("" if not st.active else "  [healthy]" if st.healthy else "  [needs attention]"))
        if st.receipt:
            r = st.receipt
            lines.append(f"  backend {r.backend}, installed {r.installed_at}, verified {r.verified_at} "
                         f"({r.verification.verdict}), at {st.runtime_path}")
            lines.append(f"  fits this machine: {'yes' if st.hardware_matches else 'no' if st.hardware_matches is False else 'unknown'}")
        if st.upgrade_available:
            lines.append(f"  upgrade available: {st.upgrade_available} (run `accelstack upgrade`)")
        others = [i for i in st.installed if i not in (st.active, st.previous)]
        if others:
            lines.append(f"  also installed: {', '.join(others)} (`accelstack gc` removes them)")
        lines += problem_lines(st.problems)
    emit(args, stats, "\n".join(lines))
    return 0


def run_repair(args) -> int:
    from .. import core

    s = settings_from(args)
    with progress_renderer(json_mode=args.json) as progress:
        rep = core.repair(settings=s, on_progress=progress)
    v = rep.verification
    verdict = f"check {v.verdict}" + (f": {v.reason}" if v is not None and not v.ok else "") if v is not None else "not checked"
    lines = []
    if rep.pointer_rebuilt:
        lines.append("active.json was damaged: rebuilt from the receipts")
    if rep.healthy:
        lines.append(f"runtime {rep.runtime}: all {rep.checked} files intact; {verdict}")
    else:
        lines.append(f"runtime {rep.runtime}: {len(rep.missing)} missing and {len(rep.corrupt)} corrupt of {rep.checked} files; "
                     f"restored {len(rep.fixed)}; {verdict}")
        lines += [f"  fixed {f}" for f in rep.fixed]
    emit(args, rep, "\n".join(lines))
    return 0 if v is None or v.ok else 1


def run_upgrade(args) -> int:
    from .. import core

    s = settings_from(args)
    report = report_from(args, s)
    with progress_renderer(json_mode=args.json) as progress:
        summary = core.upgrade(report=report, settings=s, backend=args.backend, on_progress=progress)
    if summary.changed:
        text = f"upgraded to {summary.runtime}" + (f"; {summary.previous} kept for `accelstack rollback`" if summary.previous else "")
    else:
        text = f"already up to date: {summary.runtime}"
    emit(args, summary, text)
    return 0


def run_rollback(args) -> int:
    from .. import core

    state = core.rollback(settings=settings_from(args))
    emit(args, state, f"active ggml runtime is now {state.active.get('ggml')} (previous: {state.previous.get('ggml', '-')})")
    return 0


def run_uninstall(args) -> int:
    from .. import core

    if not args.yes and sys.stdin.isatty():
        if input("remove every installed ggml runtime? [y/N] ").strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return 1
    removed = core.uninstall(settings=settings_from(args))
    emit(args, removed, f"removed {len(removed)} runtime(s)" + "".join(f"\n  {r}" for r in removed))
    return 0


def run_gc(args) -> int:
    from .. import core

    rep = core.gc(settings=settings_from(args))
    text = f"removed {len(rep.runtimes_removed)} runtime(s) and {len(rep.blobs_removed)} cached download(s), freed {rep.bytes_freed / MiB:.1f} MiB"
    if rep.blobs_kept_shared:
        text += f"\nkept {len(rep.blobs_kept_shared)} download(s) still used by other runtime homes sharing this cache: {', '.join(rep.other_homes)}"
    emit(args, rep, text)
    return 0
