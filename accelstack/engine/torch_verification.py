"""``verify_torch``: run the torch check in the target interpreter and give a :class:`VerifyReport`.

The check itself (:mod:`accelstack.engine.torch_check`) runs as a script in the interpreter that
has torch, with a timeout; this module starts it and reads its one JSON line. A torch that does
not work gives ``ok=False`` with the reason (a crash, a timeout, a missing torch are verdicts);
the raw per-operation results are kept in ``details``.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..events import ProgressCallback, ProgressEvent, null_progress
from ..serde import to_dict
from ..verdict import VerifyCheck, VerifyReport
from . import torch_check
from .protocol import DeviceInfo

__all__ = ["verify_torch", "torch_check_details", "TorchCheckDetails", "TorchOp", "DEFAULT_TIMEOUT"]

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
    """What the torch check script found, field by field (``VerifyReport.details`` holds it as a dict)."""

    ok: bool
    reason: str
    python: str
    torch_version: str = ""
    cuda_version: Optional[str] = None
    hip_version: Optional[str] = None
    device_kind: str = ""
    device_name: str = ""
    rejected: Dict[str, str] = field(default_factory=dict)
    ops: List[TorchOp] = field(default_factory=list)
    diffusers: Dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def verdict(self) -> str:
        return "PASS" if self.ok else "FAIL"


def torch_check_details(python: Optional[str] = None, env: Optional[Dict[str, str]] = None,
                        probe: Optional[str] = None, device: Optional[str] = None,
                        timeout: float = DEFAULT_TIMEOUT) -> TorchCheckDetails:
    """Run the check script in ``python`` (default: this interpreter) with ``env`` added to ours,
    for at most ``timeout`` seconds. Failures are results, never exceptions."""
    exe = python or sys.executable
    cmd = [exe, str(Path(torch_check.__file__).resolve())]
    if probe:
        cmd += ["--probe", str(probe)]
    if device:
        cmd += ["--device", device]
    full_env = dict(os.environ)
    full_env.update(env or {})
    start = time.perf_counter()
    log.info("torch check: starting %s (timeout %.0f s)", " ".join(cmd), timeout)
    try:
        res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        log.warning("torch check: %s ran past %.0f s and was killed", exe, timeout)
        return TorchCheckDetails(ok=False, reason=f"the torch check did not finish within {timeout:.0f} s", python=exe,
                                 seconds=round(time.perf_counter() - start, 3))
    except OSError as exc:
        return TorchCheckDetails(ok=False, reason=f"cannot run {exe}: {exc.strerror or exc}", python=exe)
    log.info("torch check: %s exited with code %d", exe, res.returncode)
    line = next((ln for ln in reversed(res.stdout.splitlines()) if ln.startswith(torch_check.RESULT_MARK)), None)
    if line is None:
        tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
        return TorchCheckDetails(ok=False, reason=f"the torch check crashed (exit code {res.returncode}): "
                                 + " | ".join(tail), python=exe, seconds=round(time.perf_counter() - start, 3))
    data = json.loads(line[len(torch_check.RESULT_MARK):])
    ops = [TorchOp(name=o["name"], ok=bool(o.get("ok")), tolerance=o.get("tolerance", 0.0), error=o.get("error"),
                   seconds=o.get("seconds"), detail=o.get("detail", "")) for o in data.get("ops", [])]
    return TorchCheckDetails(ok=bool(data.get("ok")), reason=data.get("reason", ""), python=exe,
                             torch_version=data.get("torch_version", ""), cuda_version=data.get("cuda_version"),
                             hip_version=data.get("hip_version"), device_kind=data.get("device_kind", ""),
                             device_name=data.get("device_name", ""), rejected=data.get("rejected", {}), ops=ops,
                             diffusers=data.get("diffusers", {}), seconds=round(time.perf_counter() - start, 3))


def verify_torch(python: Optional[str] = None, env: Optional[Dict[str, str]] = None, probe: Optional[str] = None,
                 device: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT,
                 progress: ProgressCallback = null_progress) -> VerifyReport:
    """Check the torch in ``python`` (default: this interpreter): the best device computes the
    workload like the CPU does, and, with ``probe`` (a probe model folder) and diffusers
    installed, one pipeline step gives a finite, non-constant image."""
    progress(ProgressEvent("start", "verify", task="torch"))
    found = torch_check_details(python, env, probe, device, timeout)
    report = to_verify_report(found, probe)
    progress(ProgressEvent("end", "verify", task="torch", ok=report.ok, message=report.reason))
    return report


def to_verify_report(found: TorchCheckDetails, probe: Optional[str] = None) -> VerifyReport:
    """The :class:`VerifyReport` of a torch check: one check per operation (and the pipeline step)."""
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
    if not found.ok and not any(not c.ok for c in checks):
        checks.insert(0, VerifyCheck("import" if not found.torch_version else "device", False, found.reason))
    kind = found.device_kind
    device = DeviceInfo(name=kind, description=found.device_name, kind="cpu" if kind == "cpu" else "gpu") if kind else None
    ran = bool(step.get("ran"))
    return VerifyReport(
        ok=found.ok, reason=found.reason, runtime=found.python, backend=kind, check="torch", device=device, checks=checks,
        load_seconds=step.get("load_seconds") if ran else None, step_seconds=step.get("step_seconds") if ran else None,
        total_seconds=found.seconds, probe_path=str(probe or ""), details=to_dict(found))
