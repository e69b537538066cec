"""``verify``: prove that a runtime really generates on this machine, with no model download.

It synthesizes (or reuses) the probe model, starts a supervised worker on the runtime,
generates a 64x64 image in one step with a fixed seed, twice (once when an earlier passing verify
of this runtime recorded its image: :mod:`accelstack.engine.probes.record`), and checks:

* ``load``          the runtime loads the probe model (load time measured);
* ``device``        on a GPU runtime: the model was loaded onto a GPU device, as the runtime
                    itself says (a GPU build whose device is not found runs on its CPU backend:
                    that is a FAIL, not a slow PASS);
* ``family``        with a family's probe (``families=``, :mod:`.probe_families`): the runtime built
                    the architecture the probe is (stable-diffusion.cpp's own "Version:" log line);
* ``size``          the image has the requested size;
* ``pixels``        the pixels are not constant and not mostly saturated (stable-diffusion.cpp
                    casts NaN/inf to black or white, so a non-finite result shows up here);
* ``deterministic`` the second run with the same seed gives the same bytes (or the first gives the
                    bytes an earlier verify of this runtime recorded: the same check across
                    processes; when they differ, the second run decides and the record is replaced);
* ``cpu-match``     on a GPU runtime, when a CPU runtime is given: the same step on the CPU
                    build agrees within tolerances (mean and largest absolute difference, 0-255
                    scale; see DEFAULT_TOLERANCE for how they were set).

A failing runtime gives a FAIL report with the reason; it does not raise. Only problems that
make a verdict impossible (no runtime directory, no disk space for the probe) raise. The
report type, :class:`VerifyReport`, lives in :mod:`accelstack.verdict` (below the installer, which
stores it in receipts).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ...events import ProgressCallback, ProgressEvent, null_progress
from ...verdict import PixelStats, VerifyCheck, VerifyReport
from ..config import EngineOptions
from ..errors import EngineError
from ..generation import check_outputs
from ..models.family_reports import check_family_outputs, family_output, merge_reports
from ..png import parameters_text, write_png
from ..probes.families import DEFAULT_FAMILY, check_families, family_spec
from ..probes.family_files import ensure_family_probe
from ..probes.model import DEFAULT_SEED
from ..probes.record import ImageRecord, image_digest, recall, record_key, remember
from ..runtime import Runtime
from ..supervision.supervisor import Supervisor, SupervisorPolicy
from ..worker.protocol import DeviceInfo, GenerateRequest, GenerateResult

__all__ = ["verify", "family_output", "pixel_stats", "image_diff", "probe_request", "default_output", "DEFAULT_TOLERANCE",
           "DEFAULT_MAX_TOLERANCE", "IDENTICAL", "PROBE_SEED"]

log = logging.getLogger(__name__)

PROBE_PROMPT = "accelstack probe"
PROBE_SIZE = 64
PROBE_STEPS = 1
PROBE_SEED = 42
IDENTICAL = "identical bytes"  # the deterministic check's detail when the repeat here matched (nothing more to say)
MAX_SATURATED = 0.5  # fraction of pixels that are pure black or white
# GPU-vs-CPU agreement of the probe image (64x64, one step, seed 42), per channel on 0..255. Measured
# on lavapipe (ggml-vulkan on Mesa 22.3.6's llvmpipe, 0.4.7) against the cpu build: mean 3.38, largest
# 24 here (the earlier run: mean 1.85, largest 17). The difference comes from fp16 storage and
# a different summation order (flash attention, matmul tiling), spread over a few pixels. Both bounds
# leave about 2.5x that: other drivers round differently, yet a broken kernel (NaN turned black or
# white, a wrong convolution, garbage) moves the mean by tens and single values by 100 or more.
DEFAULT_TOLERANCE = 8.0  # mean |GPU - CPU|
DEFAULT_MAX_TOLERANCE = 64  # largest |GPU - CPU| of any channel of any pixel


def pixel_stats(rgb: bytes) -> PixelStats:
    n = len(rgb) // 3
    saturated = 0
    for i in range(0, n * 3, 3):
        px = rgb[i:i + 3]
        if px == b"\x00\x00\x00" or px == b"\xff\xff\xff":
            saturated += 1
    return PixelStats(distinct=len(set(rgb)), mean=round(sum(rgb) / max(1, len(rgb)), 3),
                      saturated=round(saturated / max(1, n), 4))


def image_diff(a: bytes, b: bytes) -> Tuple[float, int]:
    """(mean absolute difference, largest absolute difference) of two equal-size byte images."""
    if len(a) != len(b):
        raise ValueError("images differ in size")
    if not a:
        return 0.0, 0
    diffs = [abs(x - y) for x, y in zip(a, b)]
    return sum(diffs) / len(diffs), max(diffs)


def probe_request(seed: int = PROBE_SEED, family: str = DEFAULT_FAMILY) -> GenerateRequest:
    """The probe generation: 64x64, one step; a family's own CFG (1 for the guidance-distilled Flux:
    no unconditional pass, as its users run it)."""
    return GenerateRequest(prompt=PROBE_PROMPT, width=PROBE_SIZE, height=PROBE_SIZE, steps=PROBE_STEPS,
                           cfg_scale=family_spec(family).cfg_scale, sampler="euler", scheduler="discrete", seed=seed)


def default_output(backend: str, folder: Path) -> Path:
    """``verify-<backend>.png`` in ``folder`` (the caller's ``Settings.verify_dir``)."""
    return Path(folder) / f"verify-{backend}.png"


def verify(runtime: Runtime, output: Union[str, Path], *, probe_cache: Path, records: Optional[Path],
           options: Optional[EngineOptions] = None, policy: Optional[SupervisorPolicy] = None,
           cpu_runtime: Optional[Runtime] = None, tolerance: float = DEFAULT_TOLERANCE, probe_seed: int = DEFAULT_SEED,
           seed: int = PROBE_SEED, progress: ProgressCallback = null_progress,
           max_tolerance: int = DEFAULT_MAX_TOLERANCE, keep_probe: bool = True,
           families: Optional[Sequence[str]] = None) -> VerifyReport:
    """Verify ``runtime`` by generating with it; see the module docstring for the checks. (A
    torch runtime runs the torch generation worker; :func:`verify_torch` is its lighter check.)

    ``families`` (None: the SD 1.x probe alone, install's check) verifies each family's probe in
    turn (:mod:`.probe_families`): one report, PASS when every family passes, whose checks are named
    ``<family>:<check>`` and whose ``details["families"]`` holds each family's own report; a family's
    image goes to :func:`family_output`. An unknown family is an :class:`InvalidRequestError` before
    any work.
    """
    options = _concrete(options)
    kwargs: Dict[str, Any] = dict(probe_cache=probe_cache, records=records, options=options, policy=policy,
                                  cpu_runtime=cpu_runtime, tolerance=tolerance, probe_seed=probe_seed, seed=seed,
                                  progress=progress, max_tolerance=max_tolerance, keep_probe=keep_probe)
    if families is None:
        return _verify_family(runtime, output, DEFAULT_FAMILY, **kwargs)
    names = check_families(families)
    check_outputs([family_output(output, f) for f in names])
    check_family_outputs(output, names)
    start = time.perf_counter()
    reports = [(f, _verify_family(runtime, family_output(output, f), f, **kwargs)) for f in names]
    return merge_reports(reports, time.perf_counter() - start)


def _concrete(options: Optional[EngineOptions]) -> EngineOptions:
    """The options with every ``auto`` resolved as before the memory planner: the probe is 64x64,
    nothing to plan (config.EngineOptions.concrete; an explicit value is kept)."""
    base = options if options is not None else EngineOptions()
    concrete = getattr(base, "concrete", None)
    return concrete() if callable(concrete) else base


def _verify_family(runtime: Runtime, output: Union[str, Path], family: str, *, probe_cache: Path,
                   records: Optional[Path], options: Optional[EngineOptions], policy: Optional[SupervisorPolicy],
                   cpu_runtime: Optional[Runtime], tolerance: float, probe_seed: int, seed: int,
                   progress: ProgressCallback, max_tolerance: int, keep_probe: bool) -> VerifyReport:
    """Verify ``runtime`` with ``family``'s probe (see :func:`verify`).

    The caller names every path (the core passes its Settings'): ``output`` (the probe image, e.g.
    :func:`default_output`), ``probe_cache`` (where the probe model is made) and ``records`` (where
    probe image records are kept and read, :mod:`.probe_record`; None: none, so the image is
    generated twice). A runtime that fails gives ``ok=False`` and the reason.
    A temporary probe stays for this process's next verify unless ``keep_probe`` is False (a
    command that verifies once: it is removed while the worker exits, not after).
    """
    start = time.perf_counter()
    check_outputs([Path(output)])  # an image that could not be written is refused before any work
    runtime.check()
    if cpu_runtime is not None:
        cpu_runtime.check()
    # One task for the whole check, advancing as each check is made; under it, the probe's
    # preparation (stage probe), the worker's start, the model's loading and each generation's
    # steps (stage generate, as in any generation: apps group them by stage).
    spec = family_spec(family)
    sd1 = family == DEFAULT_FAMILY
    if spec.options and options is not None:  # what this family's probe must run with (its reason in details)
        options = dataclasses.replace(options, **dict(spec.options))
    task = f"{runtime.backend} runtime" + ("" if sd1 else f" ({family})")
    expected = len(_CHECKS) + (1 if _gpu_engine(runtime) else 0) + (1 if runtime.is_gpu and cpu_runtime is not None else 0) \
        + (0 if sd1 else 1)
    progress(ProgressEvent("start", "verify", task=task, total=expected, extra={"unit": "check", "eta": False},
                           message="preparing the probe model"))

    def supervisor(model: str) -> Supervisor:
        return Supervisor(runtime, model=model, options=options, policy=policy, progress=progress,
                          model_label="the probe model" if sd1 else f"the {family} probe model")

    early: List[Supervisor] = []  # the worker, started while the probe is written: it imports the runtime meanwhile

    def start_early(model: str) -> None:
        early.append(supervisor(model))
        early[0].prestart()

    try:
        probe = ensure_family_probe(family, probe_seed, cache_root=probe_cache, progress=progress, on_synthesis=start_early)
    except BaseException as exc:
        for sup in early:
            sup.stop()
        progress(ProgressEvent("end", "verify", task=task, ok=False, total=expected, extra={"unit": "check"},
                               message=str(getattr(exc, "message", "") or exc or type(exc).__name__)))
        raise
    report = VerifyReport(ok=False, reason="", runtime=str(runtime.path), backend=runtime.backend, probe_seconds=probe.seconds, probe_path=probe.path,
                          probe_temporary=probe.temporary)
    request = probe_request(seed, family)
    out = Path(output)
    if not sd1:
        report.details["family"] = {"id": family, "name": spec.name, "sdcpp_version": spec.sdcpp_version,
                                    "parameters": probe.parameters, "reduced": spec.note}
        if spec.options:
            report.details["family"]["options"] = {"set": dict(spec.options), "why": spec.options_reason}

    def check(name: str, ok: bool, detail: str) -> None:
        report.checks.append(VerifyCheck(name, ok, detail))
        progress(ProgressEvent("advance", "verify", task=task, done=len(report.checks), total=max(expected, len(report.checks)),
                               message=f"{name} {'ok' if ok else 'FAILED'}", extra={"unit": "check", "check": name, "ok": ok}))

    def fail(reason: str) -> VerifyReport:
        log.info("verify of %s: FAIL: %s", runtime.path, reason)
        report.ok, report.reason = False, reason
        report.total_seconds = round(time.perf_counter() - start, 4)
        progress(ProgressEvent("end", "verify", task=task, ok=False, done=len(report.checks),
                               total=max(expected, len(report.checks)), message=reason, extra={"unit": "check"}))
        return report

    sup = early[0] if early else supervisor(probe.model)
    try:
        try:
            st = sup.start()
        except EngineError as exc:
            check("load", False, exc.message)
            report.log_tail = sup.log_tail()
            return fail(f"the runtime could not load the probe model: {exc.message}")
        report.device, report.load_seconds = st.device, st.load_seconds
        check("load", True, f"{st.load_seconds:.2f} s on {_device_name(st.device)}")
        fell_back = _fell_back_to_cpu(runtime, st.device, sup.launch_env)
        if fell_back:
            # what the GPU backend itself printed about its devices ("ggml_vulkan: No devices found.")
            said = [line.strip() for line in sup.log_tail(400) if line.lstrip().startswith(_BACKEND_LOG_PREFIXES)]
            check("device", False, "; ".join([fell_back] + said[-3:]))
            report.log_tail = sup.log_tail() + said[-3:]  # its own words last: what a FAIL shows first
            return fail(fell_back)
        if _gpu_engine(runtime):
            check("device", True, _device_name(st.device))
        if not sd1:  # the runtime took the probe for the family it is (its own "Version:" log line)
            version = _logged_version(sup.log_tail(400))
            check("family", version == spec.sdcpp_version,
                  f"stable-diffusion.cpp loaded it as {version or 'an unnamed version'} (expected {spec.sdcpp_version})")
        # The deterministic check compares with this runtime's image from an earlier passing verify
        # when one is recorded (probe_record), else with a second generation here.
        key = record_key(backend=runtime.backend, runtime_version=st.runtime_version, system_info=st.system_info,
                         device=st.device, options=sup.options, env=runtime.env, request=request,
                         probe={"format": probe.format_version, "seed": probe.seed, "dtype": probe.dtype,
                                "parameters": probe.parameters, **({} if sd1 else {"family": family})})
        earlier = recall(Path(records), key) if records is not None else None
        second: Optional[GenerateResult] = None
        try:
            first = sup.generate(request, label="probe generation" if earlier else "probe generation 1 of 2")
            if earlier is None or image_digest(first.images[0].pixels) != earlier.digest:
                second = sup.generate(request, label="probe generation again (same seed)" if earlier
                                      else "probe generation 2 of 2 (same seed)")
        except EngineError as exc:
            report.log_tail = sup.log_tail()
            check("generate", False, exc.message)
            return fail(f"generation failed: {exc.message}")
        # The worker exits (freeing the model's memory takes it a quarter of a second here) while
        # the checks run, the image is written and, when not kept, the probe is removed.
        compare = runtime.is_gpu and cpu_runtime is not None
        sup.stop(wait=False)
        if not keep_probe and not compare:
            probe.release()
        _timings(report, first)
        img = first.images[0]
        pixels = img.pixels
        report.pixels = stats = pixel_stats(pixels)
        size_ok = (img.width, img.height) == (request.width, request.height) and len(pixels) == img.width * img.height * 3
        check("size", size_ok, f"{img.width}x{img.height}")
        pixels_ok = stats.distinct > 1 and stats.saturated <= MAX_SATURATED
        check("pixels", pixels_ok, f"{stats.distinct} distinct values, mean {stats.mean:.1f}, {stats.saturated:.0%} saturated")
        _deterministic(report, check, pixels, second, earlier)
        if size_ok:
            meta = parameters_text(request.prompt, "", {"Steps": request.steps, "Sampler": first.sampler,
                                                        "Schedule type": first.scheduler, "CFG scale": request.cfg_scale,
                                                        "Seed": img.seed, "Size": f"{img.width}x{img.height}",
                                                        "Model": f"accelstack {'' if sd1 else family + ' '}probe (seed {probe_seed})"})
            report.image = str(write_png(out, img.width, img.height, pixels, {"parameters": meta}))
        if compare and size_ok and cpu_runtime is not None:
            sup.stop()  # one model in memory at a time
            _compare_cpu(report, cpu_runtime, probe.model, request, pixels, options, policy, tolerance, max_tolerance,
                         progress, check)
    finally:
        sup.let_go()  # a worker that is exiting is not waited for
        if not keep_probe:
            probe.release()
    failed = [c for c in report.checks if not c.ok]
    if failed:
        return fail("; ".join(f"{c.name}: {c.detail}" for c in failed))
    report.ok = True
    if second is not None and records is not None:  # the repeat here passed: later verifies compare with this image
        remember(Path(records), key, image_digest(second.images[0].pixels))
    log.info("verify of %s: PASS", runtime.path)
    report.total_seconds = round(time.perf_counter() - start, 4)
    progress(ProgressEvent("end", "verify", task=task, ok=True, done=len(report.checks), total=len(report.checks),
                           message=f"PASS in {report.total_seconds:.1f} s", extra={"unit": "check"}))
    return report


_CHECKS = ("load", "size", "pixels", "deterministic")  # every runtime's; a GPU one adds device and cpu-match
_VERSION_MARK = "Version: "  # stable-diffusion.cpp's log line naming the version it detected (src/stable-diffusion.cpp)


def _logged_version(lines: Sequence[str]) -> str:
    """The model version stable-diffusion.cpp logged while loading ("" when the line is not there)."""
    for line in reversed(lines):
        if _VERSION_MARK in line:
            return line.split(_VERSION_MARK, 1)[1].strip()
    return ""


def _gpu_engine(runtime: Runtime) -> bool:
    """A GPU runtime of a stack whose worker reports its device: the one whose device is checked."""
    return runtime.is_gpu and runtime.traits.device_check


_GPU_TEXT = {"cuda": "CUDA", "vulkan": "Vulkan", "rocm": "ROCm", "metal": "Metal", "sycl": "SYCL"}
_BACKEND_LOG_PREFIXES = ("ggml_vulkan:", "ggml_cuda_init:", "ggml_metal_init:", "ggml_sycl_init:")
# backend -> (the variable that selects its devices, what a fall-back says when it is not set)
_DEVICE_SELECTORS = {"vulkan": ("GGML_VK_VISIBLE_DEVICES", "ggml-vulkan skips CPU-type devices such as lavapipe "
                                "unless GGML_VK_VISIBLE_DEVICES names them")}


def _fell_back_to_cpu(runtime: Runtime, device: Optional[DeviceInfo], worker_env: Mapping[str, str]) -> str:
    """Why a GPU runtime ran on the CPU instead ("" when it did not): the worker reports the ggml
    device stable-diffusion.cpp initialized for the model; ``worker_env`` is the environment it
    was started with (what selects its devices)."""
    if not _gpu_engine(runtime) or device is None:
        return ""
    if device.kind != "cpu" and device.name.upper() != "CPU":
        return ""
    text = _GPU_TEXT.get(runtime.backend, runtime.backend)
    reason = f"the {runtime.backend} runtime ran on the CPU: no {text} device was initialized"
    selector = _DEVICE_SELECTORS.get(runtime.backend)
    if selector is not None:
        var, unset = selector
        named = worker_env.get(var)
        reason += f" ({unset})" if named is None else f" ({var}={named})"
    return reason


def _device_name(device: Optional[DeviceInfo]) -> str:
    if device is None:
        return "unknown device"
    return f"{device.name} ({device.description})" if device.description and device.description != device.name else device.name


def _deterministic(report: VerifyReport, check: Callable[[str, bool, str], None], pixels: bytes,
                   second: Optional[GenerateResult], earlier: Optional[ImageRecord]) -> None:
    """The same seed gave the same bytes: twice here, or here and in an earlier passing verify."""
    if second is None and earlier is not None:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(earlier.when))
        report.details["deterministic"] = {"compared_with": "earlier verify", "sha256": earlier.digest, "when": earlier.when}
        check("deterministic", True, f"identical bytes to this runtime's probe image of {when} (an earlier verify)")
        return
    assert second is not None
    again = second.images[0].pixels
    same = again == pixels
    report.details["deterministic"] = {"compared_with": "second generation"}
    detail = IDENTICAL if same else (
        "max difference %d" % image_diff(pixels, again)[1] if len(again) == len(pixels) else "different sizes")
    if same and earlier is not None:
        detail += " (not those of this runtime's earlier verify: the runtime or its driver changed)"
    check("deterministic", same, detail)


def _timings(report: VerifyReport, result: GenerateResult) -> None:
    report.generate_seconds = result.seconds
    report.step_seconds = round(result.step_seconds, 4)
    report.its_per_second = round(result.its_per_second, 4)


def _compare_cpu(report: VerifyReport, cpu_runtime: Runtime, probe: str, request: GenerateRequest, pixels: bytes,
                 options: Optional[EngineOptions], policy: Optional[SupervisorPolicy], tolerance: float,
                 max_tolerance: int, progress: ProgressCallback, check: Callable[[str, bool, str], None]) -> None:
    try:
        with Supervisor(cpu_runtime, model=probe, options=options, policy=policy, progress=progress,
                        model_label="the probe model on the CPU runtime") as cpu:
            ref = cpu.generate(request, label="CPU reference generation").images[0].pixels
    except EngineError as exc:
        check("cpu-match", False, f"the CPU build could not run the probe: {exc.message}")
        return
    mean, worst = image_diff(pixels, ref)
    report.cpu_mean_diff, report.cpu_max_diff = round(mean, 3), worst
    check("cpu-match", mean <= tolerance and worst <= max_tolerance,
          f"mean difference {mean:.2f} (tolerance {tolerance}), largest {worst} (tolerance {max_tolerance})")

