"""Local builds: when no published ggml build fits, which variant this machine compiles, for
which GPU architectures, how long it takes and what it needs, and the build itself.

The install flow asks here only after the plan said ``needs-build``; a dry run uses the same
rules from reads alone (``build_sentence``, ``cached_local_build``) and never compiles.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

from ..errors import AccelstackError, Action
from ..events import ProgressCallback, ProgressEvent
from ..hardware.report import HardwareReport
from ..installer.records import Receipt
from ..limits import read_capped
from ..manifests.build_targets import build_archs, build_variant
from ..manifests.plan import Plan
from ..manifests.resolver import Manifests
from ..manifests.schema import parse_manifest
from ..publisher.build import build_ggml, build_options
from ..publisher.build_cache import BuildResult, cache_key, in_cache, remembered_sha256, sha256_file
from ..publisher.errors import BuildError
from ..publisher.publish import manifest_of
from ..publisher.sdist import offline_source_error, sdist_name
from ..publisher.variants import CUDA_VARIANTS, VARIANTS, cuda_targets, find_cuda_toolkit
from ..publisher.wheel_repack import PACKAGING_VERSION
from ..settings import Settings, cuda_env
from .options import Builder
from .planning import LOCAL_SOURCE, NO_CHANNEL_LINE, TrustedSet, plan

__all__ = ["BUILD_NEEDS", "NO_CHANNEL_LINE", "NoChannelError", "Rebuild", "build_locally", "built_variant", "rebuilder", "build_sentence", "cached_build_manifests", "cached_local_build",
           "compiler_instructions", "cuda_build_time", "local_cuda_archs", "local_variant",
           "no_channel_choices", "replan", "require_buildable"]


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
             ["cmake", "a C++ compiler", "NVIDIA's CUDA 13 compiler, about 480 MiB downloaded once from PyPI "
                                         "into the build cache"]),
    "cuda12": (cuda_build_time(1),
               ["cmake", "a C++ compiler", "a system CUDA 12 toolkit with nvcc 12.x"]),
    "rocm": ("~15 min", ["cmake", "a C++ compiler", "ROCm (hipcc)"]),
    "metal": ("~4 min", ["cmake", "Xcode's command line tools"]),
}


def build_sentence(variant: str, cuda_archs: Optional[Sequence[str]] = None, *, configured: str = "",
                   env: Optional[Mapping[str, str]] = None) -> str:
    """"would build cpu from source (~4 min, needs cmake and a C++ compiler)", and what is missing.

    A CUDA build names the architectures it compiles (``cuda_archs``; none: ``configured``, the
    settings' ``cuda_archs``, else all of the variant's), since each one costs more than an hour on
    a small machine; ``env`` is where a CUDA toolkit is looked for (the settings' ``cuda_env``)."""
    took, needs = BUILD_NEEDS.get(variant, ("several minutes", ["cmake", "a C++ compiler"]))
    target, sep = "", ", "
    if variant in CUDA_VARIANTS:
        archs = cuda_targets(variant, cuda_archs, configured)
        named = ", ".join(f"sm_{a}" for a in archs)
        target = f" for {named}" if cuda_archs or configured else \
            f" for every architecture the {variant} variant supports ({named}), as this GPU's compute capability is unknown"
        took, sep = cuda_build_time(len(archs)), "; "
    text = f"would build {variant} from source{target} ({took}{sep}needs {', '.join(needs[:-1])} and {needs[-1]})"
    missing = [] if shutil.which("cmake") else ["cmake"]
    if not any(shutil.which(c) for c in ("c++", "g++", "clang++", "cl")):
        missing.append("a C++ compiler")
    if variant == "cuda12" and find_cuda_toolkit(12, cuda_env() if env is None else env)[0] is None:
        missing.append("a CUDA 12 toolkit")
    if missing:
        text += f"; not found here: {', '.join(missing)}"
    return text


def cached_local_build(variant: str, build_cache: Path, cuda_archs: Optional[Sequence[str]] = None, *,
                       configured: str = "", env: Optional[Mapping[str, str]] = None) -> str:
    """The wheel a local build of ``variant`` (for ``cuda_archs``) would reuse from the build cache
    ("" when it would compile), found by reading only: the pinned source's digest, then the cache
    slot it keys, with the options and toolkit key ``build_ggml`` itself would use."""
    found = _cached_record(variant, build_cache, cuda_archs, configured=configured, env=env)
    return found[0] if found else ""


def _cached_record(variant: str, build_cache: Path, cuda_archs: Optional[Sequence[str]] = None, *,
                   configured: str = "", env: Optional[Mapping[str, str]] = None) -> Optional[Tuple[str, dict]]:
    """(the cached wheel, its slot's build record) for :func:`cached_local_build`, or None."""
    sdist = build_cache / "sdist" / sdist_name()
    if variant == "vulkan" or not sdist.is_file():
        return None  # a Vulkan build's key also names the headers it was given
    try:
        cmake_args, toolkit = build_options(variant, cuda_archs, cuda_env=cuda_env() if env is None else env,
                                            configured=configured)
    except BuildError:  # an unknown variant, bad architectures, cuda12 without a toolkit: nothing to find
        return None
    try:
        digest = remembered_sha256(sdist) or sha256_file(sdist)  # what build_ggml remembered, read only
        key = cache_key(digest, variant, cmake_args, toolkit)
        record = json.loads(read_capped(build_cache / key / "build.json", 1 << 20))  # a FIFO is refused, never waited on
        wheel = in_cache(str(record.get("wheel", "")), build_cache, key) if isinstance(record, dict) else ""
    except (OSError, ValueError):
        return None
    return (wheel, record) if wheel and Path(wheel).is_file() else None


def cached_build_manifests(plan: Plan, report: HardwareReport, manifests: Manifests, s: Settings) -> Optional[Manifests]:
    """``manifests`` with the build a local build would reuse as-is from the build cache, found by
    reading only, and offered as :func:`build_locally` offers it: a dry run then plans the runtime
    the real run would install (and sees when it is installed already). None when the real run
    would compile or repackage (its wheel, so the runtime's id, is not known before)."""
    variant = local_variant(plan, report)
    archs = local_cuda_archs(plan, report) if variant in CUDA_VARIANTS else None
    found = _cached_record(variant, s.build_cache, archs, configured=s.cuda_archs, env=s.cuda_env)
    if found is None:
        return None
    wheel, data = found
    try:
        record = BuildResult(**data)
    except TypeError:
        return None
    if record.packaging < PACKAGING_VERSION or remembered_sha256(Path(wheel)) != record.sha256:
        return None  # the real run repackages or re-hashes it first
    record.wheel = wheel
    doc = manifest_of([(record, Path(wheel).as_uri())], source=LOCAL_SOURCE, version=1)
    extended = Manifests(torch=manifests.torch, ggml=list(manifests.ggml))
    extended.add(parse_manifest(doc))
    return extended


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


def require_buildable(plan: Plan, s: Settings, report: HardwareReport, trusted: Optional[TrustedSet]) -> None:
    if plan.status == "needs-build" and not plan.artifacts:
        if s.allow_build:
            return
        if trusted is not None and not trusted.channels:
            raise NoChannelError(f"{NO_CHANNEL_LINE}, and local builds are turned off", no_channel_choices(report))
        raise AccelstackError(f"nothing to install: {plan.summary}", hint="name a manifest with a build for this machine, "
                              "or allow a local build from source", action=Action.ADD_MANIFEST)
    raise AccelstackError(f"nothing to install: {plan.summary}", hint="; ".join(plan.conflicts) or
                          "the plan's candidates say why each build was rejected", action=Action.EXPLAIN_PLAN)


def local_variant(plan: Plan, report: HardwareReport) -> str:
    """The publisher variant a local build for this plan compiles, as the resolver decided it
    (``plan.build.variant``, :mod:`accelstack.manifests.build_targets`); a plan without one (an
    older plan's JSON, a receipt's ready plan) is given the resolver's rule for its backend."""
    build = plan.build
    if build is not None and build.variant:
        return build.variant
    backend = build.backend if build is not None else (plan.backend or "cpu")
    return build_variant(backend, build.properties if build is not None else {}, report)


def local_cuda_archs(plan: Plan, report: HardwareReport) -> Optional[List[str]]:
    """The CMake architectures ("86") a local CUDA build for ``plan`` compiles, as the resolver
    decided them (``plan.build.archs``; a plan without a decided build, the resolver's rule over its
    GPUs). None when it names none: a compute capability is unknown, and the build compiles every
    architecture of its variant."""
    build = plan.build
    if build is not None and build.variant:
        return list(build.archs) or None
    gpus = build.gpus if build is not None and build.gpus else plan.gpus
    return build_archs("cuda", gpus, build.properties if build is not None else {}, report) or None


def _for_archs(variant: str, archs: Optional[List[str]], s: Settings) -> str:
    """" for sm_86" / " for sm_75, sm_80, ... (this GPU's compute capability is unknown)"; "" off CUDA."""
    if variant not in CUDA_VARIANTS:
        return ""
    if archs:
        return " for " + ", ".join("sm_" + a for a in archs)
    every = cuda_targets(variant, None, s.cuda_archs)
    return f" for {', '.join('sm_' + a for a in every)} (this GPU's compute capability is unknown)"


def build_locally(report: HardwareReport, plan: Plan, manifests: Manifests, s: Settings,
                  progress: ProgressCallback, channels: bool = True, builder: Builder = build_ggml) -> Manifests:
    """Build the variant this machine needs from source (a cache hit needs no compiler; a miss
    without one fails in ``build_ggml`` naming what is missing) and offer it to the resolver.
    Offline, a miss without the source in the build cache is an ``OfflineError`` before any work."""
    variant = local_variant(plan, report)
    archs = local_cuda_archs(plan, report) if variant in CUDA_VARIANTS else None
    cached = cached_local_build(variant, s.build_cache, archs, configured=s.cuda_archs, env=s.cuda_env)
    if cached:  # a cache hit compiles nothing: it is not "building from source"
        progress(ProgressEvent("message", "plan", message=f"no published build fits; reusing the {variant} build"
                                                          f"{_for_archs(variant, archs, s)} already in the build cache: {cached}"))
    else:
        if s.offline and not (s.build_cache / "sdist" / sdist_name()).is_file():
            raise offline_source_error(s.build_cache / "sdist")  # before the lock's wait, a download or a compile
        progress(ProgressEvent("message", "plan", message="no published build fits; building one from source"))
    if variant in CUDA_VARIANTS and not cached:
        if archs:
            said = f"compiling {variant} only for this machine's GPU: {', '.join('sm_' + a for a in archs)}"
        else:
            every = cuda_targets(variant, None, s.cuda_archs)
            said = (f"the compute capability of this machine's NVIDIA GPU is unknown, so the {variant} build compiles "
                    f"{', '.join('sm_' + a for a in every)}: {cuda_build_time(len(every))}")
        progress(ProgressEvent("message", "build", task=variant, message=said))
    try:
        result = builder(variant, s, progress=progress, cuda_archs=archs)
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


def replan(report: HardwareReport, old: Plan, manifests: Manifests, s: Settings) -> Plan:
    new = plan(report, old.stack, requirements=old.request.requirements, backend=old.request.backend, settings=s, manifests=manifests)
    new.notes.append("built locally from the stable-diffusion-cpp-python source (no published build fits this machine)")
    if not new.ok:
        raise AccelstackError(f"the local build does not fit this machine: {new.summary}", action=Action.REPORT_BUG)
    return new


# -- a runtime built here, built again for repair ---------------------------------------------
Rebuild = Callable[[Receipt, ProgressCallback], Path]
"""Builds again the wheel a locally built runtime came from: ``rebuild(receipt, progress)`` -> its path."""


def built_variant(receipt: Receipt) -> str:
    """The variant a local build compiled, from the target id its manifest gave it
    (``<os>-<arch>-<variant>``, :func:`publisher.publish.target_for`); "" when it names none."""
    names = sorted((v for v in VARIANTS if receipt.plan.variant.endswith("-" + v)), key=len, reverse=True)
    return names[0] if names else ""


def rebuilder(s: Settings, builder: Builder, report: Callable[[], HardwareReport]) -> Rebuild:
    """What ``repair`` does when a runtime built here has lost files and its wheel is no longer in
    the build cache (``cache purge``): build the same variant, for the same GPUs, as install did
    (``report`` is asked only for a CUDA build's architectures); offline without the source, the
    install's offline error, before any work."""

    def rebuild(receipt: Receipt, progress: ProgressCallback) -> Path:
        variant = built_variant(receipt)
        if not variant:
            raise AccelstackError(f"runtime {receipt.id} was built here, but its receipt does not say which variant",
                                  hint="reinstall the runtime", action=Action.REINSTALL)
        archs = local_cuda_archs(receipt.plan, report()) if variant in CUDA_VARIANTS else None
        cached = cached_local_build(variant, s.build_cache, archs, configured=s.cuda_archs, env=s.cuda_env)
        if not cached and s.offline and not (s.build_cache / "sdist" / sdist_name()).is_file():
            raise offline_source_error(s.build_cache / "sdist")
        progress(ProgressEvent("message", "repair", task=receipt.id, message=(
            f"the {variant} build this runtime was made from is not in the build cache any more; building it again "
            f"{'(a build cache hit)' if cached else 'from source'}{_for_archs(variant, archs, s)}")))
        return Path(builder(variant, s, progress=progress, cuda_archs=archs).wheel)

    return rebuild
