"""The ggml stack's driver: stable-diffusion.cpp builds from signed channels (or built here), installed
into the home as immutable runtime directories and verified with a probe generation."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ...artifacts.cache import Cache
from ...domain import BACKENDS
from ...engine import Runtime, verify
from ...engine.verification.probe_verify import default_output
from ...errors import AccelstackError, Action, SubprocessTimeout, UsageError
from ...events import ProgressCallback, ProgressEvent
from ...hardware.report import HardwareReport
from ...installer import maintenance
from ...installer.cuda_libs import shared_root
from ...installer.errors import StateError
from ...installer.ggml import FetchedWheel, GgmlDirectory, runtime_id, wheel_of
from ...installer.home import Home
from ...installer.records import Receipt
from ...installer.recovery import recover
from ...installer.repair import RepairReport, repair_ggml
from ...installer.transaction import Provenance, StagedRuntime, Verifier
from ...installer.transaction import install as run_transaction
from ...manifests.plan import Plan
from ...manifests.resolver import Manifests
from ...publisher.sdist import offline_source_error, sdist_name
from ...publisher.variants import CUDA_VARIANTS
from ...refs import ArtifactRef
from ...serde import size_text
from ...settings import Settings
from ...verdict import DeviceInfo, VerifyCheck, VerifyReport
from ..context import InstallJob, prepare_home
from ..disk_state import active_id
from ..local_build import (
    Rebuild,
    build_locally,
    build_sentence,
    cached_build_manifests,
    cached_local_build,
    local_cuda_archs,
    local_variant,
    replan,
    require_buildable,
)
from ..options import Fetcher
from ..planning import (
    LOCAL_SOURCE,
    LoadedManifest,
    TrustedSet,
    adhoc_channel_name,
    hardware_fingerprint,
    load_manifests,
    plan,
    remember_channels,
)
from ..results import InstallSummary, not_possible
from . import ggml_bundle
from .protocol import InstallEntry

__all__ = ["GgmlDriver", "DRIVER", "wheel_version"]

ACTIVATE = "check it with a probe generation, and activate it only if that passes"
_IMPORT = (  # the runtime's outside libraries (a CUDA build's cudart/cuBLAS) load first, as in the worker
    "import os; from accelstack.engine.worker.backend import libraries_in, load_runtime_libraries;"
    "load_runtime_libraries(*libraries_in(os.environ));"
    "import json, stable_diffusion_cpp as s, stable_diffusion_cpp.stable_diffusion_cpp as lib;"
    "print(json.dumps({'version': getattr(s, '__version__', ''), 'system_info': "
    "(lib.sd_get_system_info() or b'').decode('utf-8', 'replace').strip()}))"
)


def wheel_version(name: str) -> tuple:
    """(distribution, version) from a wheel's file name (``stable_diffusion_cpp_python-0.4.7-cp311-...whl``)."""
    parts = name[:-len(".whl")].split("-") if name.endswith(".whl") else []
    return (parts[0].replace("_", "-"), parts[1]) if len(parts) >= 5 else ("", "")


def _provenance_of(source: str, version: int, loaded: Sequence[LoadedManifest], wheel_name: str,
                   report: HardwareReport) -> Provenance:
    """Where the runtime came from, for the receipt and ``status``: the channel that published the
    manifest (none for a local build), the manifest, and the package version inside the wheel."""
    read = next((m for m in loaded if m.source == source and m.version == version), None)
    channel = read.channel if read is not None and read.channel != adhoc_channel_name(read.url) else ""  # not for --manifest
    package, package_version = wheel_version(wheel_name)
    return Provenance(source, version, hardware_fingerprint(report), channel=channel, package=package,
                      package_version=package_version, manifest_url=read.url if read is not None else "")


def _published_by(plan: Plan, manifests: Manifests):
    """The trusted manifest that publishes the plan's exact artifacts: a plan edited on its way
    here (another URL or hash) matches none and is refused."""
    want = sorted(a.sha256 for a in plan.artifacts)
    for m in manifests.ggml:
        for t in m.targets:
            if t.id == plan.variant and sorted(a.sha256 for a in t.artifacts) == want:
                return m.envelope.source, m.envelope.version
    raise AccelstackError("the plan's build is not published by any trusted manifest",
                          hint="make the plan again from the current manifests", action=Action.EXPLAIN_PLAN)


def _already_installed(home: Home, plan: Plan, receipt: Receipt, recovered: List[str], built: bool) -> InstallSummary:
    rid = receipt.id
    previous = active_id(home, plan.stack)
    if previous != rid:
        home.set_active(plan.stack, rid)
        return InstallSummary(plan.stack, rid, True, plan, receipt, previous, recovered=recovered, built_locally=built)
    return InstallSummary(plan.stack, rid, False, plan, receipt, recovered=recovered, built_locally=built)


def _import_env(staged: StagedRuntime) -> Dict[str, str]:
    """The worker's environment for the staged runtime (its library note read), and accelstack
    importable beside it."""
    env = Runtime(path=Path(staged.path), backend=staged.backend, env=dict(staged.env)).worker_env()
    package_root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join([str(staged.path), package_root])
    return env


class GgmlDriver:
    name = "ggml"
    repairable = True
    retries_candidates = True  # a build that fails verify here gives way to the next (issue 12)
    removes_files = True

    # -- before planning ------------------------------------------------------------------------
    def check_request(self, report: HardwareReport, backend: Optional[str], settings: Settings) -> None:
        """A forced backend this machine has no device for is refused before any manifest is
        fetched or anything is built: planned against no published builds at all, the plan still
        says whether the hardware could run a build of it (``needs-build``) or not (``unsatisfiable``)."""
        if not backend or backend.strip().lower() not in BACKENDS:
            return  # a manifest's target id names no backend until the manifests are read
        p = plan(report, self.name, backend=backend, settings=settings, manifests=Manifests.builtin())
        if p.status == "unsatisfiable":
            raise not_possible(p)

    def unsatisfiable(self, plan: Plan, trusted: Optional[TrustedSet]) -> Exception:
        """A forced backend that is neither a backend nor a target id of the manifests read is a
        typo (a usage error, exit 2), not something this machine lacks."""
        backend = plan.request.backend
        forced = (backend or "").strip().lower()
        if forced and forced not in BACKENDS:
            ids = sorted({t.id.lower() for m in (trusted.manifests.ggml if trusted is not None else []) for t in m.targets})
            if forced not in ids:
                return UsageError(f"unknown backend {backend!r}", f"choose one of {', '.join(BACKENDS)}"
                                  + (f", or a target of the manifests: {', '.join(ids[:8])}" if ids else ""))
        return not_possible(plan)

    # -- install --------------------------------------------------------------------------------
    def install(self, plan: Plan, job: InstallJob) -> InstallSummary:
        s, report, progress, opts = job.settings, job.report, job.progress, job.options
        home, lock = prepare_home(s, "install", progress, stack="ggml")
        with lock:
            recovered = recover(home)
            timings: dict = {}
            trusted = opts.trusted
            if trusted is None:  # read here only when the caller did not (install reads them before planning)
                t = time.perf_counter()
                trusted = load_manifests(s, record=True, progress=progress, fetcher=job.fetcher)
                timings["manifests"] = time.perf_counter() - t
            manifests, loaded = trusted.manifests, trusted.loaded
            built = False
            if not plan.ok:
                require_buildable(plan, s, report, trusted)
                t = time.perf_counter()
                builder, hits = job.services.builder_or_default(), []

                def build(*args: Any, **kwargs: Any) -> Any:  # notes whether it compiled, for the timings
                    result = builder(*args, **kwargs)
                    hits.append(bool(getattr(result, "cache_hit", False)))
                    return result
                manifests = build_locally(report, plan, manifests, s, progress, bool(trusted.channels), builder=build)
                # a build-cache hit compiles nothing: its time is not "build from source"
                timings["build-cache" if hits and all(hits) else "build"] = time.perf_counter() - t
                plan = replan(report, plan, manifests, s)
                built = True
            source, version = _published_by(plan, manifests)
            rid = runtime_id(plan)
            existing = None if opts.force else home.intact_receipt(self.name, rid)
            if existing is not None:
                return _already_installed(home, plan, existing, recovered, built)
            reinstall = active_id(home, self.name) == rid  # --force over the active runtime
            ref = wheel_of(plan)
            t = time.perf_counter()
            progress(ProgressEvent("message", "install", message=f"fetching {ref.name}"))
            fetcher = job.fetcher
            # a local build's wheel is a file in the build cache, not a download: hashed into the
            # download cache even offline
            paths = fetcher.files([ref], progress=progress, offline=False if built else None)
            timings["download"] = time.perf_counter() - t
            dest = GgmlDirectory(home, rid, cuda_libs=plan.cuda_libs,  # a CUDA build's shared cudart/cuBLAS
                                 fetch=lambda refs: fetcher.files(refs, progress=progress))
            outcome = run_transaction(plan, FetchedWheel(paths[ref.sha256], ref.name), dest,
                                      job.verifier(self.verifier(s, None, {})), home=home, runtime_id=rid,
                                      provenance=_provenance_of(source, version, loaded, ref.name, report),
                                      progress=progress)
            timings.update(outcome.timings)
            if loaded and trusted.remember:
                remember_channels(s, trusted.channels)
            maintenance.register_home(Cache(s.cache), home, maintenance.referenced_blobs(home))
            return InstallSummary(self.name, rid, True, plan, outcome.receipt, "" if reinstall else outcome.previous,
                                  timings, recovered, built, reinstalled=reinstall)

    def dry_run(self, plan: Plan, job: InstallJob) -> InstallSummary:
        """What an install would do, from reads alone: no home, lock, cache entry, download or build."""
        s, report, force = job.settings, job.report, job.options.force
        home = Home(s.home)
        reuse: List[str] = []
        if not plan.ok:
            require_buildable(plan, s, report, job.options.trusted)
            trusted = job.options.trusted
            offered = cached_build_manifests(plan, report, trusted.manifests if trusted else Manifests(), s)
            if offered is not None:  # the real run reuses this build: its runtime decides, as there
                variant, plan = local_variant(plan, report), replan(report, plan, offered, s)
                reuse = [f"would reuse the {variant} build already in the build cache (no compile): {wheel_of(plan).name}"]
        if not plan.ok:
            variant = local_variant(plan, report)
            archs = local_cuda_archs(plan, report) if variant in CUDA_VARIANTS else None
            cached = cached_local_build(variant, s.build_cache, archs, configured=s.cuda_archs, env=s.cuda_env)
            first = f"would reuse the {variant} build already in the build cache (no compile): {cached}" if cached \
                else build_sentence(variant, archs, configured=s.cuda_archs, env=s.cuda_env)
            if not cached and s.offline and not (s.build_cache / "sdist" / sdist_name()).is_file():
                first += f"; but {offline_source_error(s.build_cache / 'sdist').message}"
            would = [first, f"would install the build into {home.runtimes(self.name)}, {ACTIVATE}"]
            return InstallSummary(self.name, "", False, plan, dry_run=True, would_build=variant, would=would)
        rid = runtime_id(plan)
        active = active_id(home, self.name) if home.active_path.is_file() else ""
        intact = home.receipts.is_dir() and home.intact_receipt(self.name, rid) is not None
        if intact and active == rid and not force:
            return InstallSummary(self.name, rid, False, plan, dry_run=True,
                                  would=[f"nothing to do: runtime {rid} is already installed and active (--force reinstalls it)"])
        if intact and not force:
            return InstallSummary(self.name, rid, False, plan, dry_run=True, previous=active,
                                  would=[f"would activate the installed runtime {rid}" + (f" (now active: {active})" if active else "")])
        cache = Cache(s.cache)
        would = list(reuse)
        for a in plan.artifacts:
            if cache.valid(a.sha256, a.size, verify=False):
                would.append(f"would use {a.name} ({size_text(a.size)}) from the download cache")
            else:
                part = cache.part_size(a.sha256)
                resume = f", resuming after {size_text(part)} already downloaded" if 0 < part < a.size else ""
                would.append(f"would download {a.name} ({size_text(a.size)}){resume}")
        if plan.cuda_libs:  # NVIDIA's cudart/cuBLAS wheels, shared by the home's CUDA runtimes (installer.cuda_libs)
            names = ", ".join(a.name.split("-")[0] for a in plan.cuda_libs)
            would.append(f"would provide {names} ({size_text(sum(a.size for a in plan.cuda_libs))}) once in "
                         f"{shared_root(home)}: reused when the home or a torch environment has them, else downloaded")
        would.append(f"would {'reinstall' if intact else 'install'} runtime {rid} into {home.runtimes(self.name) / rid}, {ACTIVATE}"
                     + (f"; {active} stays for `rollback`" if active and active != rid else ""))
        return InstallSummary(self.name, rid, False, plan, dry_run=True, previous=active if active != rid else "", would=would)

    # -- verify -----------------------------------------------------------------------------------
    def verifier(self, settings: Settings, output: Optional[Path], engine: Dict[str, Any]) -> Verifier:
        """The engine's generation check on the probe model, its records and image in the settings' caches."""

        def check(staged: StagedRuntime, progress: ProgressCallback) -> VerifyReport:
            runtime = Runtime(path=Path(staged.path), backend=staged.backend, env=dict(staged.env))
            out = output or default_output(staged.backend, settings.verify_dir)
            return verify(runtime, output=out, probe_cache=settings.probe_cache, records=settings.verify_dir,
                          progress=progress, **engine)

        return check

    def import_verifier(self, timeout: float) -> Verifier:
        """The bindings import and their native library loads, in a fresh process. No generation."""

        def check(staged: StagedRuntime, progress: ProgressCallback) -> VerifyReport:
            t0 = time.perf_counter()
            task = f"{staged.backend} runtime"
            progress(ProgressEvent("start", "verify", task=task, message="checking that the runtime's library loads"))
            try:
                res = subprocess.run([sys.executable, "-c", _IMPORT], env=_import_env(staged),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                progress(ProgressEvent("end", "verify", task=task, ok=False, message=f"no answer within {timeout:.0f} s"))
                raise SubprocessTimeout(f"loading the runtime took longer than {timeout:.0f} s") from None
            seconds = round(time.perf_counter() - t0, 4)
            progress(ProgressEvent("end", "verify", task=task, ok=res.returncode == 0,
                                   message=f"the library loads ({seconds:.1f} s)" if res.returncode == 0
                                   else "the library does not load"))
            if res.returncode != 0:
                last = (res.stderr.strip().splitlines() or ["no output"])[-1]
                return VerifyReport(ok=False, reason=f"the runtime does not load: {last}", runtime=str(staged.path),
                                    backend=staged.backend, check="import", total_seconds=seconds,
                                    checks=[VerifyCheck("load", False, last)], log_tail=res.stderr.strip().splitlines()[-20:])
            try:
                found = json.loads(res.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                found = {}
            return VerifyReport(ok=True, reason="", runtime=str(staged.path), backend=staged.backend, check="import",
                                device=DeviceInfo(name=staged.backend), total_seconds=seconds,
                                checks=[VerifyCheck("load", True, str(found.get("system_info", ""))[:200])], details=found)

        return check

    # -- locate -----------------------------------------------------------------------------------
    def staged(self, receipt: Receipt, path: Path) -> StagedRuntime:
        return StagedRuntime(stack=receipt.stack, backend=receipt.backend, path=path, env=dict(receipt.env))

    def interpreter(self, path: Optional[Path], active: Optional[Tuple[Receipt, Path]]) -> Tuple[Optional[str], Dict[str, str]]:
        """A ggml runtime runs in this interpreter, its directory first on the import path."""
        where = path if path is not None else active[1] if active is not None else None
        return None, ({"PYTHONPATH": str(where)} if where is not None else {})

    def runtime_id(self, plan: Plan, settings: Settings) -> str:
        return runtime_id(plan)

    # -- upkeep ------------------------------------------------------------------------------------
    def repair(self, settings: Settings, verifier: Optional[Verifier], fetcher: Fetcher,
               progress: ProgressCallback, rebuild: Optional[Rebuild] = None) -> RepairReport:
        """Restore the active runtime's missing or corrupt files (from the download cache, else
        downloaded again, deep-hashed; a runtime built here whose wheel is no longer in the build
        cache, with ``rebuild``: built again) and verify it again; the caller holds the home's lock."""
        home = Home(settings.home)
        state = home.read_active()
        rid = state.active.get(self.name)
        if not rid:
            raise StateError(f"no {self.name} runtime is active, so there is nothing to repair", hint="install one first",
                             action=Action.INSTALL)
        receipt = home.read_receipt(rid)

        def fetch(ref: ArtifactRef) -> Path:
            try:
                return fetcher.files([ref], progress=progress, deep=True)[ref.sha256]
            except AccelstackError:
                if rebuild is None or receipt.manifest_source != LOCAL_SOURCE or ref not in receipt.plan.artifacts:
                    raise
                return rebuild(receipt, progress)

        return repair_ggml(home, rid, fetch, verifier or self.verifier(settings, None, {}), progress)

    def upgrade_available(self, status: maintenance.StackStatus, report: HardwareReport, settings: Settings) -> str:
        """The runtime a plan from the remembered channels would install now, when it is not the active one."""
        if status.receipt is None:
            return ""
        trusted = load_manifests(settings, record=False, prefer_remembered=True)
        if not trusted.loaded:
            return ""
        p = plan(report, self.name, backend=status.receipt.plan.request.backend, settings=settings,
                 manifests=trusted.manifests)
        return runtime_id(p) if p.ok and runtime_id(p) != status.active else ""

    def uninstall_note(self, home: Home, receipt: Receipt) -> str:
        return ""

    def create_bundle(self, out: Path, settings: Settings, report: Optional[HardwareReport], *,
                      backends: Sequence[str], targets: Sequence[str], all_targets: bool,
                      requirements: Sequence[str], python_version: str, platforms: Sequence[str],
                      progress: ProgressCallback) -> Any:
        if requirements or python_version or platforms:
            raise UsageError("requirements, a Python version and platforms are for torch bundles", "add --stack torch")
        return ggml_bundle.create(out, settings, report, backends, targets, all_targets, progress)

    def install_bundle(self, opened: Any, what: str, job: InstallJob, backend: Optional[str],
                       read_seconds: float, install: InstallEntry) -> InstallSummary:
        return ggml_bundle.install_from(opened, what, job, backend, install)


DRIVER = GgmlDriver()
