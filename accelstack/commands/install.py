"""`accelstack install | repair | upgrade | rollback | uninstall | gc`: runtimes on disk.

Each command parses its arguments into one ``Settings``, calls the core, and renders its events
and result; the work itself is :mod:`accelstack.core`'s. Every outcome goes through ``emit`` (one
final JSON line with ``--json``); failures are typed errors that ``cli.py`` prints.
"""
from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List

from .. import core
from ..core.installing import install as install_runtime
from ..core.manifest_files import ANY_BACKEND
from ..errors import UsageError
from ..serde import plural
from .common import (
    add_engine_package_argument,
    add_home_arguments,
    add_manifest_arguments,
    emit,
    report_from,
    settings_from_args,
)
from .interrupts import interruptible
from .plan import check_backend
from .progress import progress_renderer
from .progress_format import amount

__all__ = ["register", "run_install", "run_repair", "run_upgrade",
           "run_rollback", "run_uninstall", "run_gc", "TIMING_LABELS"]

RAW = argparse.RawDescriptionHelpFormatter

# How the summary names each timing: what was measured, not the step that happened to hold it.
TIMING_LABELS = {"manifests": "read manifests", "build": "build from source", "build-cache": "build cache", "download": "download",
                 "stage": "unpack", "hash": "hash files", "verify": "verify (probe generation)"}


def _para(text: str) -> str:
    """A description as a paragraph of terminal width (the raw formatter keeps the examples' layout)."""
    return textwrap.fill(text, 92)


def _add_index_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--index-url", metavar="URL", help="torch: the package index to use instead of PyPI (a mirror); "
                   "or ACCELSTACK_INDEX_URL")
    p.add_argument("--extra-index-url", action="append", default=[], metavar="URL",
                   help="torch: another package index pip searches as well; repeatable; or ACCELSTACK_EXTRA_INDEX_URL")


def _index_settings(args: argparse.Namespace) -> Dict[str, Any]:
    """``--index-url`` / ``--extra-index-url`` as Settings fields for ``settings_from_args``; only
    those given (the variables fill in the others)."""
    out: Dict[str, Any] = {}
    if getattr(args, "index_url", None):
        out["index_url"] = args.index_url
    if getattr(args, "extra_index_url", None):
        out["extra_index_urls"] = list(args.extra_index_url)
    return out


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "install",
        help="first run: detect, plan, fetch, install, verify and activate a runtime",
        description=_para("Install the runtime that fits this machine. ggml (default): a stable-diffusion.cpp build, "
        "fetched from a signed manifest or built from source, installed into its own directory and activated "
        "only after it generates an image here (the probe check, so a separate `accelstack verify` is not "
        "needed after it). torch: the planned PyTorch wheel installed into a Python environment, checked "
        "there, and rolled back to what was there before if it does not work. A second run on a healthy "
        "install does nothing. Install never asks questions. Ctrl-C says what state it left: the previous "
        "runtime stays active until the new one has passed its check, and a partial download is resumed "
        "by the next run."),
        epilog="examples:\n"
        "  accelstack install                                  ggml runtime for this machine\n"
        "  accelstack install --dry-run                        what it would do (touches nothing, builds nothing)\n"
        "  accelstack install --manifest https://host/ggml-manifest.json\n"
        "  accelstack install --channel stable                 from a channel added with `accelstack channel add`\n"
        "  accelstack install --backend vulkan                 this backend, or a clear refusal (exit 3)\n"
        "  accelstack install --bundle runtime.tar --offline   from an offline bundle (`accelstack bundle create`)\n"
        "  accelstack install --dry-run --json                 the same as one JSON result line\n"
        "  accelstack install --stack torch --venv .venv       the right torch build into .venv\n"
        "  accelstack install --stack torch --venv .venv --index-url https://mirror/simple",
        formatter_class=RAW,
    )
    p.add_argument("--stack", choices=["ggml", "torch"], default="ggml")
    p.add_argument("--backend", default=None, help="force a backend (cuda, vulkan, cpu, ...) or ACCELSTACK_BACKEND; "
                   "one this machine cannot run is refused before anything is downloaded or built (exit 3)")
    p.add_argument("--dry-run", action="store_true", help="say what would be done and stop: no home created, no lock, "
                   "no download, no build, nothing written")
    p.add_argument("--yes", "-y", action="store_true", help=argparse.SUPPRESS)  # install never asks; kept for old scripts
    p.add_argument("--force", action="store_true", help="reinstall even if the same runtime is installed")
    p.add_argument("--python", dest="target_python", metavar="PATH", help="torch: the interpreter to install into (default: this one)")
    p.add_argument("--venv", metavar="DIR", help="torch: install into this virtual environment (created if missing)")
    add_engine_package_argument(p)
    p.add_argument("--uv", action="store_true", help="torch: use uv instead of pip when available")
    _add_index_arguments(p)
    p.add_argument("--bundle", metavar="FILE", help="install from an offline bundle, with no network (ggml: signature "
                   "and hashes checked as online, the key from the bundle's configured channel or --trusted-key; "
                   "torch: the bundled wheels into --venv/--python, pip --no-index --require-hashes)")
    p.add_argument("requirements", nargs="*", metavar="REQUIREMENT", help="torch: pins such as 'torch==2.6.*'")
    add_home_arguments(p)
    add_manifest_arguments(p)
    p.set_defaults(func=run_install)

    p = sub.add_parser(
        "repair", help="rebuild a damaged state file, restore missing or corrupt runtime files, re-verify",
        description=_para("Check the active ggml runtime against its receipt: rebuild a damaged active.json from the "
        "receipts, restore missing or corrupt files from the download cache (downloading again if needed), "
        "and run the probe check again. Exit 1 when the check fails after repair."),
        epilog="examples:\n"
        "  accelstack repair\n"
        "  accelstack repair --offline                       restore from the download cache only\n"
        "  accelstack repair --json",
        formatter_class=RAW)
    add_home_arguments(p)
    p.add_argument("--offline", action="store_true", help="use only the download cache")
    _add_index_arguments(p)
    p.set_defaults(func=run_repair)

    p = sub.add_parser(
        "upgrade", help="install the newest fitting runtime side by side, verify it, switch",
        description=_para("Plan again from the channels the last install used (or those given), install the result "
        "beside the active runtime, check it, and switch to it. The old runtime stays for `accelstack rollback`. "
        "Nothing changes when the plan picks what is already active."),
        epilog="examples:\n"
        "  accelstack upgrade\n"
        "  accelstack upgrade --backend vulkan              switch backend on the way\n"
        "  accelstack upgrade --channel beta --json",
        formatter_class=RAW)
    p.add_argument("--backend", default=None, help="the backend to plan for (default: what the active runtime was installed for)")
    _add_index_arguments(p)
    add_home_arguments(p)
    add_manifest_arguments(p)
    p.set_defaults(func=run_upgrade)

    p = sub.add_parser(
        "rollback", help="switch back to the previous runtime",
        description=_para("Make the previous ggml runtime active again (the one the last install or upgrade replaced); "
        "the current one becomes the previous, so a second rollback undoes the first."),
        epilog="examples:\n  accelstack rollback\n  accelstack rollback --json",
        formatter_class=RAW)
    add_home_arguments(p)
    p.set_defaults(func=run_rollback)

    p = sub.add_parser(
        "uninstall", help="remove the installed ggml runtimes",
        description=_para("Remove every installed ggml runtime from the runtime home. It first lists what it will remove "
        "and how much space that frees, and asks on a terminal; without a terminal it needs --yes. The download, "
        "build and probe caches stay (their sizes are shown): `accelstack cache purge` removes them."),
        epilog="examples:\n"
        "  accelstack uninstall                              list, then ask\n"
        "  accelstack uninstall --yes                        no question (scripts, apps)\n"
        "  accelstack uninstall --yes && accelstack cache purge   everything, caches too",
        formatter_class=RAW)
    add_home_arguments(p)
    p.add_argument("--yes", "-y", action="store_true", help="do not ask; needed when not on a terminal")
    p.set_defaults(func=run_uninstall)

    p = sub.add_parser(
        "gc", help="remove inactive runtimes (keeping the previous one) and unused downloads",
        description=_para("Remove runtimes that are neither active nor previous, leftovers of interrupted installs, and "
        "downloads no runtime home sharing this cache still needs. The build and probe caches are left to "
        "`accelstack cache`."),
        epilog="examples:\n  accelstack gc\n  accelstack gc --json",
        formatter_class=RAW)
    add_home_arguments(p)
    p.set_defaults(func=run_gc)


# -- install -----------------------------------------------------------------------------------
def run_install(args) -> int:
    s = settings_from_args(args, backend=args.backend, **_index_settings(args))
    if not args.bundle:  # a bundle's targets are its own: the bundle's manifest says which it holds
        _check_backend_name(args, s)
    report = report_from(args, s)
    if args.bundle:
        if args.dry_run or args.manifest or args.requirements:
            raise UsageError("--bundle installs what the bundle holds, from the bundle alone (no --dry-run, --manifest or requirements)")
        with interruptible(s, args.stack) as watch, progress_renderer(json_mode=args.json) as progress:
            summary = core.install_bundle(Path(args.bundle).expanduser(), settings=s, report=report, force=args.force,
                                     on_progress=watch.progress(progress))
        emit(args, summary, _install_text(summary))
        return 0
    with interruptible(s, args.stack) as watch, progress_renderer(json_mode=args.json) as progress:
        summary = install_runtime(None, stack=args.stack, requirements=args.requirements, report=report, settings=s,
                                  force=args.force, dry_run=args.dry_run, on_progress=watch.progress(progress))
    emit(args, summary, _install_text(summary))
    return 0


def _check_backend_name(args, s) -> None:
    """A forced backend that is no name the plan could take (``--backend bogus``, or the same in
    ``$ACCELSTACK_BACKEND``) is refused before the hardware is probed, so the refusal writes
    nothing, not even the probe's cache. A backend of either stack passes at once; any other name
    may be a torch variant or a ggml target id, so only then are the plan's sources read for it."""
    backend = (s.backend or "").strip().lower()
    if backend and backend not in ANY_BACKEND:
        check_backend(s.backend, core.plan_sources(s, args.stack).manifests, args.stack, option=args.backend is not None)


def _timings_text(timings: Dict[str, float]) -> str:
    return ", ".join(f"{TIMING_LABELS.get(k, k)} {v:.1f} s" for k, v in timings.items())


def _install_text(summary) -> str:
    plan = summary.plan
    lines = list(summary.notes) + [f"plan: {plan.summary}"]
    lines += [f"recovered: {r}" for r in summary.recovered]
    if summary.dry_run:
        lines.append("dry run (nothing was changed); install would:" if summary.would else "dry run: nothing was changed")
        lines += [f"  {w}" for w in getattr(summary, "would", [])]
        return "\n".join(lines)
    r = summary.receipt
    if not summary.changed:
        lines.append(f"runtime {summary.runtime} is already installed and active: nothing to do")
        return "\n".join(lines)
    if getattr(summary, "reinstalled", False):
        lines.append(f"reinstalled runtime {summary.runtime} (it was active already and still is)")
    else:
        where = f" (previous: {summary.previous}, kept for `accelstack rollback`)" if summary.previous else ""
        lines.append(f"installed and activated runtime {summary.runtime}{where}")
    if r is not None:
        v = r.verification
        lines.append(f"  {r.path}: {plural(len(r.files), 'file')}; {v.check} check {v.verdict}" + (f" on {v.device.name}" if v.device else ""))
        lines.append(f"  from: {r.origin}")
    if summary.timings:
        lines.append("  took: " + _timings_text(summary.timings))
    return "\n".join(lines)


def run_repair(args) -> int:
    s = settings_from_args(args, **_index_settings(args))
    with interruptible(s) as watch, progress_renderer(json_mode=args.json) as progress:
        rep = core.repair(settings=s, on_progress=watch.progress(progress))
    v = rep.verification
    verdict = f"check {v.verdict}" + (f": {v.reason}" if v is not None and not v.ok else "") if v is not None else "not checked"
    lines = [f"active runtime: {rep.active or rep.runtime} ({rep.active_reason})"] if rep.active_reason else []
    if rep.healthy:
        lines.append(f"runtime {rep.runtime}: {plural(rep.checked, 'file')} checked, all intact; {verdict}")
    else:
        lines.append(f"runtime {rep.runtime}: found {len(rep.missing)} missing and {len(rep.corrupt)} corrupt of {plural(rep.checked, 'file')}; "
                     f"restored {len(rep.fixed)}; {verdict}")
        lines += [f"  fixed {f}" for f in rep.fixed]
    ok = v is None or v.ok
    emit(args, rep, "\n".join(lines), ok=ok)
    return 0 if ok else 1


def run_upgrade(args) -> int:
    s = settings_from_args(args, **_index_settings(args))  # --backend goes to the plan below, as a request
    report = report_from(args, s)
    with interruptible(s) as watch, progress_renderer(json_mode=args.json) as progress:
        summary = core.upgrade(report=report, settings=s, backend=args.backend, on_progress=watch.progress(progress))
    if summary.changed:
        text = f"upgraded to {summary.runtime}" + (f"; {summary.previous} kept for `accelstack rollback`" if summary.previous else "")
        if summary.receipt is not None:
            text += f"\n  from: {summary.receipt.origin}"
        if summary.timings:
            text += "\n  took: " + _timings_text(summary.timings)
    else:
        text = f"already up to date: {summary.runtime}"
    emit(args, summary, text)
    return 0


def run_rollback(args) -> int:
    with progress_renderer(json_mode=args.json) as progress:  # a wait for the lock is shown
        state = core.rollback(settings=settings_from_args(args), on_progress=progress)
    emit(args, state, f"active ggml runtime is now {state.active.get('ggml')} (previous: {state.previous.get('ggml', '-')})")
    return 0


def _size(n: int) -> str:
    return amount(n, "B")  # the progress lines' units (KiB, MiB, GiB): one family everywhere


def _uninstall_listing(preview) -> List[str]:
    if not preview.runtimes:
        lines = [f"no {preview.stack} runtime is installed: nothing to remove"]
    else:
        lines = [f"uninstall removes {plural(len(preview.runtimes), preview.stack + ' runtime')}, freeing {_size(preview.bytes)}:"]
        lines += [f"  {r.name}  {_size(r.bytes)}  {r.path}" + (f"  ({r.note})" if r.note else "") for r in preview.runtimes]
    kept = [c for c in preview.kept if c.bytes]
    if kept:
        lines.append("these stay (`accelstack cache purge` removes them):")
        lines += [f"  {c.name} cache  {_size(c.bytes)}  {c.path}" + (f"  ({c.note})" if c.note else "") for c in kept]
    lines.append("not touched either: models you generate with, and torch runtimes (their environments are yours)")
    return lines


def _question(preview) -> str:
    """The confirmation, naming exactly what goes: each runtime id, and the space."""
    return f"remove {', '.join(r.name for r in preview.runtimes)} ({_size(preview.bytes)}), keeping the caches? [y/N] "


def run_uninstall(args) -> int:
    s = settings_from_args(args)
    preview = core.uninstall_preview(settings=s)
    listing = _uninstall_listing(preview)
    if preview.runtimes and not args.yes:
        if not sys.stdin.isatty():
            raise UsageError(f"uninstall would remove {plural(len(preview.runtimes), 'runtime')} ({_size(preview.bytes)}) and "
                             "needs a confirmation, but there is no terminal to ask on",
                             "pass --yes to remove them without a question")
        out = sys.stderr if args.json else sys.stdout
        print("\n".join(listing), file=out)
        out.write(_question(preview))
        out.flush()
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            result = {"removed": [], "bytes_freed": 0, "cancelled": True, "kept": preview.kept}
            emit(args, result, "nothing removed", ok=False)
            return 1
        listing = []  # already shown
    with progress_renderer(json_mode=args.json) as progress:  # a wait for the lock is shown
        removed = core.uninstall(settings=s, on_progress=progress) if preview.runtimes else []  # nothing there: nothing created
    freed = sum(r.bytes for r in preview.runtimes if r.name in removed or r.note.startswith("left over"))
    done = [f"removed {plural(len(removed), 'runtime')}, freed {_size(freed)}"] + [f"  {r}" for r in removed] if removed else []
    text = "\n".join(listing + done)
    emit(args, {"removed": removed, "bytes_freed": freed, "cancelled": False, "kept": preview.kept}, text)
    return 0


def run_gc(args) -> int:
    s = settings_from_args(args)
    with progress_renderer(json_mode=args.json) as progress:  # a wait for the lock is shown
        rep = core.gc(settings=s, on_progress=progress)
    text = (f"removed {plural(len(rep.runtimes_removed), 'runtime')} and {plural(len(rep.blobs_removed), 'cached download')}, "
            f"freed {_size(rep.bytes_freed)}")
    if rep.removals_finished:
        text += f"\nfinished removing {plural(len(rep.removals_finished), 'runtime')} an interrupted removal left: " \
            + ", ".join(rep.removals_finished)
    text += "".join(f"\nkept {k.name}: {k.reason}" for k in rep.runtimes_kept)
    if rep.blobs_kept_shared:
        text += f"\nkept {plural(len(rep.blobs_kept_shared), 'download')} still used by other runtime homes sharing this cache: {', '.join(rep.other_homes)}"
    left = [c for c in core.cache_usage(s) if c.bytes and c.name != "downloads"] if not args.json else []
    if left:  # gc leaves the build and probe caches to `accelstack cache`: say what they hold
        text += "\nleft to `accelstack cache purge`: " + ", ".join(f"{c.name} cache {_size(c.bytes)} ({c.path})" for c in left)
    emit(args, rep, text)
    return 0
