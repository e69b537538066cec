"""`accelstack verify`: prove that a runtime generates on this machine (no model download)."""
from __future__ import annotations

import argparse
import glob
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple, Union

from .. import core
from ..core import direct
from ..core.direct import Runtime, RuntimeNotFoundError
from ..errors import Action, Interrupted, UsageError
from ..serde import to_dict
from ..settings import Settings
from .common import completes, emit, printable, settings_from_args
from .progress import progress_renderer

__all__ = ["PROBE_NOISE", "RUNTIME_HINT", "add_runtime_arguments", "add_engine_arguments", "engine_options", "check_given_dirs",
           "active_runtime", "no_runtime_says_what_to_do", "runtime_from_args", "register", "run", "render"]

# The probe model's weights are random by design (nothing is downloaded): its image proves the
# runtime computes, deterministically and like the CPU build; it is not meant to show anything.
PROBE_NOISE = "noise by design: the probe model has random weights"
FAMILY_HELP = "; ".join(f"{name} ({spec.note})" for name, spec in direct.FAMILIES.items())
RUNTIME_HINT = "run `accelstack install` first, or pass --runtime DIR (a directory the " \
               "stable-diffusion-cpp-python wheel is installed in)"


# -- shared with `accelstack generate` -------------------------------------------------------------
def add_runtime_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runtime", metavar="DIR", help="the runtime directory to use (its packages go first on the "
                   "worker's PYTHONPATH); default: the runtime `accelstack install` activated")
    p.add_argument("--backend", default=None, metavar="NAME",
                   help="what the runtime was built for: cpu (default), cuda, vulkan, rocm, metal, ... or torch")


def _auto_on_off(text: str) -> Union[bool, str]:
    """``--offload-to-cpu auto|on|off`` (and true/false/yes/no): a bool, or "auto"."""
    value = text.strip().lower()
    if value == "auto":
        return "auto"
    if value in ("on", "true", "yes", "1"):
        return True
    if value in ("off", "false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected auto, on or off, got {direct.shown(text)}")


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine options (override config.yaml)")
    g.add_argument("--config", metavar="PATH", help="config.yaml to read (default: the user config dir's)")
    g.add_argument("--flash-attention", dest="flash_attention", action="store_true", default=None,
                   help="use flash attention in the diffusion model (default: on)")
    g.add_argument("--no-flash-attention", dest="flash_attention", action="store_false")
    # --offload-to-cpu and --vae-tiling alone mean on, as before the planner; a value says auto, on or off.
    g.add_argument("--offload-to-cpu", dest="offload_to_cpu", nargs="?", const=True, default=None,
                   type=_auto_on_off, metavar="auto|on|off",
                   help="keep weights in RAM and move them to VRAM when needed (default: auto = when they "
                   "do not fit the GPU, or its free memory is not known before loading)")
    g.add_argument("--no-offload-to-cpu", dest="offload_to_cpu", action="store_false")
    g.add_argument("--vae-tiling", dest="vae_tiling", nargs="?", const=True, default=None, type=_auto_on_off,
                   metavar="auto|on|off",
                   help="decode in tiles to save memory (default: auto = when the decode would not fit)")
    g.add_argument("--no-vae-tiling", dest="vae_tiling", action="store_false")
    g.add_argument("--vae-tile-size", type=int, default=None, metavar="N",
                   help="tile edge in latent pixels, 4..512 (default: auto = the largest that fits when tiling)")
    g.add_argument("--threads", default=None, metavar="N|auto", help="CPU threads (default: auto = physical cores)")
    g.add_argument("--weight-type", default=None, metavar="TYPE",
                   help="convert weights on load: auto (default: q8_0, then q4_k, only when nothing else fits), "
                   "default (as stored), f16, q8_0, ...")
    g.add_argument("--no-memory-check", dest="memory_check", action="store_false", default=None,
                   help="generate even when the memory estimate exceeds the free RAM/VRAM")
    _add_memory_levers(g)


def _auto_or_gib(text: str) -> Union[float, str]:
    """``--max-vram auto|GiB``: "auto", or the number (its range is the engine option's check)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto or a number of GiB, got {direct.shown(text)}") from None


def _add_memory_levers(g: argparse._ArgumentGroup) -> None:
    """The bundled engine's low-VRAM levers (issue 45), each also a config.yaml key and a service job field."""
    g.add_argument("--clip-on-cpu", dest="keep_clip_on_cpu", nargs="?", const=True, default=None, type=_auto_on_off,
                   metavar="auto|on|off", help="run the text encoders on the CPU, their weights in RAM (default: auto "
                   "= when the GPU lacks room for them)")
    g.add_argument("--vae-on-cpu", dest="keep_vae_on_cpu", nargs="?", const=True, default=None, type=_auto_on_off,
                   metavar="auto|on|off", help="decode on the CPU (default: auto = when neither the decode nor a "
                   "tiled decode fits the GPU)")
    g.add_argument("--max-vram", dest="max_vram", default=None, type=_auto_or_gib, metavar="auto|GiB",
                   help="with weights offloaded, cut each graph into segments that fit this many GiB of VRAM "
                   "(0: off; default: auto = only when nothing cheaper fits)")
    g.add_argument("--mmap", dest="enable_mmap", action="store_true", default=None,
                   help="read the model files through mmap (default: off)")
    g.add_argument("--no-mmap", dest="enable_mmap", action="store_false")
    g.add_argument("--lora-apply-mode", dest="lora_apply_mode", default=None, metavar="auto|immediately|at_runtime",
                   help="immediately: merge LoRAs into the weights once; at_runtime: apply them in every step (more "
                   "memory and time, exact on quantized weights); default: auto (at_runtime for quantized weights)")


LEVER_KEYS = ("keep_clip_on_cpu", "keep_vae_on_cpu", "max_vram", "enable_mmap", "lora_apply_mode")


def engine_options(args: argparse.Namespace, settings: Optional[Settings] = None) -> direct.EngineOptions:
    """The engine options of ``--config`` (else the settings' config file) and the flags above."""
    threads = args.threads
    if threads is not None and threads != "auto":
        try:
            threads = int(threads)
        except ValueError:  # not a number, or one of thousands of digits
            raise UsageError(f"--threads must be auto or a positive integer, got {direct.shown(threads)}") from None
    return direct.engine_options(settings or settings_from_args(args), args.config, {
        "flash_attention": args.flash_attention, "offload_to_cpu": args.offload_to_cpu,
        "vae_tiling": args.vae_tiling, "vae_tile_size": args.vae_tile_size, "threads": threads,
        "weight_type": args.weight_type, "memory_check": args.memory_check,
        **{k: getattr(args, k, None) for k in LEVER_KEYS},
    })


def check_given_dirs(args: argparse.Namespace, *flags: str) -> None:
    """A folder named on the command line (``--runtime``, ``--cpu-runtime``) that is not there is
    a usage error (exit 2), said before any work, like any other missing input."""
    for flag in flags:
        value = getattr(args, flag.lstrip("-").replace("-", "_"), None)
        if value and not Path(value).expanduser().is_dir():
            what = "does not exist" if not Path(value).expanduser().exists() else "is not a folder"
            raise UsageError(f"{flag} {value} {what}", "name the folder a runtime is installed in "
                             "(`accelstack status` shows the installed ones)")


def _check_verify_args(args: argparse.Namespace) -> None:
    """Everything verify can refuse without work: the output image, the folders, the tolerance."""
    if args.output:
        direct.check_outputs([Path(args.output)])  # the path as it will be written
    check_given_dirs(args, "--runtime", "--cpu-runtime")
    if args.tolerance is not None and not 0 <= args.tolerance <= 255:  # NaN fails both
        raise UsageError(f"--tolerance must be from 0 to 255 (a mean difference of pixel values), got {args.tolerance:g}")


def active_runtime(stack: str = "ggml"):
    """(receipt, where its runtime is) of the runtime `accelstack install` activated, or None."""
    from ..core.disk_state import runtime_path  # the installed runtimes' records: read when one is wanted

    s = settings_from_args(None)
    try:
        receipt = core.active_receipt(stack, s)
    except core.NoRuntimeError:
        return None
    return receipt, runtime_path(s, receipt)


@contextmanager
def no_runtime_says_what_to_do() -> Iterator[None]:
    """On the command line, "none is active" also offers --runtime DIR."""
    try:
        yield
    except core.NoRuntimeError:
        raise RuntimeNotFoundError("no runtime to use: none is given and none is active", hint=RUNTIME_HINT) from None


def runtime_from_args(args: argparse.Namespace):
    """The runtime named by hand: ``--runtime DIR`` with ``--backend``; a backend that names a stack
    outright (torch) without a directory is that stack's active runtime, else this interpreter's
    (the installed ggml runtime is the core's to find: ``core.verify``/``core.generate``)."""
    named = core.stack_for_backend(args.backend)
    d = core.locator_for_backend(args.backend)
    path = Path(args.runtime).expanduser().resolve() if args.runtime else None
    if path is None and named is not None:
        found = active_runtime(named.name)
        if found is not None:
            return d.engine_runtime(*found).check()
    return d.runtime_from_dir(path, args.backend or "")


# -- the command -------------------------------------------------------------------------------------
def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="prove that a runtime generates on this machine (synthesized probe model, no download)",
        description="Start a supervised worker on the runtime, generate a 64x64 image in one step from a "
        "synthesized Stable Diffusion 1.x probe model (no download), twice with the same seed, and check "
        "the size, the pixels and determinism (and, for a GPU runtime given --cpu-runtime, agreement with "
        "the CPU build). Prints PASS or FAIL with the reason, the device, load time, step time and it/s, "
        "and writes the PNG. Exit code 0 on PASS, 1 on FAIL.\n\n"
        "Model families: the SD 1.x probe proves the runtime, not the kernels of other architectures. "
        "--family F (repeatable) verifies with a reduced probe of family F instead, synthesized the same way: "
        + FAMILY_HELP + ". Each family's image goes beside the output (verify-<backend>-<family>.png). "
        "--model PATH (repeatable) reads the file's headers, names its family and verifies with that "
        "family's probe: it proves the runtime runs the family's kernels on this device; the file itself "
        "is not loaded (`accelstack generate` does that). Z-Image's DiT cannot be reduced (stable-diffusion.cpp "
        "fixes it at the real model's size): its probe is the whole DiT stored Q4_0, 3.75 GB (docs/engine.md).",
        epilog="examples:\n"
        "  accelstack verify --runtime ~/rt/cpu\n"
        "  accelstack verify --family flux --family sd1\n"
        "  accelstack verify --model ~/models/flux1-dev-Q4_K.gguf --json\n"
        "  accelstack verify --runtime ~/rt/cuda --backend cuda --cpu-runtime ~/rt/cpu --json\n"
        "  accelstack verify --backend torch --runtime ~/venvs/torch   (a venv or a pip --target dir)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_runtime_arguments(p)
    p.add_argument("--output", "-o", metavar="PNG", help="where to write the probe image "
                   "(default: verify-<backend>.png in the cache dir)")
    p.add_argument("--cpu-runtime", metavar="DIR", help="a CPU runtime to compare a GPU runtime's image with")
    p.add_argument("--tolerance", type=float, default=None, metavar="T",
                   help="largest mean difference (0-255) from the CPU image that passes (default 8)")
    p.add_argument("--probe-seed", type=int, default=None, metavar="N", help="seed of the synthesized probe model")
    p.add_argument("--no-diffusers", action="store_true", help="torch: skip the diffusers pipeline step")
    completes(p.add_argument("--family", action="append", metavar="F", dest="families",
                             help=f"verify with a reduced probe of model family F (repeatable): "
                             f"{', '.join(direct.family_names())}; default: sd1 alone"), direct.family_names())
    p.add_argument("--model", action="append", metavar="PATH", dest="models",
                   help="verify the probe of this model file's family (repeatable; the file is only inspected)")
    add_engine_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    _check_verify_args(args)
    named = core.stack_for_backend(args.backend)
    if named is not None and (args.families or args.models):
        raise UsageError(f"--family and --model verify the ggml engine's runtimes, not a {named.name} environment",
                         "drop them, or name a ggml runtime (--runtime DIR, --backend cpu/cuda/vulkan/...)")
    if named is not None:  # a stack's environment (torch): its own check, no probe generation on the engine
        return _run_stack_check(args, named.name)
    s = settings_from_args(args)
    families, models = _families_from_args(args)
    options = engine_options(args, s)
    cpu = Runtime(path=Path(args.cpu_runtime).expanduser().resolve(), backend="cpu") if args.cpu_runtime else None
    engine: Dict[str, Any] = {"options": options, "cpu_runtime": cpu,
              "tolerance": direct.DEFAULT_TOLERANCE if args.tolerance is None else args.tolerance,
              "probe_seed": direct.DEFAULT_SEED if args.probe_seed is None else args.probe_seed,
              "keep_probe": False}  # verified once: the temporary probe goes while the worker exits
    if families is not None:
        engine["families"] = families
    images, probes = _images_of(args, s), _folders_in(s.probe_cache)
    with progress_renderer(json_mode=args.json) as progress:
        try:
            if args.runtime:  # a directory given by hand: the engine's check alone
                report = direct.verify(runtime_from_args(args), s, output=args.output, progress=progress, **engine)
            else:  # the installed runtime, through the core, which records the verdict in its receipt
                with no_runtime_says_what_to_do():
                    report = core.verify(settings=s, output=args.output, on_progress=progress, **engine)
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: what is left, as json.md promises, and no bar open
            err = Interrupted.by(exc, _interrupted_state(args, s, images, probes), action=Action.RETRY)
            progress.end_open(err.message.split(":")[0])
            raise err from None
    text = render(report)
    if not args.runtime and not report.ok:
        text += ("\n  what to do  run `accelstack repair` (it restores damaged files and checks again); if it still "
                 "fails, `accelstack plan` shows why this build was chosen")
    payload = {"verdict": report.verdict, **to_dict(report)}
    if models:
        payload["models"], text = _model_kernels(models, text)
    emit(args, payload, text, ok=report.ok)
    return 0 if report.ok else 1


def _model_kernels(models: List[Any], text: str) -> Tuple[List[Dict[str, Any]], str]:
    """Each ``--model``'s entry and lines: its probe, and which of the file's weight kernels that probe ran
    and which it did not (issue 44: a Q4_K file's kernels are not the F16 probe's)."""
    out: List[Dict[str, Any]] = []
    for m in models:
        cov = direct.kernel_coverage(m)
        out.append({**to_dict(m), "statement": cov.statement,
                    "kernels": {"file": cov.file_types, "probe": cov.probe_types, "ran": cov.ran, "not_run": cov.not_run}})
        text += (f"\n  model       {printable(m.path)}: {printable(m.family_name or m.family)} -> the {m.probe} probe"
                 f"\n              ({cov.statement})")
    return out, text


def _images_of(args: argparse.Namespace, s: Settings) -> Dict[str, object]:
    """The probe images this verify may write (``-o`` and its families' beside it, else the verify
    folder's), each with what tells a file written now from the one that was there."""
    out = Path(args.output).expanduser() if args.output else None
    paths = [out, *out.parent.glob(f"{glob.escape(out.stem)}-*.png")] if out else list(s.verify_dir.glob("verify-*.png"))
    return {str(p): direct.file_stamp(p) for p in paths}


def _folders_in(folder: Path) -> Set[str]:
    """The probe cache's folders: a probe model is one (its seeded pools beside them are a kept cache)."""
    try:
        return {str(p) for p in folder.iterdir() if p.is_dir()}
    except OSError:
        return set()


def _interrupted_state(args: argparse.Namespace, s: Settings, images: Dict[str, object], probes: Set[str]) -> str:
    """What an interrupted verify left: no verdict (a receipt records one only at the end), the probe
    images written if any, the worker stopped, and whether a probe model stayed behind."""
    after = _images_of(args, s)
    written = [p for p, was in after.items() if after[p] is not None and images.get(p) != was]
    left = sorted(_folders_in(s.probe_cache) - probes)
    return ("no verdict was recorded and " + (f"the probe image {', '.join(written)} was written" if written
                                             else "no probe image was written")
            + "; the worker was stopped and " + (f"the probe model {', '.join(left)} was left" if left
                                                 else "the temporary probe model removed"))


def _families_from_args(args: argparse.Namespace) -> Tuple[Optional[List[str]], List[direct.ModelFamily]]:
    """The families ``--family`` and ``--model`` name (None: neither given, the default check),
    each known, and the models' inspections: refused before any work."""
    families = list(args.families or [])
    models = direct.probe_families_of(args.models) if args.models else []
    families += [m.probe for m in models]
    if not families:
        return None, models
    return direct.check_families(families), models


def _secs(v: Optional[float]) -> str:
    return "?" if v is None else f"{v:.2f} s"


def _render_families(r) -> List[str]:
    """One line per family of a ``--family``/``--model`` verify."""
    lines = []
    for family, f in (r.details.get("families") or {}).items():
        fam = f.get("details", {}).get("family", {})
        what = f"{fam.get('name', family)}, {fam['parameters'] / 1e6:.0f} M parameters" if fam.get("parameters") else family
        state = "PASS" if f.get("ok") else "FAIL " + f.get("reason", "")
        lines.append(f"  {family:<11} {state}  ({what}; load {_secs(f.get('load_seconds'))}, "
                     f"generate {_secs(f.get('generate_seconds'))})")
        if f.get("image"):
            lines.append(f"  {'':<11} image {f['image']}")
    return lines


def render(r) -> str:
    dev = r.device
    device = "unknown" if dev is None else (f"{dev.name} — {dev.description}" if dev.description else dev.name)
    lines = [f"{r.verdict}  {r.backend} runtime {r.runtime}"]
    if not r.ok:
        lines.append(f"  reason      {r.reason}")
    several = len(r.details.get("families") or {}) > 1  # the run's figures are sums; each family's is on its line
    lines += [f"  device      {device}", f"  load        {_secs(r.load_seconds)}" + (" in all (each family's below)" if several else "")]
    if not several:
        lines.append(f"  step        {_secs(r.step_seconds)}" + (f" ({r.its_per_second:.2f} it/s)" if r.its_per_second else ""))
    lines.append("  checks      " + ", ".join(f"{c.name} {'ok' if c.ok else 'FAILED'}" for c in r.checks))
    lines += _render_families(r)
    det = next((c for c in r.checks if c.name == "deterministic"), None)
    if det is not None and det.detail != direct.IDENTICAL:  # compared with an earlier verify, or failed
        lines.append(f"  repeat      {det.detail}")
    if r.cpu_mean_diff is not None:
        lines.append(f"  vs CPU      mean difference {r.cpu_mean_diff:.2f}, largest {r.cpu_max_diff}")
    if r.image:
        lines.append(f"  image       {r.image}  ({PROBE_NOISE})")
    made = f"synthesized in {r.probe_seconds:.1f} s" + (" in all" if several else "") if r.probe_seconds else "reused"
    lines.append(f"  probe       {r.probe_path or 'one per family'} ({made}"
                 + (", removed after this run)" if r.probe_temporary else ", kept)"))
    lines.append(f"  total       {_secs(r.total_seconds)}")
    if not r.ok and r.log_tail:
        lines.append("  last worker log lines:")
        lines += [f"    {line}" for line in r.log_tail[-8:]]
    return "\n".join(lines)


def _run_stack_check(args: argparse.Namespace, stack: str) -> int:
    path = Path(args.runtime).expanduser().resolve() if args.runtime else None
    python, env = core.driver(stack).interpreter(path, active_runtime(stack) if path is None else None)
    seed = None if args.no_diffusers else direct.DEFAULT_SEED if args.probe_seed is None else args.probe_seed
    with progress_renderer(json_mode=args.json) as progress:
        report = direct.verify_torch_runtime(settings_from_args(args), python=python, env=env, probe_seed=seed,
                                             progress=progress)
    found = direct.torch_details(report)  # the per-op view this command renders
    lines: List[str] = [f"{report.verdict}  torch {found.torch_version or '?'} ({report.runtime})"]
    if not report.ok:
        lines.append(f"  reason      {report.reason}")
    lines.append(f"  device      {found.device_kind} — {found.device_name}" if found.device_kind
                 else "  device      none: torch did not run")
    for kind, why in found.rejected.items():
        lines.append(f"  not used    {kind}: {why}")
    for op in found.ops:
        err = "" if op.error is None else f", error {op.error:.2e} (tolerance {op.tolerance:g})"
        lines.append(f"  {op.name:<11} {'ok' if op.ok else 'FAILED'}{err}"
                     + (f", {op.seconds * 1000:.1f} ms" if op.seconds is not None else "") + (f" — {op.detail}" if op.detail else ""))
    if found.diffusers:
        d = found.diffusers
        lines.append(f"  diffusers   {'ok' if d.get('ok') else 'FAILED'}"
                     + (f", step {d['step_seconds']:.2f} s" if d.get("step_seconds") is not None else "")
                     + (f" — {d['detail']}" if d.get("detail") else ""))
    lines.append(f"  total       {report.total_seconds:.2f} s")
    emit(args, {"verdict": report.verdict, "ok": report.ok, "reason": report.reason, "python": report.runtime,
                **to_dict(found), "seconds": report.total_seconds}, "\n".join(lines), ok=report.ok)
    return 0 if report.ok else 1
