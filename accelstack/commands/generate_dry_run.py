"""``accelstack generate --dry-run``: the memory planner's decision, without loading anything (issue 45).

The machine is the core's: this one (live), a capture (``--replay DIR``) or declared by hand
(``--vram 8GiB --ram 16GiB``, over the live or replayed figures for what is not declared).
"""
from __future__ import annotations

import argparse
from typing import Any, List

from .. import core
from ..core import direct
from ..core import machine as core_machine
from ..serde import size_text, to_dict
from ..settings import Settings
from .common import emit, printable

__all__ = ["add_dry_run_flags", "dry_run"]


def add_dry_run_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("dry run (what the memory planner would do; nothing is loaded)")
    g.add_argument("--dry-run", action="store_true",
                   help="print each phase's memory estimate, the settings chosen and why (or why nothing fits and "
                   "what would), without loading the model or starting a worker")
    g.add_argument("--vram", default=None, metavar="SIZE", help="with --dry-run: a GPU with this much free memory "
                   "(8GiB, 8G, 8GB, 1536MiB); plans for --backend, default cuda")
    g.add_argument("--ram", default=None, metavar="SIZE", help="with --dry-run: this much RAM available")
    g.add_argument("--replay", default=None, metavar="DIR", help="with --dry-run: the memory of a captured machine "
                   "(`accelstack detect --capture`)")


def dry_run(args: argparse.Namespace, settings: Settings, request: Any, options: Any, runtime_at_hand: Any) -> int:
    """Plan ``request`` on the machine the flags name and print the decision (exit 0, whether it fits or not)."""
    ram = core_machine.parse_size(args.ram, "--ram") if args.ram is not None else None
    vram = core_machine.parse_size(args.vram, "--vram") if args.vram is not None else None
    given = args.backend if args.backend and core.stack_for_backend(args.backend) is None else None
    runtime = None if (given or vram is not None) else runtime_at_hand()
    backend = runtime.backend if runtime is not None else (given or ("cuda" if vram is not None else "cpu"))
    system = core.ReplaySystem(args.replay) if args.replay else None
    machine = core_machine.machine_memory(backend, system)
    source = f"replay:{args.replay}" if args.replay else "live"
    if ram is not None or vram is not None:
        machine, source = core_machine.declared_machine(backend, ram=ram, vram=vram, base=machine), "declared"
    decision = direct.dry_run(request, args.model or None, args.output, options, runtime=runtime, backend=backend,
                              machine=machine, source=source)
    data = to_dict(decision)
    data["dry_run"] = True
    emit(args, data, "\n".join(printable(line) for line in _lines(decision)))
    return 0


def _size(n: Any) -> str:
    return size_text(n) if n is not None else "unknown"


def _lines(d: Any) -> List[str]:
    where = {"live": "this machine", "declared": "the declared machine"}.get(d.machine, d.machine.replace("replay:", "the capture "))
    gpu = f", {_size(d.vram_free)} GPU memory free" if d.device == "gpu" else ""
    out = ["dry run: nothing loaded, no worker started",
           f"  {d.family} at {d.width}x{d.height}" + (f" x{d.batch}" if d.batch > 1 else "")
           + f" on {d.backend} ({d.device}), {where}: {_size(d.ram_available)} RAM available{gpu}"]
    if not d.fits and d.plan is None:
        out += [f"  would be refused: {d.refusal}", f"  what would fit: {d.hint}"]
        return out
    p = d.plan
    for ph in p.phases:
        out.append(f"  {ph.phase:<13} weights {size_text(ph.weights):>9} + working {size_text(ph.activations):>9}"
                   f"  on the {ph.device.upper()}")
    need = f"{size_text(p.vram_need)} GPU memory, " if p.device == "gpu" else ""
    out.append(f"  needs {need}{size_text(p.ram_need)} RAM" + ("" if p.fits else " (does not fit: the memory check is off)"))
    auto = set(p.chosen)
    settings = [("offload_to_cpu", p.offload_to_cpu), ("keep_clip_on_cpu", p.keep_clip_on_cpu),
                ("vae_tiling", p.vae_tiling), ("vae_tile_size", p.vae_tile_size), ("keep_vae_on_cpu", p.keep_vae_on_cpu),
                ("max_vram", p.max_vram), ("weight_type", p.weight_type)]
    out.append("  settings: " + ", ".join(f"{k} {_shown(v)}" + (" (auto)" if k in auto else "") for k, v in settings))
    out.append(f"  why: {p.reason}")
    return out


def _shown(v: Any) -> str:
    return ("on" if v else "off") if isinstance(v, bool) else f"{v:g}" if isinstance(v, float) else str(v)
