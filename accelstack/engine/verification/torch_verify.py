"""``verify_torch``: run the torch check in the target interpreter and give a :class:`VerifyReport`.

The check itself (:mod:`accelstack.engine.verification.torch_check`) runs as a script in the interpreter that
has torch, with a timeout; this module starts it and reads its one JSON line. A torch that does
not work gives ``ok=False`` with the reason (a crash, a timeout, a missing torch are verdicts);
what only this check knows (versions, the device it picked, per-operation errors) is kept in
``details``, which :func:`torch_details` reads back as a :class:`TorchCheckDetails`.
"""
from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from ...events import ProgressCallback, ProgressEvent, null_progress
from ...serde import from_dict, to_dict
from ...settings import inherited_env
from ...verdict import VerifyCheck, VerifyReport
from ..worker.protocol import DeviceInfo
from . import torch_check

__all__ = ["verify_torch", "torch_details", "TorchCheckDetails", "TorchOp", "DEFAULT_TIMEOUT"]

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 900.0  # a first CUDA call may compile kernels for minutes


@dataclass
class TorchOp:
    """One operation of the workload, computed on the device and compared with the CPU."""

    name: str
    ok: bool
    tolerance: float
    error: Optional[float] = None
    seconds: Optional[float] = None
    detail: str = ""


@dataclass
class TorchCheckDetails:
    """What only the torch check knows; ``VerifyReport.details`` of a torch check holds it as a
    dict (the verdict, reason, interpreter and time are the report's own fields)."""

    torch_version: str = ""
    cuda_version: Optional[str] = None
    hip_version: Optional[str] = None
    device_kind: str = ""
    device_name: str = ""
    rejected: Dict[str, str] = field(default_factory=dict)
    ops: List[TorchOp] = field(default_factory=list)
    diffusers: Dict[str, Any] = field(default_factory=dict)


def torch_details(report: VerifyReport) -> TorchCheckDetails:
    """The torch-only part of a torch check's report, typed (for renderers)."""
    return from_dict(TorchCheckDetails, report.details)


def _run_check(exe: str, cmd: List[str], env: Dict[str, str], timeout: float,
               alive: Callable[[float], None] = lambda seconds: None) -> Tuple[Dict[str, Any], float]:
    """The check script's result (``ok``, ``reason`` and what it found) and the seconds it took;
    a crash, a timeout or a missing interpreter is a result with ``ok`` false. ``alive`` is
    called with the seconds so far about once a second while the check runs (torch imports
    and a diffusers step can take a minute: the caller shows that it is not stuck)."""
    start = time.perf_counter()
    log.info("torch check: starting %s (timeout %.0f s)", " ".join(cmd), timeout)
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    except OSError as exc:
        return {"ok": False, "reason": f"cannot run {exe}: {exc.strerror or exc}"}, 0.0
    while True:
        left = timeout - (time.perf_counter() - start)
        try:
            stdout, stderr = proc.communicate(timeout=max(0.01, min(1.0, left)))
            break
        except subprocess.TimeoutExpired:
            if time.perf_counter() - start >= timeout:
                proc.kill()
                proc.communicate()
                log.warning("torch check: %s ran past %.0f s and was killed", exe, timeout)
                return ({"ok": False, "reason": f"the torch check did not finish within {timeout:.0f} s"},
                        time.perf_counter() - start)
            alive(time.perf_counter() - start)
        except BaseException:  # interrupted: the check goes with us
            proc.kill()
            proc.communicate()
            raise
    log.info("torch check: %s exited with code %d", exe, proc.returncode)
    line = next((ln for ln in reversed(stdout.splitlines()) if ln.startswith(torch_check.RESULT_MARK)), None)
    if line is None:
        tail = (stderr or stdout).strip().splitlines()[-3:]
        return ({"ok": False, "reason": f"the torch check crashed (exit code {proc.returncode}): " + " | ".join(tail)},
                time.perf_counter() - start)
    return json.loads(line[len(torch_check.RESULT_MARK):]), time.perf_counter() - start


def verify_torch(python: Optional[str] = None, env: Optional[Dict[str, str]] = None, probe: Optional[str] = None,
                 device: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT,
                 progress: ProgressCallback = null_progress) -> VerifyReport:
    """Check the torch in ``python`` (default: this interpreter, with ``env`` added to our
    environment) for at most ``timeout`` seconds: the best device (or ``device``) computes the
    workload like the CPU does, and, with ``probe`` (a probe model folder) and diffusers
    installed, one pipeline step gives a finite, non-constant image. Failures are reports."""
    exe = python or sys.executable
    cmd = [exe, str(Path(torch_check.__file__).resolve())]
    if probe:
        cmd += ["--probe", str(probe)]
    if device:
        cmd += ["--device", device]
    task = "torch runtime"
    what = "torch operations" + (" and a diffusers step" if probe else "")
    progress(ProgressEvent("start", "verify", task=task, message=f"checking {what} on the best device"))

    def alive(seconds: float) -> None:
        progress(ProgressEvent("advance", "verify", task=task, message=f"checking {what}", extra={"elapsed": round(seconds, 1)}))

    data, seconds = _run_check(exe, cmd, inherited_env(**(env or {})), timeout, alive)
    report = to_verify_report(data, python=exe, seconds=seconds, probe=probe)
    progress(ProgressEvent("end", "verify", task=task, ok=report.ok, message=report.reason or f"PASS in {seconds:.1f} s"))
    return report


def to_verify_report(data: Mapping[str, Any], python: str, seconds: float, probe: Optional[str] = None) -> VerifyReport:
    """The :class:`VerifyReport` of the check script's result ``data``: one check per operation
    (and the pipeline step), the rest in ``details``."""
    found = TorchCheckDetails(
        torch_version=data.get("torch_version", ""), cuda_version=data.get("cuda_version"),
        hip_version=data.get("hip_version"), device_kind=data.get("device_kind", ""),
        device_name=data.get("device_name", ""), rejected=dict(data.get("rejected", {})), diffusers=dict(data.get("diffusers", {})),
        ops=[TorchOp(name=o["name"], ok=bool(o.get("ok")), tolerance=o.get("tolerance", 0.0), error=o.get("error"),
                     seconds=o.get("seconds"), detail=o.get("detail", "")) for o in data.get("ops", [])])
    ok, reason = bool(data.get("ok")), str(data.get("reason", ""))
    checks: List[VerifyCheck] = []
    if found.torch_version:
        checks.append(VerifyCheck("import", True, f"torch {found.torch_version}"))
        if found.device_kind:
            checks.append(VerifyCheck("device", True, f"{found.device_kind}: {found.device_name}"))
    for op in found.ops:
        detail = op.detail
        if op.ok and op.error is not None:
            detail = f"relative error {op.error:.2e} (tolerance {op.tolerance:g})"
        checks.append(VerifyCheck(op.name, op.ok, detail))
    step = found.diffusers
    if step:
        checks.append(VerifyCheck("diffusers", bool(step.get("ok")), str(step.get("detail", ""))))
    if not ok and not any(not c.ok for c in checks):
        checks.insert(0, VerifyCheck("import" if not found.torch_version else "device", False, reason))
    kind = found.device_kind
    device = DeviceInfo(name=kind, description=found.device_name, kind="cpu" if kind == "cpu" else "gpu") if kind else None
    ran = bool(step.get("ran"))
    return VerifyReport(
        ok=ok, reason=reason, runtime=python, backend=kind, check="torch", device=device, checks=checks,
        load_seconds=step.get("load_seconds") if ran else None, step_seconds=step.get("step_seconds") if ran else None,
        total_seconds=round(seconds, 3), probe_path=str(probe or ""), details=to_dict(found))
