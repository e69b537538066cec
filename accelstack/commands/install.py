"""`accelstack install | status | repair | upgrade | rollback | uninstall | gc`: runtimes on disk."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

from ..detect import detect
from ..detect.report import HardwareReport
from ..detect.system import LiveSystem, ReplaySystem
from ..errors import UsageError
from ..manifests.plan import Request
from ..serde import loads, to_dict
from .progress import progress_renderer

MiB = 1024 * 1024


def _common(p: argparse.ArgumentParser, manifests: bool = True) -> None:
    p.add_argument("--json", action="store_true", help="print the result as JSON (progress as JSON lines)")
    p.add_argument("--home", metavar="DIR", help="runtime home (default: ACCELSTACK_HOME or the user data dir)")
    p.add_argument("--wait", type=float, default=0.0, metavar="S", help="wait up to S seconds for another accelstack to finish")
    if manifests:
        p.add_argument("--manifest", action="append", default=[], metavar="URL",
                       help="ggml manifest to install from (URL or path; its .sig is fetched beside it). Repeatable.")
        p.add_argument("--insecure-unsigned", action="store_true", help="accept an unsigned manifest (a local mirror you control)")
        p.add_argument("--trusted-key", action="append", default=[], metavar="KEY", help="extra trusted public key (base64 or .pub file)")
        p.add_argument("--offline", action="store_true", help="use only the download cache, no network (or ACCELSTACK_OFFLINE=1)")
        p.add_argument("--no-build", action="store_true", help="never build a ggml runtime from source when no published build fits")
        p.add_argument("--hardware", metavar="FILE", help=argparse.SUPPRESS)
        p.add_argument("--replay", metavar="DIR", help=argparse.SUPPRESS)


def register(sub: "argparse._SubParsersAction") -> None:
    p = sub.add_parser(
        "install",
        help="first run: detect, plan, fetch, install, verify and activate a runtime",
        description="Install the runtime that fits this machine. ggml (default): a stable-diffusion.cpp build, "
        "fetched from a signed manifest or built from source, installed into its own directory and activated "
        "only after it loads. torch: the planned PyTorch wheel installed into a Python environment, checked "
        "there, and rolled back to what was there before if it does not work. A second run on a healthy "
        "install does nothing.",
        epilog="examples:\n"
        "  accelstack install                               ggml runtime for this machine\n"
        "  accelstack install --manifest https://host/ggml-manifest.json\n"
        "  accelstack install --dry-run --json              what would be installed\n"
        "  accelstack install --stack torch --venv .venv    the right torch build into .venv",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--stack", choices=["ggml", "torch"], default="ggml")
    p.add_argument("--backend", default="", help="force a backend (cuda, vulkan, cpu, ...) or ACCELSTACK_BACKEND")
    p.add_argument("--dry-run", action="store_true", help="show what would be installed and stop")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation (installs never prompt when not on a terminal)")
    p.add_argument("--force", action="store_true", help="reinstall even if the same runtime is installed")
    p.add_argument("--python", dest="target_python", metavar="PATH", help="torch: the interpreter to install into (default: this one)")
    p.add_argument("--venv", metavar="DIR", help="torch: install into this virtual environment (created if missing)")
    p.add_argument("--uv", action="store_true", help="torch: use uv instead of pip when available")
    p.add_argument("requirements", nargs="*", metavar="REQUIREMENT", help="torch: pins such as 'torch==2.6.*'")
    _common(p)
    p.set_defaults(func=run_install)

    p = sub.add_parser("status", help="what is installed and active, and whether it still fits this machine")
    _common(p)
    p.set_defaults(func=run_status)

    p = sub.add_parser("repair", help="re-hash installed files, restore missing or corrupt ones, re-check")
    _common(p, manifests=False)
    p.add_argument("--offline", action="store_true", help="use only the download cache")
    p.set_defaults(func=run_repair)

    p = sub.add_parser("upgrade", help="install the newest fitting runtime side by side, check it, switch")
    p.add_argument("--backend", default="")
    _common(p)
    p.set_defaults(func=run_upgrade, stack="ggml", dry_run=False, force=False, yes=True, requirements=[])

    p = sub.add_parser("rollback", help="switch back to the previous runtime")
    _common(p, manifests=False)
    p.set_defaults(func=run_rollback)

    p = sub.add_parser("uninstall", help="remove the installed ggml runtimes")
    _common(p, manifests=False)
    p.add_argument("--yes", "-y", action="store_true")
    p.set_defaults(func=run_uninstall)

    p = sub.add_parser("gc", help="remove inactive runtimes (keeping the previous one) and unused downloads")
    _common(p, manifests=False)
    p.set_defaults(func=run_gc)


def _home(args):
    from ..installer.state import Home

    return Home(Path(args.home) if args.home else None)


def _report(args) -> HardwareReport:
    if getattr(args, "hardware", None):
        return loads(HardwareReport, Path(args.hardware).read_text(), args.hardware)
    if getattr(args, "replay", None):
        return detect(ReplaySystem(args.replay))
    return detect(LiveSystem())


def _opts(args):
    from ..installer.flow import ManifestOptions

    offline = True if args.offline else None
    return ManifestOptions(urls=list(args.manifest), insecure_unsigned=args.insecure_unsigned, offline=offline,
                           allow_build=not args.no_build, extra_keys=list(args.trusted_key))


def _emit(args, data, text: str) -> None:
    if args.json:
        print(json.dumps({"result": to_dict(data)}, indent=2))
    else:
        print(text)


def _check():
    """The check run before activating: the engine's verify when available, else the import check."""
    from ..installer import ggml as ggml_rt

    try:
        from ..engine.verify import runtime_check  # type: ignore[attr-defined]

        return runtime_check
    except ImportError:
        return ggml_rt.import_check


def run_install(args) -> int:
    backend = args.backend or os.environ.get("ACCELSTACK_BACKEND", "")
    report = _report(args)
    if args.stack == "torch":
        return _install_torch(args, report, backend)
    from ..installer import flow

    with progress_renderer(json_mode=args.json) as progress:
        summary = flow.install(report, Request(stack="ggml", backend=backend), _opts(args), _home(args), force=args.force,
                               dry_run=args.dry_run, wait=args.wait, check=_check(), progress=progress)
    lines = [f"plan: {summary.plan.summary}"]
    if summary.recovered:
        lines += [f"recovered: {r}" for r in summary.recovered]
    if args.dry_run:
        lines.append(f"dry run: would install runtime {summary.runtime}" + (" (built from source)" if summary.built_locally else ""))
        for a in summary.plan.artifacts:
            lines.append(f"  {a.name}  {a.size / MiB:.1f} MiB  sha256 {a.sha256[:16]}…")
    elif not summary.changed:
        lines.append(f"runtime {summary.runtime} is already installed and active: nothing to do")
    else:
        r = summary.receipt
        lines.append(f"installed and activated runtime {summary.runtime}" + (f" (previous: {summary.previous}, kept for `accelstack rollback`)" if summary.previous else ""))
        if r is not None:
            lines.append(f"  at {r.path}: {len(r.files)} files, check: {r.verification.get('check', '')} ok")
        if summary.timings:
            lines.append("  " + ", ".join(f"{k} {v:.2f} s" for k, v in summary.timings.items()))
    _emit(args, summary, "\n".join(lines))
    return 0


def _install_torch(args, report: HardwareReport, backend: str) -> int:
    from ..installer.state import Receipt, now_iso
    from ..installer.torch import ensure_venv, install_torch
    from ..manifests.resolve import Manifests, resolve

    python = args.target_python or sys.executable
    py_version = ""
    if args.venv:
        python = ensure_venv(Path(args.venv)) if not args.dry_run else str(Path(args.venv) / "bin" / "python")
    if args.target_python or args.venv:
        import subprocess

        if Path(python).exists():
            py_version = subprocess.run([python, "-c", "import sys;print('%d.%d'%sys.version_info[:2])"], stdout=subprocess.PIPE, text=True).stdout.strip()
    plan = resolve(report, Request(stack="torch", requirements=list(args.requirements), backend=backend, python=py_version), Manifests.builtin())
    if not plan.ok:
        raise UsageError(f"no torch build fits: {plan.summary}", "; ".join(plan.conflicts) or "run `accelstack plan --stack torch`")
    if args.dry_run:
        _emit(args, plan, f"plan: {plan.summary}\n" + "\n".join("  $ " + c.render(python) for c in plan.commands))
        return 0
    home = _home(args)
    home.ensure()
    with home.lock("install torch", wait=args.wait), progress_renderer(json_mode=args.json) as progress:
        result = install_torch(plan, python, use_uv=args.uv, progress=progress)
        from ..installer.flow import hardware_fingerprint

        # one receipt per target environment: the same interpreter path always gets the same id
        rid = f"torch-{plan.variant}-{hashlib.sha256(str(Path(python).absolute()).encode()).hexdigest()[:10]}"
        receipt = Receipt(id=rid, stack="torch", backend=plan.backend, path=python, plan=to_dict(plan), env=dict(plan.env),
                          hardware_fingerprint=hardware_fingerprint(report), installed_at=now_iso(), verified_at=now_iso(),
                          verification={"check": "torch", "ok": result.ok, "reason": result.reason, **result.details})
        home.write_receipt(receipt)
        home.set_active("torch", rid)
    _emit(args, receipt, f"plan: {plan.summary}\ninstalled into {python}: {result.reason}")
    return 0


def run_status(args) -> int:
    from ..installer import flow

    home = _home(args)
    report = _report(args)
    opts = _opts(args)
    if not opts.urls:
        opts.urls = flow.remembered_manifests(home)
    stats = flow.status(report, home, opts)
    lines = [f"runtime home: {home.root}"]
    for st in stats:
        if not st.installed and not st.active:
            lines.append(f"{st.stack}: nothing installed")
            continue
        lines.append(f"{st.stack}: active {st.active or '(none)'}" + (f", previous {st.previous}" if st.previous else ""))
        if st.receipt:
            r = st.receipt
            lines.append(f"  backend {r.backend}, installed {r.installed_at}, verified {r.verified_at}, at {r.path}")
            lines.append(f"  fits this machine: {'yes' if st.hardware_matches else 'no' if st.hardware_matches is False else 'unknown'}")
        if st.upgrade_available:
            lines.append(f"  upgrade available: {st.upgrade_available} (run `accelstack upgrade`)")
        others = [i for i in st.installed if i not in (st.active, st.previous)]
        if others:
            lines.append(f"  also installed: {', '.join(others)} (`accelstack gc` removes them)")
        lines += [f"  problem: {p}" for p in st.problems]
    _emit(args, stats, "\n".join(lines))
    return 0


def run_repair(args) -> int:
    from ..installer import flow

    with progress_renderer(json_mode=args.json) as progress:
        rep = flow.repair(_home(args), check=_check(), offline=True if args.offline else None, wait=args.wait, progress=progress)
    if rep.healthy:
        text = f"runtime {rep.runtime}: all {rep.checked} files intact; check passed"
    else:
        text = f"runtime {rep.runtime}: {len(rep.missing)} missing and {len(rep.corrupt)} corrupt of {rep.checked} files; restored {len(rep.fixed)}; check passed"
        text += "".join(f"\n  fixed {f}" for f in rep.fixed)
    _emit(args, rep, text)
    return 0


def run_upgrade(args) -> int:
    from ..installer import flow

    report = _report(args)
    with progress_renderer(json_mode=args.json) as progress:
        summary = flow.upgrade(report, Request(stack="ggml", backend=args.backend), _opts(args), _home(args), wait=args.wait,
                               check=_check(), progress=progress)
    if summary.changed:
        text = f"upgraded to {summary.runtime}" + (f"; {summary.previous} kept for `accelstack rollback`" if summary.previous else "")
    else:
        text = f"already up to date: {summary.runtime}"
    _emit(args, summary, text)
    return 0


def run_rollback(args) -> int:
    from ..installer import flow

    state = flow.rollback(_home(args), wait=args.wait)
    _emit(args, state, f"active ggml runtime is now {state.active.get('ggml')} (previous: {state.previous.get('ggml', '-')})")
    return 0


def run_uninstall(args) -> int:
    from ..installer import flow

    if not args.yes and sys.stdin.isatty():
        if input("remove every installed ggml runtime? [y/N] ").strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return 1
    removed = flow.uninstall(_home(args), wait=args.wait)
    _emit(args, removed, f"removed {len(removed)} runtime(s)" + "".join(f"\n  {r}" for r in removed))
    return 0


def run_gc(args) -> int:
    from ..installer import flow

    rep = flow.gc(_home(args), wait=args.wait)
    _emit(args, rep, f"removed {len(rep.runtimes_removed)} runtime(s) and {len(rep.blobs_removed)} cached download(s), freed {rep.bytes_freed / MiB:.1f} MiB")
    return 0
