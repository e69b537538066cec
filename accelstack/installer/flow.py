"""The user-facing operations: install, status, repair, upgrade, rollback, uninstall, gc.

Each is detect -> plan -> (fetch -> install -> verify -> activate), under the home's install
lock, with ``recover`` first so a previously killed run never leaves a mess behind. Functions
return data for the CLI to print; progress goes to the callback.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ..detect.report import HardwareReport
from ..errors import AccelstackError, UsageError
from ..events import ProgressCallback, ProgressEvent, null_progress
from ..manifests.plan import Plan, Request
from ..manifests.resolve import Manifests, resolve
from ..serde import to_dict
from . import ggml as ggml_rt
from .state import Active, Home, Receipt, StateError, atomic_write

LOCAL_SOURCE = "local-build"


@dataclass
class ManifestOptions:
    """Where ggml builds come from and how far to trust them."""

    urls: List[str] = field(default_factory=list)
    insecure_unsigned: bool = False
    offline: Optional[bool] = None
    allow_build: bool = True  # build locally when no manifest has a build for this machine
    extra_keys: List[str] = field(default_factory=list)


def hardware_fingerprint(report: HardwareReport) -> str:
    """What, if it changes, may make the installed runtime the wrong one (GPU, driver, OS, CPU)."""
    material = {
        "os": [report.os.name, report.os.arch],
        "cpu": report.cpu.features,
        "gpus": [[g.vendor, g.pci_device_id or g.name, g.driver_version, g.compute_capability, g.gfx_target] for g in report.gpus],
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]


def _settings_path(home: Home) -> Path:
    return home.root / "settings.json"


def remembered_manifests(home: Home) -> List[str]:
    try:
        return list(json.loads(_settings_path(home).read_text()).get("manifests", []))
    except (OSError, ValueError):
        return []


def remember_manifests(home: Home, urls: List[str]) -> None:
    if urls:
        atomic_write(_settings_path(home), json.dumps({"manifests": urls}, indent=2))


def load_manifests(opts: ManifestOptions, home: Home) -> Manifests:
    """The builtin torch matrix plus every ggml manifest named, each verified before use."""
    from ..artifacts.documents import fetch_document, fetch_optional_document
    from ..manifests.schema import parse_manifest
    from ..manifests.signing import RollbackStore, TrustStore, check_manifest

    manifests = Manifests.builtin()
    if not opts.urls:
        return manifests
    trust = TrustStore([Path(k) if k.endswith(".pub") else k for k in opts.extra_keys])
    rollback = RollbackStore(home.root / "state" / "manifest-versions.json")
    from ..artifacts import FetchError

    for url in opts.urls:
        try:
            data = fetch_document(url)
            sig = fetch_optional_document(url + ".sig")
        except FetchError as exc:
            raise FetchError(f"cannot get the manifest {url}: {exc.message}",
                             "check the URL and the network; nothing was changed") from None
        verified = check_manifest(data, sig, trust=trust, rollback=rollback, insecure_unsigned=opts.insecure_unsigned)
        manifests.add(parse_manifest(verified.data))
    return manifests


def _local_variant(report: HardwareReport, plan: Plan) -> str:
    backend = plan.build.backend if plan.build else (plan.backend or "cpu")
    if backend == "cpu" and report.os.arch == "x86_64" and not report.cpu.has("avx2"):
        return "cpu-noavx2"
    return backend


def local_build_manifests(report: HardwareReport, plan: Plan, manifests: Manifests, progress: ProgressCallback) -> Manifests:
    """Build the variant this machine needs from source and offer it to the resolver as a manifest."""
    from ..manifests.schema import parse_manifest
    from .build import build_ggml, missing_toolchain
    from .publish import build_manifest

    variant = _local_variant(report, plan)
    missing = missing_toolchain(variant)
    if missing:
        raise AccelstackError(
            f"no published ggml build fits this machine and a local {variant} build needs {', '.join(missing)}",
            hint=f"install {', '.join(missing)}, or pass --manifest URL of a manifest with a build for this machine",
        )
    result = build_ggml(variant, progress=progress)
    out = Path(result.wheel).parent
    build_json = out / f"{Path(result.wheel).name}.build.json"
    if not build_json.is_file():  # the record publish.build_manifest reads; written once per build
        build_json.write_text(json.dumps({**to_dict(result), "cache_hit": False}))
    doc = build_manifest(out, out.as_uri(), source=LOCAL_SOURCE, version=1)
    extended = Manifests(torch=manifests.torch, ggml=list(manifests.ggml))
    extended.add(parse_manifest(doc))
    return extended


@dataclass
class InstallSummary:
    stack: str
    runtime: str
    changed: bool
    plan: Plan
    receipt: Optional[Receipt] = None
    previous: str = ""
    timings: Dict[str, float] = field(default_factory=dict)
    recovered: List[str] = field(default_factory=list)
    built_locally: bool = False


def plan_for(report: HardwareReport, request: Request, opts: ManifestOptions, home: Home,
             progress: ProgressCallback = null_progress) -> Tuple[Plan, Manifests, bool]:
    """The plan, the manifests it came from, and whether the build had to be made locally."""
    manifests = load_manifests(opts, home)
    plan = resolve(report, request, manifests)
    built = False
    if request.stack == "ggml" and not plan.ok and opts.allow_build and not plan.artifacts:
        progress(ProgressEvent("message", "plan", message="no published build fits; building one from source"))
        manifests = local_build_manifests(report, plan, manifests, progress)
        plan = resolve(report, request, manifests)
        plan.notes.append("built locally from the stable-diffusion-cpp-python source (no published build fits this machine)")
        built = True
    return plan, manifests, built


def _manifest_of(plan: Plan, manifests: Manifests) -> Tuple[str, int]:
    for m in manifests.ggml:
        for t in m.targets:
            if t.id == plan.variant:
                return m.envelope.source, m.envelope.version
    return "", 0


def install(report: HardwareReport, request: Request, opts: ManifestOptions, home: Home, *, force: bool = False,
            dry_run: bool = False, wait: float = 0.0, check=ggml_rt.import_check,
            progress: ProgressCallback = null_progress) -> InstallSummary:
    """The first-run flow for the ggml stack: plan, fetch, install, check, activate."""
    if request.stack != "ggml":
        raise UsageError("install() is for the ggml stack; use install_torch_runtime() for torch")
    home.ensure()
    with home.lock("install", wait=wait):
        recovered = ggml_rt.recover(home)
        t0 = time.perf_counter()
        plan, manifests, built = plan_for(report, request, opts, home, progress)
        t_plan = time.perf_counter() - t0
        if not plan.ok:
            raise AccelstackError(f"nothing to install: {plan.summary}", hint="; ".join(plan.conflicts) or "run `accelstack plan --stack ggml` for the reasons")
        rid = ggml_rt.runtime_id(plan)
        if dry_run:
            return InstallSummary("ggml", rid, changed=False, plan=plan, recovered=recovered, built_locally=built)
        source, version = _manifest_of(plan, manifests)
        outcome = ggml_rt.install_ggml(
            plan, home, manifest_source=source, manifest_version=version,
            hardware_fingerprint=hardware_fingerprint(report), check=check, offline=opts.offline,
            force=force, progress=progress,
        )
        if opts.urls:
            remember_manifests(home, opts.urls)
        timings = {"plan": t_plan, **outcome.timings}
        return InstallSummary("ggml", rid, outcome.changed, plan, outcome.receipt, outcome.previous, timings, recovered, built)


@dataclass
class StackStatus:
    stack: str
    active: str = ""
    previous: str = ""
    receipt: Optional[Receipt] = None
    installed: List[str] = field(default_factory=list)
    hardware_matches: Optional[bool] = None
    upgrade_available: str = ""  # runtime id the current plan would install, when different
    problems: List[str] = field(default_factory=list)


def status(report: Optional[HardwareReport], home: Home, opts: Optional[ManifestOptions] = None) -> List[StackStatus]:
    """What is installed and active, and whether it still fits this machine."""
    out: List[StackStatus] = []
    state = home.read_active()
    ids = home.receipt_ids()
    for stack in ("ggml", "torch"):
        st = StackStatus(stack=stack, active=state.active.get(stack, ""), previous=state.previous.get(stack, ""))
        for rid in ids:
            try:
                r = home.read_receipt(rid)
            except StateError as exc:
                st.problems.append(exc.message)
                continue
            if r.stack == stack:
                st.installed.append(rid)
                if rid == st.active:
                    st.receipt = r
        if st.active and st.receipt is None:
            st.problems.append(f"the active runtime {st.active} has no readable receipt; run `accelstack repair`")
        if st.receipt and report is not None:
            st.hardware_matches = st.receipt.hardware_fingerprint == hardware_fingerprint(report)
            if not st.hardware_matches:
                st.problems.append("the hardware or driver changed since this runtime was installed; run `accelstack upgrade` to re-plan")
        if stack == "ggml" and st.receipt and report is not None and opts is not None and opts.urls:
            try:
                plan = resolve(report, Request(stack="ggml", backend=st.receipt.plan.get("request", {}).get("backend", "")), load_manifests(opts, home))
                if plan.ok and ggml_rt.runtime_id(plan) != st.active:
                    st.upgrade_available = ggml_rt.runtime_id(plan)
            except AccelstackError as exc:
                st.problems.append(f"could not check for upgrades: {exc.message}")
        out.append(st)
    return out


def repair(home: Home, *, check=ggml_rt.import_check, offline: Optional[bool] = None, wait: float = 0.0,
           progress: ProgressCallback = null_progress) -> ggml_rt.RepairReport:
    home.ensure()
    with home.lock("repair", wait=wait):
        ggml_rt.recover(home)
        state = home.read_active()
        rid = state.active.get("ggml")
        if not rid:
            raise StateError("no ggml runtime is active, so there is nothing to repair", hint="run `accelstack install`")
        return ggml_rt.repair_ggml(home, rid, check=check, offline=offline, progress=progress)


def upgrade(report: HardwareReport, request: Request, opts: ManifestOptions, home: Home, **kw) -> InstallSummary:
    """Install the newest plan side by side, verify it, switch; the old one stays for rollback."""
    if not opts.urls:
        opts.urls = remembered_manifests(home)
    return install(report, request, opts, home, **kw)


def rollback(home: Home, stack: str = "ggml", wait: float = 0.0) -> Active:
    home.ensure()
    with home.lock("rollback", wait=wait):
        ggml_rt.recover(home)
        state = home.read_active()
        prev = state.previous.get(stack)
        if not prev:
            raise StateError(f"there is no previous {stack} runtime to go back to", hint="`accelstack status` lists what is installed")
        if not ggml_rt._intact(home, stack, prev):
            raise StateError(f"the previous runtime {prev} is no longer complete", hint="reinstall it with `accelstack install`")
        current = state.active.get(stack, "")
        state.active[stack] = prev
        if current:
            state.previous[stack] = current
        home.write_active(state)
        return state


def uninstall(home: Home, stack: str = "ggml", wait: float = 0.0) -> List[str]:
    """Remove every runtime of ``stack`` (ggml runtime dirs; torch receipts only, never the user's env)."""
    home.ensure()
    removed: List[str] = []
    with home.lock("uninstall", wait=wait):
        ggml_rt.recover(home)
        state = home.read_active()
        state.active.pop(stack, None)
        state.previous.pop(stack, None)
        home.write_active(state)  # first unpoint, then delete: a crash leaves only garbage
        for rid in home.receipt_ids():
            try:
                r = home.read_receipt(rid)
            except StateError:
                continue
            if r.stack == stack:
                ggml_rt.remove_runtime(home, stack, rid)
                removed.append(rid)
        if home.runtimes(stack).is_dir():
            for leftover in home.runtimes(stack).iterdir():
                shutil.rmtree(leftover, ignore_errors=True)
    return removed


@dataclass
class GcReport:
    runtimes_removed: List[str] = field(default_factory=list)
    blobs_removed: List[str] = field(default_factory=list)
    bytes_freed: int = 0


def gc(home: Home, cache_dir: Optional[Path] = None, wait: float = 0.0) -> GcReport:
    """Remove inactive runtimes (keeping the previous one for rollback) and unreferenced cache blobs."""
    from ..artifacts import Cache

    out = GcReport()
    home.ensure()
    with home.lock("gc", wait=wait):
        ggml_rt.recover(home)
        state = home.read_active()
        keep = set(state.active.values()) | set(state.previous.values())
        referenced = set()
        for rid in home.receipt_ids():
            try:
                r = home.read_receipt(rid)
            except StateError:
                continue
            if rid in keep:
                referenced |= {a["sha256"] for a in r.artifacts}
                continue
            size = sum(f.size for f in r.files)
            ggml_rt.remove_runtime(home, r.stack, rid)
            out.runtimes_removed.append(rid)
            out.bytes_freed += size
        for stack_dir in (home.root / "runtimes").glob("*"):
            for d in stack_dir.iterdir():
                if d.name not in keep and not home.receipt_path(d.name).exists():
                    shutil.rmtree(d, ignore_errors=True)
                    out.runtimes_removed.append(d.name)
        cache = Cache(cache_dir)
        if cache.blob_dir.is_dir():
            for blob in cache.blob_dir.iterdir():
                if len(blob.name) == 64 and blob.name not in referenced:
                    out.bytes_freed += blob.stat().st_size
                    blob.unlink()
                    out.blobs_removed.append(blob.name)
    return out
