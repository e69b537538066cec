"""The engine on a runtime the caller names (``--runtime DIR``), without a receipt: the check
``accelstack verify`` runs and the images ``accelstack generate`` makes, with the paths of the
caller's settings.

The installed runtime goes through :func:`accelstack.core.verify` / :func:`~accelstack.core.generate`
instead, which find it from its receipt and record the verdict there.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple, Union

from ..engine.config import EngineOptions, apply_overrides, load_config, shown
from ..engine.errors import InvalidRequestError, RuntimeNotFoundError
from ..engine.request.check import CheckedGeneration
from ..engine.request.check import check_generation as _check_generation
from ..engine.runtime import GGML, Runtime
from ..engine.worker import protocol  # the request's fields and limits, for the CLI's flags
from ..engine.worker.protocol import SAMPLERS, SCHEDULERS, GenerateRequest
from ..errors import Action, Interrupted
from ..events import ProgressCallback, null_progress
from ..hardware.protocol import System
from ..lazy import lazy_exports
from ..serde import plural
from ..settings import Settings
from .machine import machine_memory  # the machine's memory for the planner: LiveSystem, light
from .stacks import stack_info

if TYPE_CHECKING:  # the lazy names below, for the type checker
    from ..engine.generation import GenerateReport
    from ..engine.models.check import check_model
    from ..engine.png import input_png_size
    from ..engine.probes.families import FAMILIES, ModelFamily, check_families, family_names, probe_families_of
    from ..engine.probes.model import DEFAULT_SEED
    from ..engine.request.components import check_components
    from ..engine.request.outputs import check_not_inputs, check_outputs, output_paths
    from ..engine.supervision.supervisor import Supervisor
    from ..engine.verification.kernels import kernel_coverage
    from ..engine.verification.probe_verify import DEFAULT_TOLERANCE, IDENTICAL
    from ..engine.verification.torch_verify import torch_details
    from ..verdict import VerifyReport
    from .dry_runs import dry_run

# Loaded on first use: a generate does not import the probes' and verify's modules, and its worker
# starts (commands/generate.py) before the model checks and the memory planner are imported.
_LAZY = {
    "check_components": "accelstack.engine.request.components", "GenerateReport": "accelstack.engine.generation",
    "check_outputs": "accelstack.engine.request.outputs", "check_not_inputs": "accelstack.engine.request.outputs",
    "output_paths": "accelstack.engine.request.outputs", "check_model": "accelstack.engine.models.check",
    "input_png_size": "accelstack.engine.png", "FAMILIES": "accelstack.engine.probes.families", "ModelFamily": "accelstack.engine.probes.families",
    "check_families": "accelstack.engine.probes.families", "family_names": "accelstack.engine.probes.families",
    "probe_families_of": "accelstack.engine.probes.families", "DEFAULT_SEED": "accelstack.engine.probes.model",
    "torch_details": "accelstack.engine.verification.torch_verify", "DEFAULT_TOLERANCE": "accelstack.engine.verification.probe_verify",
    "IDENTICAL": "accelstack.engine.verification.probe_verify", "dry_run": "accelstack.core.dry_runs",
    "kernel_coverage": "accelstack.engine.verification.kernels", }
if not TYPE_CHECKING:  # a type checker sees the names above, and no others
    __getattr__ = lazy_exports(__name__, _LAZY, globals())

CONVERTED_CACHE = "converted"  # under Settings.cache: models converted once (accelstack cache lists it)

__all__ = ["CONVERTED_CACHE", "with_caches", "DEFAULT_SEED", "DEFAULT_TOLERANCE", "FAMILIES", "IDENTICAL", "ModelFamily", "check_families", "family_names",
           "probe_families_of", "SAMPLERS", "SCHEDULERS", "EngineOptions", "GenerateReport",
           "GenerateRequest", "Runtime", "RuntimeNotFoundError", "check_model", "check_components", "protocol",
           "check_outputs", "check_not_inputs", "check_generation", "CheckedGeneration", "early_worker", "generate_checked", "engine_options",
           "engine_options_over", "generate", "Generated", "run_generation", "file_stamp", "dry_run", "input_png_size", "verify_families",
           "is_probe_model", "kernel_coverage", "output_paths", "shown", "torch_details", "verify", "verify_torch_runtime"]


def engine_options(settings: Settings, config: Optional[str], overrides: Mapping[str, Any]) -> EngineOptions:
    """The engine's options: ``config`` (a config.yaml that must exist) or the settings' own
    config file (the defaults when it is absent), with ``overrides`` (None: not given) on top."""
    base = load_config(config) if config is not None else load_config(settings.config_file, missing_ok=True)
    return with_caches(apply_overrides(base, overrides), settings)


def with_caches(options: EngineOptions, settings: Settings) -> EngineOptions:
    """``options`` with the settings' converted-weights cache folder (engine.memory.converted)."""
    return dataclasses.replace(options, converted_dir=str(settings.cache / CONVERTED_CACHE))


def engine_options_over(settings: Settings, values: Mapping[str, Any], where: str) -> EngineOptions:
    """The settings' config file with ``values`` (config.yaml engine keys, e.g. a service job's) on top;
    a bad key or value is a ConfigError naming ``where``."""
    return with_caches(apply_overrides(load_config(settings.config_file, missing_ok=True), values, where), settings)



def verify_families(stack: str, families: Any) -> List[str]:
    """``families`` checked for a verify of ``stack`` (typed errors before any work): each one known,
    on a stack whose verify can prove a family's kernels (stable-diffusion.cpp's synthesized probes)."""
    if not stack_info(stack).model_families:
        raise InvalidRequestError(f"model families are verified on the stable-diffusion.cpp stack only, not {stack}",
                                  hint="leave out the families, or verify the ggml stack")
    from ..engine.probes.families import check_families as check

    return check(families)

def verify(runtime: Runtime, settings: Settings, *, output: Optional[Union[str, Path]] = None,
           progress: ProgressCallback = null_progress, **engine: Any) -> VerifyReport:
    """The engine's check of ``runtime`` (the probe image goes to ``output``, default
    ``verify-<backend>.png`` in the settings' verify folder); ``engine``: options, cpu_runtime,
    tolerance, probe_seed, keep_probe, families (the model families' probes to verify, default SD 1.x's)."""
    from ..engine.verification.probe_verify import default_output
    from ..engine.verification.probe_verify import verify as _verify

    out = Path(output) if output is not None else default_output(runtime.backend, settings.verify_dir)
    return _verify(runtime, out, probe_cache=settings.probe_cache, records=settings.verify_dir, progress=progress,
                   **engine)


def verify_torch_runtime(settings: Settings, *, python: Optional[str], env: Dict[str, str],
                         probe_seed: Optional[int], progress: ProgressCallback = null_progress) -> VerifyReport:
    """The torch check of the interpreter ``python`` (None: this one) with ``env``; with a
    ``probe_seed``, also one diffusers step on the probe model of that seed."""
    from ..engine.probes.model import ensure_probe_model
    from ..engine.verification.torch_verify import verify_torch
    from ..installer.torch_check import require_torch

    require_torch(python, env)  # no torch: said with the install that adds it, before the 1 GB probe is written
    probe = None
    if probe_seed is not None:
        probe = ensure_probe_model(probe_seed, settings.probe_cache, progress=progress).path
    return verify_torch(python=python, env=env, probe=probe, progress=progress)


def early_worker(runtime: Runtime) -> Supervisor:
    """A worker for a :func:`generate` on ``runtime``, started before the request is checked: it
    imports the runtime meanwhile (see :func:`accelstack.engine.supervision.supervisor.early_worker`). Pass it to
    :func:`generate` as ``worker``, or stop it."""
    from ..engine.supervision.supervisor import early_worker as _early_worker

    return _early_worker(runtime)


def check_generation(request: GenerateRequest, model: Optional[Union[str, Path]], output: Union[str, Path],
                     options: Optional[EngineOptions] = None, *, runtime: Optional[Runtime] = None,
                     read_files: bool = True) -> CheckedGeneration:
    """The one check of a generate request, for ``runtime``'s stack (None: stable-diffusion.cpp's):
    see :func:`accelstack.engine.request.check.check_generation`."""
    return _check_generation(request, model, output, options, traits=runtime.traits if runtime is not None else GGML,
                  read_files=read_files)


def generate_checked(runtime: Runtime, checked: CheckedGeneration, *, progress: ProgressCallback = null_progress,
                     worker: Optional[Supervisor] = None, system: Optional[System] = None) -> GenerateReport:
    """Generate what :func:`check_generation` checked, on ``runtime``, without checking it again;
    ``worker``: one :func:`early_worker` started (stopped at the end); ``system``: the machine whose
    memory the planner fits the generation to (default: this one)."""
    from ..engine.generation import generate_checked as _generate

    machine = machine_memory(runtime.backend, system) if runtime.traits.memory_estimate else None
    return _generate(runtime, checked, progress=progress, worker=worker, machine=machine)


def generate(runtime: Runtime, model: Optional[Union[str, Path]], request: GenerateRequest, output: Union[str, Path], *,
             options: Optional[EngineOptions] = None, progress: ProgressCallback = null_progress,
             worker: Optional[Supervisor] = None, system: Optional[System] = None) -> GenerateReport:
    """Generate ``request`` with ``model`` (None: the request's ``diffusion_model``) on ``runtime``;
    the PNG(s) go to ``output``: :func:`check_generation`, then :func:`generate_checked`."""
    try:
        checked = check_generation(request, model, output, options, runtime=runtime)
    except BaseException:
        if worker is not None:
            worker.let_go()
        raise
    return generate_checked(runtime, checked, progress=progress, worker=worker, system=system)


@dataclasses.dataclass
class Generated:
    """What :func:`run_generation` made: the report, and whether the model is the synthesized probe."""

    report: GenerateReport
    probe_model: bool  # the images are noise by design


def run_generation(request: GenerateRequest, model: Optional[str], output: str, options: EngineOptions, *,
                   runtime: Optional[Runtime], later: Union[Runtime, BaseException, None] = None,
                   progress: ProgressCallback = null_progress) -> Generated:
    """The command line's generate in one call, so the request goes down once (CLI -> core -> engine) and
    only the result comes back: the one check (values first, before any process starts), the worker started
    while the files' headers are read (its start overlaps the checks), then the images.

    ``runtime``: the one at hand now. None: none could be had, and ``later`` stands in for it once the files
    are checked: why none was found (raised then, so a bad model is said first), or a runtime that did not
    check out (its error comes from the engine; the request is checked again for its stack when that differs).
    An interrupt stops the worker and says which images of the batch were written."""
    checked = check_generation(request, model, output, options, runtime=runtime, read_files=False)
    worker = early_worker(runtime) if runtime is not None else None
    before = {str(p): file_stamp(p) for p in checked.outputs}
    try:
        checked.read_files()
        if runtime is None:
            if later is None or isinstance(later, BaseException):
                raise later or RuntimeNotFoundError("no runtime to generate on", hint="pass --runtime DIR")
            runtime = later
            if runtime.traits != checked.traits:  # checked for the stack that was at hand, if any
                checked = check_generation(request, model, output, options, runtime=runtime)
        report = generate_checked(runtime, checked, progress=progress, worker=worker)
    except BaseException as exc:
        if worker is not None:
            worker.stop()  # (generate stops it itself; a worker stopped twice is no harm)
        if isinstance(exc, KeyboardInterrupt):  # Ctrl-C or SIGTERM: say what is left, as json.md promises
            written = [p for p, was in before.items() if file_stamp(p) not in (None, was)]
            state = (f"{plural(len(written), 'image')} of {len(before)} written ({', '.join(written)}); the worker "
                     "was stopped" if written else "no image was written, nothing else changed; the worker was stopped")
            raise Interrupted.by(exc, state, action=Action.RETRY) from None
        raise
    return Generated(report, bool(model) and is_probe_model(model or ""))


def file_stamp(path: Union[str, Path]) -> Optional[Tuple[int, int, int]]:
    """What tells a file written by this run from the one that was there: its inode, size and time (None: absent)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def is_probe_model(model: Union[str, Path]) -> bool:
    """Whether ``model`` is accelstack's synthesized probe (random weights: its images are noise)."""
    from ..engine.probes.layout import probe_weights

    try:
        return probe_weights(str(model)) is not None
    except (OSError, ValueError):
        return False
