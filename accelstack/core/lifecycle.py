"""Install, upgrade, repair, rollback, uninstall, gc and status: the same functions for both stacks.

Each one resolves ``Settings`` once, takes the home's lock (a dry run takes nothing and touches
nothing), runs ``recover`` first so a killed run never leaves a mess, and reports progress only
through the ``on_progress`` callback.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from ..hardware.report import HardwareReport
from ..domain import BACKENDS
from ..errors import AccelstackError, Action, NotPossibleHere, UsageError
from ..events import ProgressCallback, ProgressEvent, null_progress
from ..installer import maintenance
from ..installer.home import Home
from ..installer.records import Active, Receipt, StateError
from ..installer.recovery import active_or_rebuild, recover
from ..installer.repair import RepairReport, repair_ggml, unrepairable_error
from ..installer.transaction import Provenance, Verifier
from ..installer.transaction import install as run_transaction
from ..manifests.plan import Plan
from ..manifests.resolve import Manifests
from ..settings import Settings
from .detection import detect
from .fallback import install_plan_with_fallback
from .planning import (
    LOCAL_SOURCE,
    LoadedManifest,
    TrustedSet,
    adhoc_channel_name,
    hardware_fingerprint,
    load_manifests,
    plan,
    remember_channels,
    target_interpreter,
)
from .verifiers import default_verifier

log = logging.getLogger(__name__)


@dataclass
class InstallSummary:
    """What ``install_runtime`` did; ``receipt`` is None only for a dry run."""

    stack: str
    runtime: str
    changed: bool
    plan: Plan
    receipt: Optional[Receipt] = None
    previous: str = ""
    timings: dict = field(default_factory=dict)  # seconds, each named for what it measured
    recovered: List[str] = field(default_factory=list)
    built_locally: bool = False
    dry_run: bool = False
    would_build: str = ""  # dry run: the variant that would be compiled first
    notes: List[str] = field(default_factory=list)  # said once to the user ("no channel is configured ...")
    would: List[str] = field(default_factory=list)  # dry run: each step it would take, in order, in words
    reinstalled: bool = False  # --force over the active runtime: the same id again, so there is no "previous"


def home_of(settings: Settings) -> Home:
    return Home(settings.home)


def _prepare(settings: Settings, command: str, progress: ProgressCallback = null_progress):
    home = home_of(settings)
    home.ensure()
    return home, home.lock(command, wait=settings.timeouts.lock_wait, progress=progress)


def install(plan: Plan, *, report: Optional[HardwareReport] = None, settings: Optional[Settings] = None,
            verifier: Optional[Verifier] = None, force: bool = False,
            on_progress: Optional[ProgressCallback] = None) -> Receipt:
    """Install what ``plan`` chose, verify it, and make it active; returns its receipt.

    ``verifier`` defaults to the engine's real generation check (ggml) or the torch check in the
    target environment (torch); pass a cheaper one explicitly if you must."""
    summary = install_runtime(plan, report=report, settings=settings, verifier=verifier, force=force, on_progress=on_progress)
    assert summary.receipt is not None
    return summary.receipt


def install_runtime(plan: Plan, *, report: Optional[HardwareReport] = None, settings: Optional[Settings] = None,
                    verifier: Optional[Verifier] = None, force: bool = False, dry_run: bool = False,
                    trusted: Optional[TrustedSet] = None, on_progress: Optional[ProgressCallback] = None) -> InstallSummary:
    """:func:`install` with the whole story: no-op or not, previous runtime, timings, recovery.

    ``trusted``: the manifests the plan was made from, already verified with the watermark recorded
    (see :func:`plan_and_install`); without it they are loaded and verified again."""
    s = settings or Settings.resolve()
    progress = on_progress or null_progress
    report = report if report is not None else detect(settings=s)
    if plan.stack == "torch":
        return _install_torch(plan, report, s, verifier, dry_run, progress)
    if plan.stack != "ggml":
        raise UsageError(f"unknown stack {plan.stack!r}")
    return _install_ggml(plan, report, s, verifier, force, dry_run, trusted, progress)


def plan_and_install(report: Optional[HardwareReport] = None, stack: str = "ggml", *, requirements: Sequence[str] = (),
                     backend: Optional[str] = None, settings: Optional[Settings] = None, verifier: Optional[Verifier] = None,
                     force: bool = False, dry_run: bool = False, trusted: Optional[TrustedSet] = None,
                     prefer_remembered: bool = False, on_progress: Optional[ProgressCallback] = None) -> InstallSummary:
    """:func:`plan` then :func:`install_runtime`, fetching and verifying the manifests once (the
    CLI's ``install`` and ``upgrade``). A dry run checks them without raising any watermark.

    ``trusted``: manifests already verified by the caller (an offline bundle); otherwise those of
    the active channels (``prefer_remembered``: the ones the last install used, for ``upgrade``)."""
    s = settings or Settings.resolve()
    progress = on_progress or null_progress
    report = report if report is not None else detect(settings=s)
    refuse_impossible_backend(report, stack, s.backend if backend is None else backend, s)  # before any download or build
    if not dry_run:
        home_of(s).ensure()  # an unusable home is said plainly before any manifest version is recorded in it
    if trusted is None and stack == "ggml":
        trusted = load_manifests(s, record=not dry_run, progress=progress, prefer_remembered=prefer_remembered)
    notes = []
    if stack == "ggml" and trusted is not None and not trusted.channels:
        notes.append(NO_CHANNEL_LINE)
        progress(ProgressEvent("message", "plan", message=NO_CHANNEL_LINE))
    p = plan(report, stack, requirements=requirements, backend=backend, settings=s,
             manifests=trusted.manifests if trusted is not None else None, on_progress=progress)
    if p.status == "unsatisfiable":
        refuse_unknown_backend(stack, p.request.backend, trusted)
        raise not_possible(p)
    if dry_run:
        summary = install_runtime(p, report=report, settings=s, verifier=verifier, force=force, dry_run=dry_run, trusted=trusted,
                                  on_progress=progress)
    else:  # a build that fails verify here gives way to the plan's next candidate (issue 12)
        summary = install_plan_with_fallback(p, install_runtime, report=report, settings=s, verifier=verifier, force=force,
                                             trusted=trusted, requirements=requirements, on_progress=progress)
    summary.notes = notes + summary.notes
    return summary


def _install_ggml(plan: Plan, report: HardwareReport, s: Settings, verifier: Optional[Verifier], force: bool,
                  dry_run: bool, trusted: Optional[TrustedSet], progress: ProgressCallback) -> InstallSummary:
    from ..installer.ggml import FetchedWheel, GgmlDirectory, runtime_id, wheel_of

    if dry_run:
        return _dry_run_ggml(plan, report, s, force, trusted)
    home, lock = _prepare(s, "install", progress)
    with lock:
        recovered = recover(home)
        timings: dict = {}
        if trusted is None:  # read here only when the caller did not (plan_and_install reads them before planning)
            t = time.perf_counter()
            trusted = load_manifests(s, record=True, progress=progress)
            timings["manifests"] = time.perf_counter() - t
        manifests, loaded = trusted.manifests, trusted.loaded
        built = False
        if not plan.ok:
            _require_buildable(plan, s, report, trusted)
            t = time.perf_counter()
            manifests = _build_locally(report, plan, manifests, s, progress, bool(trusted.channels))
            timings["build"] = time.perf_counter() - t  # the local compile (or a build-cache hit)
            plan = _replan(report, plan, manifests, s)
            built = True
        source, version = _provenance(plan, manifests)
        rid = runtime_id(plan)
        existing = None if force else home.intact_receipt("ggml", rid)
        if existing is not None:
            return _already_installed(home, plan, existing, recovered, built)
        reinstall = _active_id(home, "ggml") == rid  # --force over the active runtime
        ref = wheel_of(plan)
        t = time.perf_counter()
        progress(ProgressEvent("message", "install", message=f"fetching {ref.name}"))
        from ..artifacts import Cache, fetch

        paths = fetch([ref], cache=Cache(s.cache), progress=progress, offline=s.offline)
        timings["download"] = time.perf_counter() - t
        dest = GgmlDirectory(home, rid, cuda_libs=plan.cuda_libs,  # a CUDA build's shared cudart/cuBLAS
                             fetch=lambda refs: fetch(refs, cache=Cache(s.cache), progress=progress, offline=s.offline))
        outcome = run_transaction(plan, FetchedWheel(paths[ref.sha256], ref.name), dest,
                                  verifier or default_verifier(s), home=home, runtime_id=rid,
                                  provenance=_ggml_provenance(source, version, loaded, ref.name, report), progress=progress)
        timings.update(outcome.timings)
        if loaded and trusted.remember:
            remember_channels(s, trusted.channels)
        maintenance.register_home(Cache(s.cache), home, maintenance.referenced_blobs(home))
        return InstallSummary("ggml", rid, True, plan, outcome.receipt, "" if reinstall else outcome.previous, timings,
                              recovered, built, reinstalled=reinstall)


def _active_id(home: Home, stack: str) -> str:
    try:
        return home.read_active().active.get(stack, "")
    except StateError:
        return ""


def wheel_version(name: str) -> Tuple[str, str]:
    """(distribution, version) from a wheel's file name (``stable_diffusion_cpp_python-0.4.7-cp311-...whl``)."""
    parts = name[:-len(".whl")].split("-") if name.endswith(".whl") else []
    return (parts[0].replace("_", "-"), parts[1]) if len(parts) >= 5 else ("", "")


def _ggml_provenance(source: str, version: int, loaded: Sequence[LoadedManifest], wheel_name: str,
                     report: HardwareReport) -> Provenance:
    """Where the runtime came from, for the receipt and ``status``: the channel that published the
    manifest (none for a local build), the manifest, and the package version inside the wheel."""
    read = next((m for m in loaded if m.source == source and m.version == version), None)
    channel = read.channel if read is not None and read.channel != adhoc_channel_name(read.url) else ""  # not for --manifest
    package, package_version = wheel_version(wheel_name)
    return Provenance(source, version, hardware_fingerprint(report), channel=channel, package=package,
                      package_version=package_version, manifest_url=read.url if read is not None else "")


# -- what a dry run says ---------------------------------------------------------------------
# A local CUDA build, timed (docs/builds.md, scripts/build-cuda.sh): the cuda variant for sm_90 alone
# compiled in 5656 s on 2 loaded cores, about 20 min of it the C++ files and the rest ggml-cuda's
# files, which every further architecture compiles again.
CUDA_HOST_MINUTES = 20
CUDA_ARCH_MINUTES = 75


def cuda_build_time(archs: int) -> str:
    """How long a local CUDA build of ``archs`` architectures takes, from the measured figures above."""
    hours = (CUDA_HOST_MINUTES + CUDA_ARCH_MINUTES * max(1, archs)) / 60
    low = max(1, int(hours))
    return f"about {low}-{low + 1} h on 2 cores, less with more cores"


BUILD_NEEDS = {  # how long, and what it needs (a CUDA build's time is for one architecture: see build_sentence)
    "cpu": ("~4 min", ["cmake", "a C++ compiler"]),
    "cpu-noavx2": ("~4 min", ["cmake", "a C++ compiler"]),
    "vulkan": ("~8 min", ["cmake", "a C++ compiler", "the Vulkan headers and glslc"]),
    "cuda": (cuda_build_time(1),
             ["cmake", "a C++ compiler", "NVIDIA's CUDA 13 compiler, about 500 MB downloaded once from PyPI "
                                         "into the build cache"]),
    "cuda12": (cuda_build_time(1),
               ["cmake", "a C++ compiler", "a system CUDA 12 toolkit with nvcc 12.x"]),
    "rocm": ("~15 min", ["cmake", "a C++ compiler", "ROCm (hipcc)"]),
    "metal": ("~4 min", ["cmake", "Xcode's command line tools"]),
}


def build_sentence(variant: str, cuda_archs: Optional[Sequence[str]] = None) -> str:
    """"would build cpu from source (~4 min, needs cmake and a C++ compiler)", and what is missing.

    A CUDA build names the architectures it compiles (``cuda_archs``; none: all of the variant's),
    since each one costs more than an hour on a small machine."""
    import shutil

    from ..publisher.variants import CUDA_VARIANTS, cuda_targets, find_cuda_toolkit

    took, needs = BUILD_NEEDS.get(variant, ("several minutes", ["cmake", "a C++ compiler"]))
    target, sep = "", ", "
    if variant in CUDA_VARIANTS:
        archs = cuda_targets(variant, cuda_archs)
        named = ", ".join(f"sm_{a}" for a in archs)
        target = f" for {named}" if cuda_archs else \
            f" for every architecture the {variant} variant supports ({named}), as this GPU's compute capability is unknown"
        took, sep = cuda_build_time(len(archs)), "; "
    text = f"would build {variant} from source{target} ({took}{sep}needs {', '.join(needs[:-1])} and {needs[-1]})"
    missing = [] if shutil.which("cmake") else ["cmake"]
    if not any(shutil.which(c) for c in ("c++", "g++", "clang++", "cl")):
        missing.append("a C++ compiler")
    if variant == "cuda12" and find_cuda_toolkit(12)[0] is None:
        missing.append("a CUDA 12 toolkit")
    if missing:
        text += f"; not found here: {', '.join(missing)}"
    return text


def cached_local_build(variant: str, build_cache: Path, cuda_archs: Optional[Sequence[str]] = None) -> str:
    """The wheel a local build of ``variant`` (for ``cuda_archs``) would reuse from the build cache
    ("" when it would compile), found by reading only: the pinned source's digest, then the cache
    slot it keys, with the options and toolkit key ``build_ggml`` itself would use."""
    import json

    from ..publisher.build import build_options, cache_key, sha256_file
    from ..publisher.errors import BuildError
    from ..publisher.sdist import sdist_name

    sdist = build_cache / "sdist" / sdist_name()
    if variant == "vulkan" or not sdist.is_file():
        return ""  # a Vulkan build's key also names the headers it was given
    try:
        cmake_args, toolkit = build_options(variant, cuda_archs)
    except BuildError:  # an unknown variant, bad architectures, cuda12 without a toolkit: nothing to find
        return ""
    try:
        st = sdist.stat()
        try:  # the digest build_ggml remembered beside it, while size and mtime still match
            digest, stamp = (sdist.with_name(sdist.name + ".sha256").read_text().split(" ", 1) + [""])[:2]
        except OSError:
            digest, stamp = "", ""
        if stamp.strip() != f"{st.st_size} {st.st_mtime_ns}" or len(digest) != 64:
            digest = sha256_file(sdist)
        record = json.loads((build_cache / cache_key(digest, variant, cmake_args, toolkit) / "build.json").read_text())
        wheel = str(record.get("wheel", "")) if isinstance(record, dict) else ""
    except (OSError, ValueError):
        return ""
    return wheel if wheel and Path(wheel).is_file() else ""


def _dry_run_ggml(plan: Plan, report: HardwareReport, s: Settings, force: bool,
                  trusted: Optional[TrustedSet]) -> InstallSummary:
    """What an install would do, from reads alone: no home, lock, cache entry, download or build."""
    from ..artifacts import Cache
    from ..installer.ggml import runtime_id
    from ..publisher.variants import CUDA_VARIANTS

    home = home_of(s)
    activate = "check it with a probe generation, and activate it only if that passes"
    if not plan.ok:
        _require_buildable(plan, s, report, trusted)
        variant = _local_variant(plan, report)
        archs = local_cuda_archs(plan, report) if variant in CUDA_VARIANTS else None
        cached = cached_local_build(variant, s.build_cache, archs)
        first = f"would reuse the {variant} build already in the build cache (no compile): {cached}" if cached \
            else build_sentence(variant, archs)
        would = [first, f"would install the build into {home.runtimes('ggml')}, {activate}"]
        return InstallSummary("ggml", "", False, plan, dry_run=True, would_build=variant, would=would)
    rid = runtime_id(plan)
    active = _active_id(home, "ggml") if home.active_path.is_file() else ""
    intact = home.receipts.is_dir() and home.intact_receipt("ggml", rid) is not None
    if intact and active == rid and not force:
        return InstallSummary("ggml", rid, False, plan, dry_run=True,
                              would=[f"nothing to do: runtime {rid} is already installed and active (--force reinstalls it)"])
    if intact and not force:
        return InstallSummary("ggml", rid, False, plan, dry_run=True, previous=active,
                              would=[f"would activate the installed runtime {rid}" + (f" (now active: {active})" if active else "")])
    cache = Cache(s.cache)
    would = []
    for a in plan.artifacts:
        if cache.valid(a.sha256, a.size, verify=False):
            would.append(f"would use {a.name} ({a.size / 1e6:.0f} MB) from the download cache")
        else:
            part = cache.part_size(a.sha256)
            resume = f", resuming after {part / 1e6:.0f} MB already downloaded" if 0 < part < a.size else ""
            would.append(f"would download {a.name} ({a.size / 1e6:.0f} MB){resume}")
    if plan.cuda_libs:  # NVIDIA's cudart/cuBLAS wheels, shared by the home's CUDA runtimes (installer.cuda_libs)
        from ..installer.cuda_libs import shared_root

        names = ", ".join(a.name.split("-")[0] for a in plan.cuda_libs)
        would.append(f"would provide {names} ({sum(a.size for a in plan.cuda_libs) / 1e6:.0f} MB) once in "
                     f"{shared_root(home)}: reused when the home or a torch environment has them, else downloaded")
    would.append(f"would {'reinstall' if intact else 'install'} runtime {rid} into {home.runtimes('ggml') / rid}, {activate}"
                 + (f"; {active} stays for `rollback`" if active and active != rid else ""))
    return InstallSummary("ggml", rid, False, plan, dry_run=True, previous=active if active != rid else "", would=would)


def not_possible(plan: Plan) -> NotPossibleHere:
    """The error for a plan that nothing here can satisfy (a forced backend with no device for it)."""
    why = [c.reason for c in plan.candidates if not c.accepted and c.code != "forced-backend"][:3]
    runs = sorted({c.backend for c in plan.candidates if c.code == "forced-backend"})
    hint = "; ".join(why) or "no device of this machine runs it"
    if plan.request.backend:
        hint += (f"; this machine runs: {', '.join(runs)}" if runs else "") + \
            "; leave the backend unset (no --backend, no ACCELSTACK_BACKEND) to let the plan choose"
    return NotPossibleHere(f"cannot install here: {plan.summary}", hint, action=Action.EXPLAIN_PLAN)


def refuse_unknown_backend(stack: str, backend: str, trusted: Optional[TrustedSet]) -> None:
    """A forced ggml backend that is neither a backend nor a target id of the manifests read is a
    typo (a usage error, exit 2), not something this machine lacks."""
    forced = (backend or "").strip().lower()
    if stack != "ggml" or not forced or forced in BACKENDS:
        return
    ids = sorted({t.id.lower() for m in (trusted.manifests.ggml if trusted is not None else []) for t in m.targets})
    if forced not in ids:
        raise UsageError(f"unknown backend {backend!r}", f"choose one of {', '.join(BACKENDS)}"
                         + (f", or a target of the manifests: {', '.join(ids[:8])}" if ids else ""))


def refuse_impossible_backend(report: HardwareReport, stack: str, backend: Optional[str], s: Settings) -> None:
    """A forced ggml backend this machine has no device for is refused before any manifest is
    fetched or anything is built: planned against no published builds at all, the plan still says
    whether the hardware could run a build of it (``needs-build``) or not (``unsatisfiable``)."""
    if stack != "ggml" or not backend or backend.strip().lower() not in BACKENDS:
        return  # a manifest's target id names no backend until the manifests are read
    p = plan(report, "ggml", backend=backend, settings=s, manifests=Manifests.builtin())
    if p.status == "unsatisfiable":
        raise not_possible(p)


def _already_installed(home: Home, plan: Plan, receipt: Receipt, recovered: List[str], built: bool) -> InstallSummary:
    rid = receipt.id
    try:
        previous = home.read_active().active.get("ggml", "")
    except StateError:
        previous = ""
    if previous != rid:
        home.set_active("ggml", rid)
        return InstallSummary("ggml", rid, True, plan, receipt, previous, recovered=recovered, built_locally=built)
    return InstallSummary("ggml", rid, False, plan, receipt, recovered=recovered, built_locally=built)


NO_CHANNEL_LINE = "no channel is configured, so there is no published build to download"


class NoChannelError(AccelstackError):
    """No channel is configured and no runtime can be built here: the ways forward, in words."""

    default_action = Action.ADD_MANIFEST


def compiler_instructions(os_name: str) -> str:
    """How to get CMake and a C++ compiler on ``os_name`` ("c++" is not a name anyone can install on Windows)."""
    if os_name == "windows":
        return ("install Visual Studio Build Tools (the 'Desktop development with C++' workload) and CMake, "
                "e.g. winget install Microsoft.VisualStudio.2022.BuildTools Kitware.CMake")
    if os_name == "macos":
        return "run xcode-select --install, then brew install cmake"
    return "install CMake and a C++ compiler: sudo apt install cmake g++ (Debian, Ubuntu) or sudo dnf install cmake gcc-c++ (Fedora, RHEL)"


def no_channel_choices(report: HardwareReport) -> str:
    return ("configure a channel (a manifest URL and its publisher's key), install from an offline bundle made "
            f"on a machine with network access, or build from source: {compiler_instructions(report.os.name)}")


def _require_buildable(plan: Plan, s: Settings, report: HardwareReport, trusted: Optional[TrustedSet]) -> None:
    if plan.status == "needs-build" and not plan.artifacts:
        if s.allow_build:
            return
        if trusted is not None and not trusted.channels:
            raise NoChannelError(f"{NO_CHANNEL_LINE}, and local builds are turned off", no_channel_choices(report))
        raise AccelstackError(f"nothing to install: {plan.summary}", hint="name a manifest with a build for this machine, "
                              "or allow a local build from source", action=Action.ADD_MANIFEST)
    raise AccelstackError(f"nothing to install: {plan.summary}", hint="; ".join(plan.conflicts) or
                          "the plan's candidates say why each build was rejected", action=Action.EXPLAIN_PLAN)


def _local_variant(plan: Plan, report: HardwareReport) -> str:
    """The publisher variant a local build for this plan compiles: an x86-64 CPU without AVX2 gets
    the SSE4.2 build, a GPU or driver that CUDA 13 leaves out the CUDA 12 build, the others their
    backend's."""
    backend = plan.build.backend if plan.build else (plan.backend or "cpu")
    if backend == "cpu" and report.os.arch == "x86_64" and not report.cpu.has("avx2"):
        return "cpu-noavx2"
    if backend == "cuda" and _needs_cuda12(plan, report):
        return "cuda12"
    return backend


def _needs_cuda12(plan: Plan, report: HardwareReport) -> bool:
    """Whether the CUDA 13 build cannot serve this plan's GPU: the build spec says its last toolkit
    is CUDA 12 (Maxwell, Pascal, Volta: ``cuda_toolkit`` "12.x"), or its driver's CUDA is older than
    the 13.0 the ``cuda`` variant needs (``cuda_max``; without one, a driver below CUDA 13's family
    floor, R580)."""
    import re

    from ..manifests.hw_rules import hw_rules
    from ..manifests.machine import version_or_none
    from ..publisher.variants import CUDA13_VERSION

    props = plan.build.properties if plan.build else {}
    toolkit = re.match(r"^(\d+)", props.get("cuda_toolkit", ""))
    cuda13 = version_or_none(CUDA13_VERSION)
    if toolkit is not None and cuda13 is not None and int(toolkit.group(1)) < cuda13.major:
        return True
    cuda_max = version_or_none(props.get("cuda_max", ""))
    if cuda_max is not None and cuda13 is not None:
        return cuda_max < cuda13
    driver = version_or_none(props.get("nvidia_driver", ""))
    driver_os = "windows" if report.os.name == "windows" or report.os.wsl else "linux"  # WSL2: the host's driver
    floor = version_or_none(hw_rules().floor(cuda13.major if cuda13 else 13, driver_os))
    # a number below 100 is an L4T release (Jetson), not a desktop driver the floor describes
    return driver is not None and driver.major >= 100 and floor is not None and driver < floor


def local_cuda_archs(plan: Plan, report: HardwareReport) -> Optional[List[str]]:
    """The CMake architectures ("86") of the NVIDIA GPUs a local build for ``plan`` serves: a local
    CUDA build compiles only these, as each one costs more than an hour on a small machine. None
    when a compute capability is unknown (the build then compiles every architecture of its variant)."""
    from ..manifests.machine import cc_parts

    build = plan.build
    indexes = set(build.gpus if build is not None and build.gpus else plan.gpus)
    ccs = [g.compute_capability for g in report.gpus if g.index in indexes and g.vendor == "nvidia"]
    if not ccs and build is not None:
        ccs = [build.properties.get("sm", "")]
    archs: List[str] = []
    for cc in ccs:
        parts = cc_parts(cc)
        if parts is None:
            return None
        arch = f"{parts[0]}{parts[1]}"
        if arch not in archs:
            archs.append(arch)
    return sorted(archs, key=int) or None


def _build_locally(report: HardwareReport, plan: Plan, manifests: Manifests, s: Settings,
                   progress: ProgressCallback, channels: bool = True) -> Manifests:
    """Build the variant this machine needs from source (a cache hit needs no compiler; a miss
    without one fails in ``build_ggml`` naming what is missing) and offer it to the resolver."""
    from ..manifests.schema import parse_manifest
    from ..publisher.build import build_ggml
    from ..publisher.errors import BuildError
    from ..publisher.publish import manifest_of
    from ..publisher.variants import CUDA_VARIANTS, cuda_targets

    progress(ProgressEvent("message", "plan", message="no published build fits; building one from source"))
    variant = _local_variant(plan, report)
    archs: Optional[List[str]] = None
    if variant in CUDA_VARIANTS:
        archs = local_cuda_archs(plan, report)
        if archs:
            said = f"compiling {variant} only for this machine's GPU: {', '.join('sm_' + a for a in archs)}"
        else:
            every = cuda_targets(variant, None)
            said = (f"the compute capability of this machine's NVIDIA GPU is unknown, so the {variant} build compiles "
                    f"{', '.join('sm_' + a for a in every)}: {cuda_build_time(len(every))}")
        progress(ProgressEvent("message", "build", task=variant, message=said))
    try:
        result = build_ggml(variant, cache_dir=s.build_cache, progress=progress, cuda_archs=archs)
    except BuildError as exc:
        if exc.action is Action.INSTALL_TOOLCHAIN and not channels:  # the choices, not only the compiler
            needs = "" if exc.hint.startswith("install CMake and a C++ compiler") else f" (this variant: {exc.hint})"
            raise NoChannelError(f"{NO_CHANNEL_LINE}, and {exc.message}", no_channel_choices(report) + needs) from None
        if exc.action is Action.INSTALL_TOOLCHAIN:  # say why a build was wanted at all
            exc.message = f"no published ggml build fits this machine, and {exc.message}"
            exc.args = (exc.message,)
            exc.hint = f"{exc.hint} ({compiler_instructions(report.os.name)}); or use a channel with a build for this machine"
        raise
    doc = manifest_of([(result, Path(result.wheel).as_uri())], source=LOCAL_SOURCE, version=1)
    extended = Manifests(torch=manifests.torch, ggml=list(manifests.ggml))
    extended.add(parse_manifest(doc))
    return extended


def _replan(report: HardwareReport, old: Plan, manifests: Manifests, s: Settings) -> Plan:
    new = plan(report, "ggml", requirements=old.request.requirements, backend=old.request.backend, settings=s, manifests=manifests)
    new.notes.append("built locally from the stable-diffusion-cpp-python source (no published build fits this machine)")
    if not new.ok:
        raise AccelstackError(f"the local build does not fit this machine: {new.summary}", action=Action.REPORT_BUG)
    return new


def _provenance(plan: Plan, manifests: Manifests):
    """The trusted manifest that publishes the plan's exact artifacts: a plan edited on its way
    here (another URL or hash) matches none and is refused."""
    want = sorted(a.sha256 for a in plan.artifacts)
    for m in manifests.ggml:
        for t in m.targets:
            if t.id == plan.variant and sorted(a.sha256 for a in t.artifacts) == want:
                return m.envelope.source, m.envelope.version
    raise AccelstackError("the plan's build is not published by any trusted manifest",
                          hint="make the plan again from the current manifests", action=Action.EXPLAIN_PLAN)


def _install_torch(plan: Plan, report: HardwareReport, s: Settings, verifier: Optional[Verifier], dry_run: bool,
                   progress: ProgressCallback) -> InstallSummary:
    from ..installer.torch import PipCommands, TorchEnvironment, receipt_id, with_indexes

    if plan.status == "unsatisfiable":
        raise not_possible(plan)
    if not plan.ok:
        raise AccelstackError(f"no torch build fits: {plan.summary}", hint="; ".join(plan.conflicts) or
                              "the plan's candidates say why each build was rejected", action=Action.EXPLAIN_PLAN)
    python = target_interpreter(s, create=not dry_run)
    if dry_run:
        would = [] if s.torch_venv is None or Path(python).exists() else [f"would create the virtual environment {s.torch_venv}"]
        would += [f"would run: {c.render()}" for c in with_indexes(plan.commands, s.index_url, s.extra_index_urls)]
        would.append(f"would check that torch imports in {python} and sees the {plan.backend} device, "
                     "and put back what was there before if it does not")
        return InstallSummary("torch", receipt_id(plan, python), False, plan, dry_run=True, would=would)
    home, lock = _prepare(s, "install torch", progress)
    with lock:
        recovered = recover(home)
        rid = receipt_id(plan, python)
        dest = TorchEnvironment(home, python, s.timeouts.pip, s.timeouts.probe)
        outcome = run_transaction(plan, PipCommands.for_plan(plan, s), dest, verifier or default_verifier(s),
                                  home=home, runtime_id=rid,
                                  provenance=Provenance("builtin", 0, hardware_fingerprint(report), package="torch",
                                                        package_version=plan.torch_version),
                                  progress=progress)
    return InstallSummary("torch", rid, True, plan, outcome.receipt, outcome.previous, outcome.timings, recovered)


def upgrade(*, stack: str = "ggml", report: Optional[HardwareReport] = None, settings: Optional[Settings] = None,
            backend: Optional[str] = None, verifier: Optional[Verifier] = None,
            on_progress: Optional[ProgressCallback] = None) -> InstallSummary:
    """Plan again from the current (or remembered) manifests; install the result side by side,
    verify it, switch. The old runtime stays for rollback."""
    s = settings or Settings.resolve()
    if backend is None:
        backend = _active_backend_request(s, stack)
    return plan_and_install(report, stack, backend=backend, settings=s, verifier=verifier, prefer_remembered=True,
                            on_progress=on_progress)


def _active_backend_request(s: Settings, stack: str) -> str:
    home = home_of(s)
    try:
        rid = home.read_active().active.get(stack, "")
        return home.read_receipt(rid).plan.request.backend if rid else s.backend
    except StateError:
        return s.backend


def repair(*, stack: str = "ggml", settings: Optional[Settings] = None, verifier: Optional[Verifier] = None,
           on_progress: Optional[ProgressCallback] = None) -> RepairReport:
    """Rebuild a damaged ``active.json`` from the receipts, restore the active runtime's missing or
    corrupt files (package metadata included) and verify it again."""
    from ..artifacts import Cache, fetch

    if stack != "ggml":
        raise UsageError("repair restores ggml runtimes; a torch environment is repaired by installing it again",
                         action=Action.REINSTALL)
    s = settings or Settings.resolve()
    progress = on_progress or null_progress
    home, lock = _prepare(s, "repair", progress)
    with lock:
        state, rebuilt = active_or_rebuild(home)
        recover(home)
        if rebuilt:
            state = home.read_active()
        rid = state.active.get(stack)
        if not rid:
            raise StateError(f"no {stack} runtime is active, so there is nothing to repair", hint="install one first",
                             action=Action.INSTALL)
        cache = Cache(s.cache)
        rep = repair_ggml(home, rid, lambda ref: fetch([ref], cache=cache, progress=progress, offline=s.offline, deep=True)[ref.sha256],
                          verifier or default_verifier(s), progress)
        rep.pointer_rebuilt = rebuilt
    if rep.unrepairable:
        raise unrepairable_error(rep)
    return rep


def rollback(*, stack: str = "ggml", settings: Optional[Settings] = None) -> Active:
    """Switch back to the previous runtime of ``stack``."""
    s = settings or Settings.resolve()
    home, lock = _prepare(s, "rollback")
    with lock:
        recover(home)
        return maintenance.rollback(home, stack)


def uninstall(*, stack: str = "ggml", settings: Optional[Settings] = None) -> List[str]:
    """Remove every runtime of ``stack`` (a torch environment itself is never touched)."""
    s = settings or Settings.resolve()
    home, lock = _prepare(s, "uninstall")
    with lock:
        recover(home)
        return maintenance.uninstall(home, stack)


@dataclass
class SpaceUse:
    """A thing on disk and its size: a runtime an uninstall removes, or a cache it leaves."""

    name: str
    path: str
    bytes: int
    note: str = ""


@dataclass
class UninstallPreview:
    """What ``uninstall`` would remove (and free), and the caches it leaves in place."""

    stack: str
    runtimes: List[SpaceUse] = field(default_factory=list)
    bytes: int = 0  # freed by removing ``runtimes``
    kept: List[SpaceUse] = field(default_factory=list)  # download, build and probe caches: `accelstack cache purge`


def disk_usage(path: Path, skip: Sequence[Path] = ()) -> int:
    """Bytes of the regular files under ``path`` (links not followed), leaving out ``skip`` subtrees."""
    import os

    skipped = {str(p) for p in skip}
    total = 0
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if os.path.join(root, d) not in skipped]
        for f in files:
            try:
                st = os.lstat(os.path.join(root, f))
            except OSError:
                continue
            if not os.path.islink(os.path.join(root, f)):
                total += st.st_size
    return total


def cache_usage(s: Settings) -> List[SpaceUse]:
    """The download, build, probe and verify caches with their sizes (nested caches counted once)."""
    nested = [p for p in (s.build_cache, s.probe_cache, s.verify_dir) if s.cache in p.parents]
    return [SpaceUse("downloads", str(s.cache), disk_usage(s.cache, nested) if s.cache.is_dir() else 0),
            SpaceUse("builds", str(s.build_cache), disk_usage(s.build_cache) if s.build_cache.is_dir() else 0,
                     "local stable-diffusion.cpp builds, reused by the next install"),
            SpaceUse("probe", str(s.probe_cache), disk_usage(s.probe_cache) if s.probe_cache.is_dir() else 0,
                     "the verify probe model"),
            SpaceUse("verify", str(s.verify_dir), disk_usage(s.verify_dir) if s.verify_dir.is_dir() else 0,
                     "verify's probe images and its records of them")]


def uninstall_preview(*, stack: str = "ggml", settings: Optional[Settings] = None) -> UninstallPreview:
    """What :func:`uninstall` would remove and free, from reads alone (no lock, nothing written)."""
    from ..installer.recovery import readable_receipts

    s = settings or Settings.resolve()
    home = home_of(s)
    out = UninstallPreview(stack)
    receipts = readable_receipts(home)[0] if home.receipts.is_dir() else {}
    seen = set()
    for rid, r in sorted(receipts.items()):
        if r.stack != stack:
            continue
        where = home.runtime_path(r)
        if r.stack == "torch":  # the environment is the user's: only the record goes
            out.runtimes.append(SpaceUse(rid, str(where), 0, "the record only; the Python environment itself stays"))
            continue
        size = disk_usage(where) if where.is_dir() and not where.is_symlink() else 0
        seen.add(where.resolve())
        out.runtimes.append(SpaceUse(rid, str(where), size))
    if home.runtimes(stack).is_dir():
        for d in home.owned_children(home.runtimes(stack)):
            if d.resolve() not in seen:
                out.runtimes.append(SpaceUse(d.name, str(d), disk_usage(d), "left over from an interrupted install"))
    out.bytes = sum(r.bytes for r in out.runtimes)
    out.kept = cache_usage(s)
    return out


def gc(*, settings: Optional[Settings] = None) -> maintenance.GcReport:
    """Remove inactive runtimes (keeping the previous one) and downloads no home needs any more."""
    from ..artifacts import Cache

    s = settings or Settings.resolve()
    home, lock = _prepare(s, "gc")
    with lock:
        recover(home)
        return maintenance.gc(home, Cache(s.cache))


def status(*, report: Optional[HardwareReport] = None, settings: Optional[Settings] = None,
           check_upgrades: bool = True) -> List[maintenance.StackStatus]:
    """What is installed and active, whether its files are all there, whether it still fits this
    machine, and (from the manifests) whether a newer build would be chosen now. Reads only."""
    s = settings or Settings.resolve()
    home = home_of(s)
    report = report if report is not None else detect(settings=s)
    out = maintenance.local_status(home, hardware_fingerprint(report))
    for st in out:
        if st.stack != "ggml" or st.receipt is None or not check_upgrades:
            continue
        try:
            trusted = load_manifests(s, record=False, prefer_remembered=True)
            if not trusted.loaded:
                continue
            from ..installer.ggml import runtime_id

            p = plan(report, "ggml", backend=st.receipt.plan.request.backend, settings=s, manifests=trusted.manifests)
            if p.ok and runtime_id(p) != st.active:
                st.upgrade_available = runtime_id(p)
        except AccelstackError as exc:
            st.problems.append(maintenance.StatusProblem(f"could not check for upgrades: {exc.message}", exc.action.value))
    return out
