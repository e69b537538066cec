"""`accelstack plan`: which torch or ggml build fits this machine, and why the others do not."""
from __future__ import annotations

import argparse

from .. import core
from ..core.manifest_files import ANY_BACKEND, Manifests, manifests_with
from ..errors import UsageError
from ..hardware.report import HardwareReport
from ..manifests.plan import Plan
from .common import add_engine_package_argument, emit, report_from, settings_from_args

__all__ = ["BACKEND_ENV", "register", "run", "check_backend", "render"]

BACKEND_ENV = "ACCELSTACK_BACKEND"
MiB = 1024 * 1024


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="decide which torch or ggml build to install here, with the reasons",
        description="Resolve the build that fits a machine: every candidate considered, in preference order, "
        "accepted or rejected with a reason you can act on; the chosen one as pip/uv commands (torch) or "
        "artifacts (ggml), and the environment to set at launch. Nothing is downloaded or installed.",
        epilog="examples:\n"
        "  accelstack plan --stack torch                     for this machine\n"
        "  accelstack plan --stack torch 'torch<2.7'         with a pin (says so when it cannot be met)\n"
        "  accelstack plan --stack torch --python 3.9        for a Python 3.9 environment\n"
        "  accelstack plan --hardware report.json --json     for a report from `accelstack detect --json`\n"
        "  accelstack plan --stack ggml --manifest m.json    against a ggml variant manifest (in place of the channels)\n"
        f"  {BACKEND_ENV}=vulkan accelstack plan             force a backend\n"
        "exit status: 0 a plan was made as asked; 3 the request cannot be met here (see conflicts); "
        "1/2 errors.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("requirements", nargs="*", metavar="REQUIREMENT", help="torch-family pins such as 'torch==2.6.*' or 'torchvision<0.22'")
    p.add_argument("--stack", choices=["ggml", "torch"], default="ggml", help="which runtime to plan (default ggml)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--hardware", metavar="FILE", help="a HardwareReport JSON (from `accelstack detect --json`) instead of detecting")
    src.add_argument("--replay", metavar="DIR", help="detect from a capture directory instead of this machine")
    p.add_argument("--backend", default=None, help=f"force a backend (cuda, rocm, vulkan, cpu, ...) or a variant (cu126); default ${BACKEND_ENV}")
    p.add_argument("--python", default="", metavar="X.Y", help="Python version of the target environment (default: the detected one)")
    add_engine_package_argument(p)
    p.add_argument("--manifest", dest="manifest_files", action="append", default=[], metavar="FILE",
                   help="a manifest file to plan against (ggml variants, or a torch matrix replacing the built-in one); repeatable")
    p.add_argument("--json", action="store_true", help="print the Plan as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args, backend=args.backend)  # the option over $ACCELSTACK_BACKEND
    notes = []
    if args.manifest_files:  # --manifest: files to plan against, in place of the channels
        manifests = manifests_with(args.manifest_files)
    else:  # the channels `install` reads, verified as it verifies them (nothing is recorded)
        trusted = core.plan_sources(settings, args.stack)
        manifests = trusted.manifests
        if core.stack_info(args.stack).reads_channels and not trusted.channels:
            notes.append(core.NO_CHANNEL_LINE)
    check_backend(settings.backend, manifests, args.stack, option=args.backend is not None)
    report = report_from(args)  # a replayed machine's disk is measured at its own home, as `detect --replay` does
    plan = core.plan(report, args.stack, requirements=args.requirements, backend=settings.backend,
                     python=args.python, manifests=manifests, settings=settings)
    plan.notes += notes
    if args.manifest_files:
        plan.notes.append(f"planned with {', '.join(args.manifest_files)} as given: signatures are checked when a manifest is installed from")
    ok = plan.status in ("ready", "needs-build") and not plan.conflicts
    emit(args, plan, render(plan, report), ok=ok)
    return 0 if ok else 3


def check_backend(backend: str, manifests: Manifests, stack: str, *, option: bool) -> None:
    """A forced backend must name a backend or a variant the manifests know (a typo is not a plan)."""
    if not backend:
        return
    known = manifests.backend_choices(stack)
    if backend.strip().lower() not in {k.lower() for k in known} | ANY_BACKEND:
        where = "--backend" if option else f"${BACKEND_ENV}"
        raise UsageError(f"{where} {backend!r} is not a {stack} backend or variant", f"use one of: {', '.join(known)}")


def render(plan: Plan, report: HardwareReport) -> str:
    o = report.os
    py = plan.request.python or o.python_version
    for_python = core.stack_info(plan.stack).needs_python
    head = f"{plan.stack} plan for {o.name} {o.arch}{' (WSL2)' if o.wsl else ''}" + (f", Python {py}" if py and for_python else "")
    if report.source and report.source != "live":
        head += f"  [{report.source}]"
    lines = [head, f"decision: {plan.summary}  [{plan.status}]"]
    chosen = plan.chosen
    if chosen is not None:
        lines.append(f"  {chosen.reason}")
    if plan.device_reason:
        lines.append(f"  devices: {plan.device_reason}")
    if plan.commands:
        lines.append("install:")
        lines += [f"  $ {c.render()}" for c in plan.commands]
        lines += [f"  or with uv: $ {c.render()}" for c in plan.uv_commands]
    if plan.artifacts:
        lines.append("fetch:")
        for a in plan.artifacts:
            lines.append(f"  {a.name}  {a.size / MiB:.1f} MiB  sha256 {a.sha256[:16]}…  from {a.urls[0]}" + (f" (+{len(a.urls) - 1} mirror)" if len(a.urls) > 1 else ""))
    if plan.build is not None:  # what the decision already says (the build's reason, its features) is not said again
        b = plan.build
        lines.append("local build needed:" if plan.status == "needs-build" else "a local build would do better:")
        if b.reason not in plan.summary:
            lines.append(f"  {b.reason}")
        extra = [f"{k}={v}" for k, v in b.properties.items() if f"{k} {v}" not in b.reason]
        if extra:
            lines.append("  " + ", ".join(extra))
    if plan.env:
        lines.append("environment at launch:")
        lines += [f"  {k}={v}" for k, v in plan.env.items()]
    if plan.conflicts:
        lines.append("cannot be met as asked:")
        lines += [f"  ! {c}" for c in plan.conflicts]
    if plan.notes:
        lines.append("notes:")
        lines += [f"  - {n}" for n in plan.notes]
    rejected = plan.rejected
    if plan.status == "needs-build" and plan.build is not None:  # "no published build" is the decision itself
        rejected = [c for c in rejected if not (c.code == "no-artifact" and c.backend == plan.build.backend)]
    if rejected:
        lines.append("rejected:")
        lines += [f"  {c.reason}" for c in rejected]
    others = [c for c in plan.candidates if c.accepted and not c.chosen]
    if others:
        lines.append("also possible: " + ", ".join(f"{c.name}" + (f" (torch {c.torch_version})" if c.torch_version else "") for c in others))
    if plan.manifests:
        lines.append("decided from: " + "; ".join(plan.manifests))
    return "\n".join(lines)
