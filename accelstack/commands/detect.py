"""`accelstack detect`: what accelerators this machine has, what to use, and what is wrong."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import List, Optional

from .. import core, fsio
from ..errors import UsageError
from ..hardware.report import GPU, HardwareReport, Problem
from ..settings import Timeouts
from .common import check_output_path, emit, settings_from_args, what_to_do

__all__ = ["register", "run", "render"]

GiB = 1024 ** 3
DEFAULT_TIMEOUT = Timeouts.detect
FORMATS = ("text", "json", "nfd", "prometheus")
FLEET_FORMATS = ("nfd", "prometheus")  # the files fleet tools read (docs/fleet.md)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "detect",
        help="report this machine's CPU, GPUs, drivers and usable accelerator APIs",
        description="Report the CPU, every GPU (vendor, name, PCI ids, VRAM, driver, compute capability / "
        "gfx target), which accelerator APIs are usable with their evidence, the preferred order, "
        "and problems you can fix. Nothing is installed or changed.",
        epilog="examples:\n"
        "  accelstack detect                      human summary\n"
        "  accelstack detect --json > report.json the HardwareReport, for `accelstack plan --hardware`\n"
        "  accelstack detect --capture bug/       also save everything detection read (attach it to a bug report)\n"
        "  accelstack detect --replay bug/        detect from a capture, on any OS\n"
        "  accelstack detect --refresh            enumerate Vulkan devices again instead of using the kept answer\n"
        "  accelstack detect --format nfd --output /etc/kubernetes/node-feature-discovery/features.d/accelstack\n"
        "                                         Kubernetes node labels, read by Node Feature Discovery's local source\n"
        "  accelstack detect --format prometheus --output /var/lib/node_exporter/textfile_collector/accelstack.prom\n"
        "                                         the same facts as metrics, read by node_exporter's textfile collector\n"
        "\nnfd and prometheus also report each stack's active runtime and its last verify verdict (from the\n"
        "runtime home, --home; none for --replay). --output writes the file atomically (a temporary dot-file\n"
        "renamed over it), so NFD and the node exporter never read half a file; run it from a timer (docs/fleet.md).\n"
        "\nThe Vulkan enumeration (a child process that loads every Vulkan driver) is kept in the cache folder\n"
        "and redone when a driver, the loader, a GPU or the Vulkan environment variables change.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--capture", metavar="DIR", help="save every file, command output and platform fact read into DIR")
    src.add_argument("--replay", metavar="DIR", help="detect from a capture directory instead of this machine")
    p.add_argument("--json", action="store_true", help="print the HardwareReport as JSON (the same as --format json)")
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="text (default): for people; json: the HardwareReport; nfd: a Node Feature Discovery "
                   "feature file (name=value node labels); prometheus: a node-exporter textfile (gauges)")
    p.add_argument("--output", "-o", metavar="FILE",
                   help="nfd, prometheus: write the file here, atomically, instead of printing it (the textfile "
                   "collector reads only names ending in .prom; NFD every file but dot-files)")
    p.add_argument("--expires-in", type=float, default=None, metavar="S",
                   help="nfd: NFD ignores the labels S seconds from now unless the file is written again "
                   "(its `# +expiry-time=` directive)")
    p.add_argument("--home", metavar="DIR",
                   help="the runtime home: where free disk is measured and, for nfd and prometheus, whose active "
                   "runtimes are reported (default: ACCELSTACK_HOME or the user data dir)")
    p.add_argument("--refresh", action="store_true",
                   help="run the Vulkan enumeration again instead of using its kept answer (a capture always runs it)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                   help=f"limit for each external command (default {DEFAULT_TIMEOUT:g} s)")
    p.set_defaults(func=run)


def _format(args: argparse.Namespace) -> str:
    """The output format asked for, every combination that cannot be honoured refused before detection."""
    fmt = args.format or ("json" if args.json else "text")
    if args.json and fmt != "json":
        raise UsageError(f"--json and --format {fmt} ask for two outputs", "pass one of them")
    fleet = fmt in FLEET_FORMATS
    if args.output and not fleet:
        raise UsageError("--output writes an nfd or prometheus file", "add --format nfd or --format prometheus, "
                         "or redirect the output (`accelstack detect --json > report.json`)")
    if args.expires_in is not None and fmt != "nfd":
        raise UsageError("--expires-in sets the expiry of an NFD feature file", "add --format nfd")
    if args.expires_in is not None and not 0 < args.expires_in < 10 ** 9:  # nan, inf and past 2050 too
        raise UsageError("--expires-in must be a positive number of seconds (below 1000000000)")
    if args.output:
        check_output_path(Path(args.output), f"the {fmt} file")
    return fmt


def run(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        raise UsageError("--timeout must be positive")
    fmt = _format(args)
    # (core.ReplaySystem and core.CapturingSystem load on first use: `detect --json` does not pay for them)
    if args.replay:  # the replayed machine's own home rule, never this machine's cache
        report = core.detect(core.ReplaySystem(args.replay), timeout=args.timeout)
        report.source = f"replay:{args.replay}"
    elif args.capture:  # every probe for real, the home rule read through the capture
        core.CapturingSystem.check_target(args.capture)  # a folder it cannot go in is said before detection runs
        check_output_path(Path(args.capture), "the capture", folder=True)
        capturing = core.CapturingSystem(core.LiveSystem())
        report = core.detect(capturing, timeout=args.timeout)
        capturing.save(args.capture)
    else:
        report = core.detect(settings=settings_from_args(args), refresh=args.refresh, timeout=args.timeout)
    if fmt in FLEET_FORMATS:
        return _write_fleet(args, fmt, report)
    args.json = fmt == "json"
    text = "" if args.json else render(report)  # --json prints the report alone
    if args.capture and not args.json:
        text += f"\n\ncapture written to {args.capture} (replay it with `accelstack detect --replay {args.capture}`)"
    emit(args, report, text)
    return 0


def _write_fleet(args: argparse.Namespace, fmt: str, report: HardwareReport) -> int:
    """The NFD or Prometheus file of ``report`` and this machine's active runtimes, printed or written."""
    from . import fleet_format  # only these two formats need it: a cold `detect --json` does not load it

    # a replay is another machine: this machine's runtimes are not its own
    runtimes = [] if args.replay else core.installed_runtimes(report, settings_from_args(args))
    if fmt == "nfd":
        expires = None if args.expires_in is None else time.time() + args.expires_in
        text = fleet_format.nfd_text(core.node_labels(report, runtimes), report.source, expires)
    else:
        text = fleet_format.prometheus_text(core.node_metrics(report, runtimes))
    if args.capture:  # stdout holds the file alone
        print(f"capture written to {args.capture}", file=sys.stderr)
    if not args.output:
        sys.stdout.write(text)
        return 0
    target = Path(args.output)
    try:
        fsio.write_text(target, text, make_parents=True)
    except OSError as exc:  # checked before detection, but the disk may have filled or changed since
        raise UsageError(f"cannot write the {fmt} file to {target}: {exc.strerror or exc}",
                         "free some space or choose another output path", code="output-path") from None
    print(f"{fmt} file written to {args.output}", file=sys.stderr)
    return 0


# The command line for a problem's action, where one exists (the library names the action only).
def _what_to_do(problem: Problem) -> Optional[str]:
    return what_to_do(problem.hint, problem.action) or None


def _size(n: Optional[int]) -> str:
    return f"{n / GiB:.1f} GiB" if n else "?"


def _gpu_line(g: GPU) -> List[str]:
    head = f"  [{g.index}] {g.name} ({g.vendor}, {g.kind})"
    facts = []
    if g.pci_vendor_id:
        facts.append(f"pci {g.pci_vendor_id}:{g.pci_device_id}" + (f" at {g.bus_id}" if g.bus_id else ""))
    if g.vram_total:
        facts.append(f"VRAM {_size(g.vram_total)}" + (f" ({_size(g.vram_free)} free)" if g.vram_free is not None else ""))
    elif g.vram_at_least:
        facts.append(f"VRAM >= {_size(g.vram_at_least)} (exact size unknown)")
    if g.driver or g.driver_version:
        facts.append(f"driver {g.driver} {g.driver_version}".strip())
    if g.compute_capability:
        facts.append(f"compute capability {g.compute_capability}")
    if g.cuda_driver_version:
        facts.append(f"CUDA up to {g.cuda_driver_version}")
    if g.gfx_target:
        facts.append(g.gfx_target)
    if g.intel_generation:
        facts.append(g.intel_generation)
    if g.apple_family or g.metal_support:
        facts.append(" ".join(filter(None, [g.apple_family, g.metal_support])))
    return [head, "      " + ", ".join(facts)] if facts else [head]


def render(r: HardwareReport) -> str:
    o = r.os
    flags = [f for f in ("WSL2" if o.wsl else "", "Rosetta" if o.rosetta else "", f"container: {o.container}" if o.container else "") if f]
    # what a capture did not record is said so, not shown as blanks, "?" or this machine's home
    unknown = "not in the capture" if r.source.startswith("replay:") else "unknown"
    cpu = r.cpu
    memory = r.memory
    lines = [
        f"OS       {o.name} {o.version} ({o.arch}{', ' + o.libc + ' ' + o.libc_version if o.libc else ''}){'  [' + ', '.join(flags) + ']' if flags else ''}",
        f"Python   {o.python_version or unknown}",
        f"CPU      {cpu.model or cpu.vendor or 'unknown'}: {cpu.physical_cores or '?'} cores / {cpu.logical_cores or '?'} threads"
        + (f", x86-64-v{cpu.x86_64_level}" if cpu.x86_64_level else "") + f"\n         features: {' '.join(cpu.features) or 'unknown'}"
        if cpu.model or cpu.vendor or cpu.physical_cores or cpu.logical_cores or cpu.features else f"CPU      {unknown}",
        (f"Memory   {_size(memory.ram_total)} RAM ({_size(memory.ram_available)} available)" if memory.ram_total else f"Memory   {unknown}")
        + (f"; {_size(memory.disk_free)} free at {memory.disk_path}" if memory.disk_free else ""),
        "GPUs" if r.gpus else "GPUs     none found",
    ]
    for g in r.gpus:
        lines += _gpu_line(g)
    for n in r.npus:  # not GPUs: listed for apps that can use one, never in the order below
        lines.append(f"NPU      {n.name} (pci {n.pci_vendor_id}:{n.pci_device_id} at {n.bus_id}, driver {n.driver or 'none bound'})")
    if r.rocm_version:
        lines.append(f"ROCm     {r.rocm_version} installed")
    lines.append("APIs")
    for a in r.apis:
        mark = "yes" if a.usable else "no "
        lines.append(f"  {mark} {a.name}{' ' + a.version if a.version else ''}" + (f" — {a.evidence[0]}" if a.evidence else ""))
        for ev in a.evidence[1:]:
            lines.append(f"        {ev}")
    lines.append("Use, in this order")
    for i, pref in enumerate(r.preference, 1):
        lines.append(f"  {i}. {pref.api}{'' if pref.gpu is None else f' on GPU {pref.gpu}'} — {pref.reason}")
    if r.problems:
        lines.append("Problems")
        for pr in r.problems:
            lines.append(f"  {pr.severity}: {pr.message}")
            todo = _what_to_do(pr)
            if todo:
                lines.append(f"           what to do: {todo}")
    lines.append(f"(detected in {r.duration_ms:.0f} ms{', from ' + r.source if r.source != 'live' else ''})")
    return "\n".join(lines)
