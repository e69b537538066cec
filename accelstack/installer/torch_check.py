"""What imports in a torch target interpreter: the cheap post-install check (torch imports, is the
planned build, sees the device, has kernels for it) and whether the torch engine's own packages
are there before a torch worker starts. (The workload ``verify`` runs on the device is the
engine's: :mod:`accelstack.engine.verification.torch_check`.)
"""
from __future__ import annotations

import shlex
import sys
import time
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from ..events import ProgressCallback
from ..manifests.plan import Plan
from ..manifests.request import TORCH_FAMILY
from ..manifests.torch_matrix import ENGINE_PACKAGES
from ..manifests.torch_resolve import engine_command
from ..verdict import DeviceInfo, VerifyCheck, VerifyReport
from .errors import TorchEngineMissingError, TorchMissingError
from .pip_runner import run_json
from .torch_scripts import CHECK_SCRIPT, ENGINE_SCRIPT
from .transaction import StagedRuntime

__all__ = ["import_check", "engine_modules", "check_engine", "require_torch"]


def import_check(staged: StagedRuntime, progress: ProgressCallback, timeout: float = 300) -> VerifyReport:
    """The cheap check (no generation): torch imports in the target interpreter, is the planned
    build, sees the planned device, and has kernels for the GPU's architecture."""
    plan: Plan = staged.handle.plan if staged.handle is not None else None  # type: ignore[assignment]
    backend = staged.backend
    t0 = time.perf_counter()
    engine = engine_modules(plan) if plan is not None else []
    info = run_json(staged.python or str(staged.path), CHECK_SCRIPT, {"backend": backend, "engine": engine}, timeout)
    ok, reason = _judge(info, backend, plan.torch_version if plan is not None else "")
    broken = info.get("engine_errors")
    if ok and isinstance(broken, dict) and broken:
        ok, reason = False, ("the torch engine's packages do not import: "
                             + "; ".join(f"{m} ({why})" for m, why in sorted(broken.items())))
    dev = DeviceInfo(name=str(info.get("device", backend)), kind="cpu" if backend == "cpu" else "gpu")
    return VerifyReport(ok=ok, reason="" if ok else reason, runtime=str(staged.path), backend=backend, check="import",
                        device=dev, checks=[VerifyCheck("torch", ok, reason)], total_seconds=round(time.perf_counter() - t0, 4),
                        details={k: v for k, v in info.items() if k != "ok"})


def engine_modules(plan: Plan) -> List[str]:
    """The modules of the torch engine's packages the plan installs (none when it installs no engine)."""
    cmd = engine_command(plan)
    if cmd is None:
        return []
    names = []
    for arg in cmd.argv[4:] if cmd.tool == "pip" else []:
        try:
            name = canonicalize_name(Requirement(arg).name)
        except InvalidRequirement:
            continue
        if name not in TORCH_FAMILY and not name.startswith("torch-"):
            names.append(name.replace("-", "_"))
    return names


_ENGINE_NEEDED = tuple(req for req in ENGINE_PACKAGES if not req.startswith("accelerate"))


def require_torch(python: Optional[str], env: Optional[Mapping[str, str]] = None, timeout: float = 60) -> None:
    """Raise :class:`TorchMissingError` when torch cannot be found in ``python`` (None: this
    interpreter) with ``env``: said with the command that installs the torch stack before a worker
    starts or a probe is written, not as a failed worker or an empty device line after them."""
    exe = python or sys.executable
    missing = run_json(exe, ENGINE_SCRIPT, ["torch"], timeout, env).get("missing")
    if isinstance(missing, list) and missing:  # (the one module asked about)
        path = (env or {}).get("PYTHONPATH", "")
        raise TorchMissingError(f"torch is not installed for {exe}" + (f" (PYTHONPATH {path})" if path else "")
                                + ", so there is no torch runtime to use",
                                "install the torch stack (an environment with torch and the engine's packages), or pass "
                                "--runtime DIR naming a venv or a pip --target dir that has them", code="torch-missing")


def check_engine(python: str, timeout: float = 60, packages: Sequence[str] = _ENGINE_NEEDED,
                 env: Optional[Mapping[str, str]] = None) -> None:
    """Raise :class:`TorchEngineMissingError` naming every one of ``packages`` that ``python``
    cannot import, and the pip command that adds them; before a torch worker starts, so a person
    reads which packages are missing instead of a worker that failed to start. accelerate is not
    asked for by default: the engine runs without it (loading a model takes more memory)."""
    modules = {canonicalize_name(Requirement(p).name).replace("-", "_"): p for p in packages}
    info = run_json(python, ENGINE_SCRIPT, list(modules), timeout, env)
    found = info.get("missing")
    missing = [modules[m] for m in (found if isinstance(found, list) else []) if m in modules]
    if missing:
        names = ", ".join(Requirement(p).name for p in missing)
        command = " ".join([python, "-m", "pip", "install", *(shlex.quote(p) for p in missing)])
        raise TorchEngineMissingError(
            f"the torch runtime {python} lacks {names}, which generating images with torch needs; add them with: {command}",
            "install the torch stack again (it adds them), or run that pip command", code="torch-engine-missing")


def _judge(info: Dict[str, object], backend: str, want_version: str) -> Tuple[bool, str]:
    if not info.get("ok"):
        return False, f"torch does not import: {info.get('error', 'unknown error')}"
    got = str(info.get("torch", ""))
    if want_version and not got.startswith(want_version):
        return False, f"torch {got} is installed but the plan asked for {want_version}"
    if backend == "cuda" and not info.get("cuda"):
        return False, f"torch {got} is not a CUDA build (torch.version.cuda is empty)"
    if backend == "rocm" and not info.get("hip"):
        return False, f"torch {got} is not a ROCm build (torch.version.hip is empty)"
    if backend in ("cuda", "rocm", "xpu", "mps", "directml") and not info.get("available"):
        return False, f"torch {got} cannot use the {backend} device here"
    arch = str(info.get("device_arch", ""))
    archs = info.get("arch_list")
    if arch and isinstance(archs, list) and arch not in [str(a) for a in archs]:
        return False, f"torch {got} has no kernels for {arch} (\"no kernel image is available\"); it was built for {archs}"
    return True, f"torch {got} works on {info.get('device', backend)}"

