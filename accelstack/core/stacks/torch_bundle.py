"""torch's part of offline bundles: the torch plan's wheels, downloaded with pip for the target,
hashed into the index, and installed with ``pip --no-index --require-hashes`` (see
:mod:`accelstack.core.bundle_file` for the file itself)."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ...artifacts.errors import HashMismatchError
from ...domain import Stack
from ...errors import Action, UsageError
from ...events import ProgressCallback, ProgressEvent
from ...hardware.report import HardwareReport
from ...installer.errors import TorchInstallError
from ...installer.pip_commands import download_commands, hashed_requirements, local_install_command, wheel_pin
from ...installer.pip_runner import run_pip
from ...installer.torch_destination import PipCommands
from ...installer.transaction import Provenance, Verifier
from ...settings import Settings
from ..bundle_file import (
    FORMAT,
    FORMAT_VERSION,
    INDEX,
    MAX_BUNDLE_MEMBERS,
    BundleError,
    BundleSummary,
    OpenedBundle,
    sha256_of,
    write_bundle,
)
from ..detection import detect
from ..planning import hardware_fingerprint, plan, target_version
from ..results import InstallSummary
from .torch_pip import pip_transaction

__all__ = ["create", "install_from", "read_index"]

STACK: Stack = "torch"


@dataclass
class _TorchIndex:
    """The parts of a torch bundle's index the install uses, checked (the index is hostile input)."""

    variant: str
    torch_version: str
    requirements: List[str]
    python: str
    wheels: List[Tuple[str, str, int]]  # file name, sha256, size


def read_index(index: dict, what: str) -> _TorchIndex:
    def bad(why: str) -> BundleError:
        return BundleError(f"{what}: the torch bundle's index is not valid ({why})", "make the bundle again")

    raw_plan = index.get("plan")
    plan_doc: dict = raw_plan if isinstance(raw_plan, dict) else {}
    texts = {k: plan_doc.get(k) for k in ("variant", "torch_version")}
    if not all(isinstance(v, str) and 0 < len(v) <= 64 for v in texts.values()):
        raise bad("no plan variant or torch version")
    reqs = plan_doc.get("requirements", [])
    if not isinstance(reqs, list) or len(reqs) > 64 or not all(isinstance(r, str) and len(r) <= 200 for r in reqs):
        raise bad("requirements")
    python = index.get("python")
    if not isinstance(python, str) or not re.match(r"^3\.[0-9]{1,2}\Z", python):
        raise bad("python version")
    raw = index.get("wheels")
    if not isinstance(raw, list) or not raw or len(raw) > MAX_BUNDLE_MEMBERS:
        raise bad("no wheels")
    wheels: List[Tuple[str, str, int]] = []
    for w in raw:
        if not isinstance(w, dict) or not isinstance(w.get("name"), str) or not isinstance(w.get("sha256"), str) \
                or not re.match(r"^[0-9a-f]{64}\Z", w["sha256"]) or not isinstance(w.get("size"), int) or w["size"] < 0:
            raise bad("a wheel entry")
        try:
            wheel_pin(w["name"])
        except TorchInstallError as exc:
            raise bad(exc.message) from None
        wheels.append((w["name"], w["sha256"], w["size"]))
    if len({w[0] for w in wheels}) != len(wheels) or len({w[1] for w in wheels}) != len(wheels):
        raise bad("a wheel is listed twice")
    return _TorchIndex(str(texts["variant"]), str(texts["torch_version"]), list(reqs), python, wheels)



def create(out: Path, s: Settings, backends: Sequence[str], report: Optional[HardwareReport],
                  requirements: Sequence[str], python_version: str, platforms: Sequence[str],
                  progress: ProgressCallback) -> BundleSummary:
    """The torch plan's wheels, downloaded with pip for the target, hashed into the index."""
    if len(backends) > 1:
        raise UsageError("a torch bundle holds one torch build", "give at most one --backend (or variant, such as cu126)")
    t0 = time.perf_counter()
    report = report if report is not None else detect(settings=s)
    version = python_version or target_version(s)
    if not re.match(r"^3\.[0-9]{1,2}\Z", version):
        raise UsageError(f"{version!r} is not a Python version such as 3.11")
    p = plan(report, STACK, requirements=requirements, backend=backends[0] if backends else None, python=version,
             settings=s)
    if not p.ok:
        raise BundleError(f"no torch build fits: {p.summary}", "; ".join(p.conflicts) or "choose the backend of the machine "
                          "the bundle is for (--backend)", action=Action.EXPLAIN_PLAN)
    timings = {"plan": time.perf_counter() - t0}
    s.cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".bundle-wheels-", dir=str(s.cache)))
    try:
        t0 = time.perf_counter()
        for argv in download_commands(p, work, version, platforms, index_url=s.index_url,
                                      extra_index_urls=s.extra_index_urls):
            # offline: only the wheels pip's find-links directories hold (a local mirror)
            run_pip(argv + (["--no-index"] if s.offline else []), s.timeouts.pip, progress, "nothing was written",
                    stage="bundle", proxied=s.proxied)
        timings["download"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        wheels: List[Dict[str, Any]] = []
        for f in sorted(work.iterdir()):
            wheel_pin(f.name)  # pip with --only-binary writes wheels only; anything else is refused here
            wheels.append({"name": f.name, "sha256": sha256_of(f), "size": f.stat().st_size})
        if not wheels or len(wheels) >= MAX_BUNDLE_MEMBERS or len({w["sha256"] for w in wheels}) != len(wheels):
            raise BundleError(f"pip downloaded {len(wheels)} files for the plan, which a bundle cannot hold "
                              "(none, too many, or two with the same bytes)", "run the plan's pip command by hand to see why",
                              action=Action.REPORT_BUG)
        hashed_requirements([(w["name"], w["sha256"]) for w in wheels])  # one version per project, or refuse now
        timings["hash"] = time.perf_counter() - t0
        index = {"format": FORMAT, "version": FORMAT_VERSION, "stack": STACK,
                 "plan": {"summary": p.summary, "backend": p.backend, "variant": p.variant, "torch_version": p.torch_version,
                          "packages": list(p.packages), "index_url": p.index_url,
                          "requirements": list(p.request.requirements)},
                 "python": version, "platforms": list(platforms), "wheels": wheels}
        t0 = time.perf_counter()
        progress(ProgressEvent("message", "bundle", message=f"writing {out}"))
        size, digest = write_bundle(out, [(INDEX, (json.dumps(index, indent=2) + "\n").encode())],
                                    [(f"artifacts/{w['sha256']}", work / w["name"]) for w in wheels])
        timings["write"] = time.perf_counter() - t0
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return BundleSummary(str(out), STACK, "", "pip", 0, [p.variant], [w["name"] for w in wheels], size, timings, digest,
                         version)


def install_from(opened: OpenedBundle, what: str, report: HardwareReport, s: Settings, verifier: Verifier,
                 progress: ProgressCallback, read_seconds: float) -> InstallSummary:
    """A torch bundle into the torch target: plan again here (it must be the bundle's variant), every
    wheel's sha256 checked, then pip with no index and ``--require-hashes``, checked as online."""
    ti = read_index(opened.index, what)
    here = target_version(s)
    if here != ti.python:
        raise BundleError(f"{what} holds wheels for Python {ti.python}; the torch target here is Python {here}",
                          f"install into a Python {ti.python} environment (--venv made with Python {ti.python}, or --python), "
                          f"or make the bundle with --python-version {here}", action=Action.FIX_INPUT)
    p = plan(report, STACK, requirements=ti.requirements, backend=ti.variant, python=ti.python, settings=s)
    if not p.ok or p.variant != ti.variant or p.torch_version != ti.torch_version:
        raise BundleError(f"{what} holds torch {ti.torch_version} ({ti.variant}), which does not fit here: {p.summary}",
                          "make a bundle for this machine (bundle create --backend ...)", action=Action.EXPLAIN_PLAN)
    t0 = time.perf_counter()
    opened.extract({sha: size for _, sha, size in ti.wheels})  # the wheels the index names, each at its size
    wheels = opened.root / "wheels"
    wheels.mkdir()
    for name, sha, size in ti.wheels:
        src = opened.artifacts.get(sha)
        if src is None:
            raise BundleError(f"{what} lacks the wheel {name}", "make the bundle again")
        actual = sha256_of(src)
        if actual != sha or src.stat().st_size != size:
            raise HashMismatchError(f"the bundled wheel {name} does not hash to the sha256 its index gives",
                                    expected=sha, actual=actual, hint="the bundle was damaged or altered; make it again")
        os.replace(src, wheels / name)
    requirements = opened.root / "requirements.txt"
    requirements.write_text(hashed_requirements([(n, sha) for n, sha, _ in ti.wheels]), encoding="utf-8")
    command = local_install_command(wheels, requirements)
    p = dataclasses.replace(p, commands=[command], uv_commands=[],
                            notes=[*p.notes, f"installed from the offline bundle {what}"])
    checked = time.perf_counter() - t0
    provenance = Provenance(f"bundle:{Path(what).name}", 0, hardware_fingerprint(report))
    return pip_transaction(p, PipCommands([command]), s, verifier, provenance, progress,
                           {"bundle read": read_seconds, "bundle check": checked})
