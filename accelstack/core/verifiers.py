"""The checks a runtime must pass before it is activated, built from the engine for the installer.

The installer never imports the engine (it stands before it in the pipeline); the core hands it
one of these. The default is the real thing: a generation on the probe model (ggml) or torch
operations plus a diffusers step in the target interpreter (torch). ``import_verifier`` is the
cheap check (the library loads), for callers that explicitly cannot afford a generation.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional

from ..errors import SubprocessTimeout
from ..events import ProgressCallback, ProgressEvent
from ..installer.transaction import StagedRuntime, Verifier
from ..settings import Settings
from ..verdict import DeviceInfo, VerifyCheck, VerifyReport


def default_verifier(settings: Optional[Settings] = None, output: Optional[Path] = None, **engine: Any) -> Verifier:
    """The engine's generation check for ggml runtimes, the torch check for torch environments.

    ``engine`` goes to :func:`accelstack.engine.verify` (options, cpu_runtime, tolerance, probe_seed)."""
    s = settings or Settings.resolve()

    def check(staged: StagedRuntime, progress: ProgressCallback) -> VerifyReport:
        from ..engine import Runtime, verify, verify_torch
        from ..engine.verification import default_output

        if staged.stack == "torch":
            return verify_torch(python=staged.python or str(staged.path), env=dict(staged.env), progress=progress)
        runtime = Runtime(path=Path(staged.path), backend=staged.backend, env=dict(staged.env))
        out = output or default_output(staged.backend, s.cache)
        return verify(runtime, output=out, probe_cache=s.probe_cache, records=s.verify_dir, progress=progress, **engine)

    return check


_IMPORT = (  # the runtime's outside libraries (a CUDA build's cudart/cuBLAS) load first, as in the worker
    "from accelstack.engine.worker_backend import load_runtime_libraries; load_runtime_libraries();"
    "import json, stable_diffusion_cpp as s, stable_diffusion_cpp.stable_diffusion_cpp as lib;"
    "print(json.dumps({'version': getattr(s, '__version__', ''), 'system_info': "
    "(lib.sd_get_system_info() or b'').decode('utf-8', 'replace').strip()}))"
)


def _import_env(staged: StagedRuntime) -> Dict[str, str]:
    """The worker's environment for the staged runtime (its library note read), and accelstack
    importable beside it."""
    from ..engine.runtime import Runtime

    env = Runtime(path=Path(staged.path), backend=staged.backend, env=dict(staged.env)).worker_env()
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([str(staged.path), package_root])
    return env


def import_verifier(timeout: float = 120) -> Verifier:
    """The cheap check: the bindings import and their native library loads, in a fresh process
    (ggml), or torch imports as the planned build and sees its device (torch). No generation."""

    def check(staged: StagedRuntime, progress: ProgressCallback) -> VerifyReport:
        if staged.stack == "torch":
            from ..installer.torch import import_check

            return import_check(staged, progress, timeout)
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
                               message=f"the library loads ({seconds:.1f} s)" if res.returncode == 0 else "the library does not load"))
        if res.returncode != 0:
            last = (res.stderr.strip().splitlines() or ["no output"])[-1]
            return VerifyReport(ok=False, reason=f"the runtime does not load: {last}", runtime=str(staged.path),
                                backend=staged.backend, check="import", total_seconds=seconds,
                                checks=[VerifyCheck("load", False, last)], log_tail=res.stderr.strip().splitlines()[-20:])
        try:
            info = json.loads(res.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            info = {}
        return VerifyReport(ok=True, reason="", runtime=str(staged.path), backend=staged.backend, check="import",
                            device=DeviceInfo(name=staged.backend), total_seconds=seconds,
                            checks=[VerifyCheck("load", True, str(info.get("system_info", ""))[:200])], details=info)

    return check
