"""Install a ggml runtime transactionally: fetch -> verify -> stage -> check -> rename -> switch.

A runtime is the ``stable-diffusion-cpp-python`` wheel of one backend variant, installed with
``pip --target`` (no deps, no index, hash pinned) into its own directory. The sequence below is
the whole transaction; a crash at any point leaves the previous runtime active:

1. fetch the wheel into the content-addressed cache (resumable, hash-checked);
2. ``pip install`` it into ``staging/<id>.<pid>`` (nothing live is touched);
3. hash every installed file, run the quick check (the library loads in a fresh process);
4. write the receipt, rename the staging dir to ``runtimes/ggml/<id>`` (atomic, same filesystem);
5. replace ``active.json`` atomically.

``recover`` runs before every change: it removes leftover staging dirs and points ``active`` back
at an intact runtime if it names a missing or incomplete one.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

from ..artifacts import ArtifactRef, fetch
from ..artifacts.cache import hash_file
from ..errors import AccelstackError
from ..events import ProgressCallback, ProgressEvent, null_progress
from ..manifests.plan import Plan
from ..serde import to_dict
from .state import Home, InstalledFile, Receipt, StateError, now_iso

STACK = "ggml"
QuickCheck = Callable[[Path, Dict[str, str], str], Dict[str, object]]  # (runtime dir, env, backend) -> result


class InstallError(AccelstackError):
    """The install could not complete; the previous runtime is still active."""


@dataclass
class InstallOutcome:
    receipt: Receipt
    changed: bool  # False: it was already installed and active (a no-op)
    timings: Dict[str, float] = field(default_factory=dict)  # seconds per step
    previous: str = ""


def runtime_id(plan: Plan) -> str:
    """Content-derived: the same artifacts always give the same id (a re-run is recognisable)."""
    digest = hashlib.sha256("".join(sorted(a.sha256 for a in plan.artifacts)).encode()).hexdigest()[:12]
    name = (plan.variant or plan.backend or "ggml").replace("/", "-").replace(" ", "-")
    return f"{name}-{digest}"


def hash_tree(root: Path) -> List[InstalledFile]:
    out: List[InstalledFile] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for fn in filenames:
            p = Path(dirpath) / fn
            if p.is_symlink():
                continue
            out.append(InstalledFile(path=p.relative_to(root).as_posix(), sha256=hash_file(p).hexdigest(), size=p.stat().st_size))
    return sorted(out, key=lambda f: f.path)


def import_check(runtime: Path, env: Dict[str, str], backend: str = "cpu") -> Dict[str, object]:
    """The minimal check: the bindings import and their native library loads, in a fresh process.

    The CLI uses the engine's full ``verify`` (a real generation) instead; this one serves library
    callers that cannot afford a generation.
    """
    code = (
        "import json, stable_diffusion_cpp as s, stable_diffusion_cpp.stable_diffusion_cpp as lib;"
        "print(json.dumps({'version': getattr(s, '__version__', ''), 'system_info': "
        "(lib.sd_get_system_info() or b'').decode('utf-8', 'replace').strip()}))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env, "PYTHONPATH": str(runtime)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        raise InstallError(f"the installed runtime does not load: {last}", hint="the build may not match this machine; run `accelstack plan` to see why it was chosen")
    try:
        info = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        info = {}
    return {"check": "import", "ok": True, **info}


def pip_install_wheel(wheel: Path, sha256: str, target: Path, name: str) -> None:
    """pip --target with --no-deps --no-index and the hash pinned (pip re-checks the bytes)."""
    with tempfile.TemporaryDirectory() as tmp:
        link = Path(tmp) / name  # pip needs the wheel's real file name; the cache stores blobs by hash
        try:
            os.link(wheel, link)
        except OSError:
            shutil.copyfile(wheel, link)
        req = Path(tmp) / "requirements.txt"
        req.write_text(f"{link} --hash=sha256:{sha256}\n")
        res = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-deps", "--no-index",
             "--no-compile", "--require-hashes", "--target", str(target), "-r", str(req)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    if res.returncode != 0:
        tail = "\n".join(res.stdout.strip().splitlines()[-8:])
        if "No space left" in res.stdout:
            raise InstallError(f"the disk is full while installing {name}", hint="free some disk space and run the install again; nothing was changed")
        raise InstallError(f"pip could not install {name}:\n{tail}", hint="nothing was changed; run with ACCELSTACK_DEBUG=1 for details")


def recover(home: Home) -> List[str]:
    """Undo what a killed install left behind; returns what it did, for the caller to report."""
    done: List[str] = []
    if home.staging.is_dir():
        for leftover in home.staging.iterdir():
            shutil.rmtree(leftover, ignore_errors=True)
            done.append(f"removed unfinished install {leftover.name}")
    state = home.read_active()
    changed = False
    for stack, rid in list(state.active.items()):
        if _intact(home, stack, rid):
            continue
        prev = state.previous.get(stack)
        if prev and _intact(home, stack, prev):
            state.active[stack] = prev
            state.previous.pop(stack, None)
            done.append(f"{stack}: active runtime {rid} was incomplete; went back to {prev}")
        else:
            state.active.pop(stack)
            done.append(f"{stack}: active runtime {rid} was incomplete and nothing to go back to")
        changed = True
    if changed:
        home.write_active(state)
    return done


def _intact(home: Home, stack: str, rid: str) -> bool:
    if stack == "torch":
        return home.receipt_path(rid).is_file()
    return home.runtime_dir(stack, rid).is_dir() and home.receipt_path(rid).is_file()


def install_ggml(
    plan: Plan,
    home: Home,
    *,
    manifest_source: str = "",
    manifest_version: int = 0,
    hardware_fingerprint: str = "",
    check: QuickCheck = import_check,
    cache=None,
    offline: Optional[bool] = None,
    force: bool = False,
    activate: bool = True,
    progress: ProgressCallback = null_progress,
) -> InstallOutcome:
    """Install the plan's artifacts as a runtime and make it active. Caller holds the home lock."""
    import time

    if plan.stack != STACK:
        raise InstallError(f"this plan is for the {plan.stack} stack, not ggml")
    wheels = [a for a in plan.artifacts if a.name.endswith(".whl")]
    if not plan.ok or len(wheels) != 1:
        raise InstallError(
            f"the plan has no installable ggml build ({plan.summary})",
            hint="pass --manifest with a manifest that has a build for this machine, or let accelstack build one (`accelstack install --build`)",
        )
    ref = wheels[0]
    rid = runtime_id(plan)
    home.ensure()
    recover(home)
    active = home.read_active()
    final = home.runtime_dir(STACK, rid)
    timings: Dict[str, float] = {}

    if not force and _intact(home, STACK, rid):
        receipt = home.read_receipt(rid)
        previous = active.active.get(STACK, "")
        if activate and previous != rid:
            home.set_active(STACK, rid)
            return InstallOutcome(receipt, changed=True, previous=previous)
        return InstallOutcome(receipt, changed=False)

    t = time.perf_counter()
    progress(ProgressEvent("message", "install", message=f"fetching {ref.name}"))
    paths = fetch([ref], cache=cache, progress=progress, offline=offline)
    timings["fetch"] = time.perf_counter() - t

    stage = home.staging / f"{rid}.{os.getpid()}"
    try:
        t = time.perf_counter()
        progress(ProgressEvent("start", "install", task=rid, message=f"installing {ref.name} into staging"))
        pip_install_wheel(paths[ref.sha256], ref.sha256, stage, ref.name)
        timings["unpack"] = time.perf_counter() - t
        t = time.perf_counter()
        files = hash_tree(stage)
        timings["hash"] = time.perf_counter() - t
        t = time.perf_counter()
        progress(ProgressEvent("message", "install", task=rid, message="checking that the runtime loads"))
        result = check(stage, dict(plan.env), plan.backend)
        timings["check"] = time.perf_counter() - t
        receipt = Receipt(
            id=rid,
            stack=STACK,
            backend=plan.backend,
            path=str(final),
            plan=to_dict(plan),
            manifest_source=manifest_source,
            manifest_version=manifest_version,
            artifacts=[to_dict(a) for a in plan.artifacts],
            files=files,
            hardware_fingerprint=hardware_fingerprint,
            env=dict(plan.env),
            installed_at=now_iso(),
            verified_at=now_iso(),
            verification=result,
        )
        home.write_receipt(receipt)
        if final.exists():  # a forced reinstall over an inactive or damaged copy
            shutil.rmtree(final)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(stage, final)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        if not final.is_dir():
            try:
                home.receipt_path(rid).unlink()
            except OSError:
                pass
        raise
    previous = active.active.get(STACK, "")
    if activate:
        home.set_active(STACK, rid)
    progress(ProgressEvent("end", "install", task=rid, ok=True, message=f"runtime {rid} installed"))
    return InstallOutcome(receipt, changed=True, timings=timings, previous=previous)


@dataclass
class RepairReport:
    runtime: str
    checked: int = 0
    missing: List[str] = field(default_factory=list)
    corrupt: List[str] = field(default_factory=list)
    fixed: List[str] = field(default_factory=list)
    verification: Dict[str, object] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        return not self.missing and not self.corrupt


def audit(home: Home, rid: str) -> RepairReport:
    """Re-hash every installed file against the receipt."""
    receipt = home.read_receipt(rid)
    root = Path(receipt.path)
    report = RepairReport(runtime=rid)
    for f in receipt.files:
        p = root / f.path
        report.checked += 1
        if not p.is_file():
            report.missing.append(f.path)
            continue
        if hash_file(p).hexdigest() != f.sha256:
            report.corrupt.append(f.path)
    return report


def repair_ggml(home: Home, rid: str, *, check: QuickCheck = import_check, cache=None, offline: Optional[bool] = None,
                progress: ProgressCallback = null_progress) -> RepairReport:
    """Replace only the missing or corrupt files (from a fresh staging install), then re-check."""
    report = audit(home, rid)
    receipt = home.read_receipt(rid)
    root = Path(receipt.path)
    if not report.healthy:
        refs = [ArtifactRef(**a) for a in receipt.artifacts]
        wheel = next((r for r in refs if r.name.endswith(".whl")), None)
        if wheel is None:
            raise StateError(f"the receipt of {rid} names no wheel to repair from", hint="reinstall with `accelstack install --force`")
        paths = fetch([wheel], cache=cache, progress=progress, offline=offline)
        stage = home.staging / f"repair-{rid}.{os.getpid()}"
        try:
            pip_install_wheel(paths[wheel.sha256], wheel.sha256, stage, wheel.name)
            expected = {f.path: f.sha256 for f in receipt.files}
            for rel in report.missing + report.corrupt:
                src = stage / rel
                if not src.is_file() or hash_file(src).hexdigest() != expected[rel]:
                    raise StateError(f"cannot restore {rel}: the artifact no longer produces it", hint="reinstall with `accelstack install --force`")
                dest = root / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                tmp = dest.with_name(f".{dest.name}.repair")
                shutil.copy2(src, tmp)
                os.replace(tmp, dest)
                report.fixed.append(rel)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    report.verification = check(root, dict(receipt.env), receipt.backend)
    receipt.verified_at = now_iso()
    receipt.verification = report.verification
    home.write_receipt(receipt)
    return report


def remove_runtime(home: Home, stack: str, rid: str) -> None:
    """Delete an inactive runtime: receipt first, so a crash leaves only a stray directory for gc."""
    home.receipt_path(rid).unlink(missing_ok=True)
    shutil.rmtree(home.runtime_dir(stack, rid), ignore_errors=True)
