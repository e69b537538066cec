"""The torch stack's driver: the PyTorch build the compatibility matrix chose, installed with pip
(or uv) into the target interpreter, checked there, and undone if the check fails. The
environment is the user's: accelstack records what it installed and never deletes the environment."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

from ...engine import verify_torch
from ...engine.errors import InvalidRequestError, RuntimeNotFoundError
from ...errors import AccelstackError, Action, UsageError
from ...events import ProgressCallback
from ...hardware.report import HardwareReport
from ...installer.home import Home
from ...installer.maintenance import StackStatus
from ...installer.pip_commands import with_indexes
from ...installer.records import Receipt
from ...installer.torch_check import import_check
from ...installer.torch_destination import PipCommands, receipt_id
from ...installer.transaction import Provenance, StagedRuntime, Verifier
from ...manifests.plan import Plan
from ...settings import Settings, inherited_env
from ...verdict import VerifyReport
from ..context import InstallJob
from ..planning import hardware_fingerprint, target_interpreter
from ..results import InstallSummary, not_possible
from . import torch_bundle
from .protocol import InstallEntry
from .torch_pip import pip_transaction

__all__ = ["DEVICE_KIND", "TorchDriver", "DRIVER"]

# the torch device each backend's build must compute on (ROCm builds answer through the torch.cuda API)
DEVICE_KIND = {"cuda": "cuda", "rocm": "cuda", "xpu": "xpu", "mps": "mps", "directml": "directml"}


class TorchDriver:
    name = "torch"
    # a torch that installs but does not see its GPU here (AMD's ROCm build on a driver it cannot use, a
    # CUDA build without kernels) gives way to the plan's next candidate, as a ggml build does (issue 27)
    retries_candidates = True
    removes_files = False  # the environment is the user's: only the record goes
    repairable = False

    def check_request(self, report: HardwareReport, backend: Optional[str], settings: Settings) -> None:
        return None  # the matrix itself says what this machine cannot run

    def unsatisfiable(self, plan: Plan, trusted: Any) -> Exception:
        return not_possible(plan)

    def _ready(self, plan: Plan) -> None:
        if plan.status == "unsatisfiable":
            raise not_possible(plan)
        if not plan.ok:
            raise AccelstackError(f"no torch build fits: {plan.summary}", hint="; ".join(plan.conflicts) or
                                  "the plan's candidates say why each build was rejected", action=Action.EXPLAIN_PLAN)

    def install(self, plan: Plan, job: InstallJob) -> InstallSummary:
        self._ready(plan)
        s = job.settings
        provenance = Provenance("builtin", 0, hardware_fingerprint(job.report), package="torch",
                                package_version=plan.torch_version)
        return pip_transaction(plan, PipCommands.for_plan(plan, s), s, job.verifier(self.verifier(s, None, {})),
                               provenance, job.progress, {})

    def dry_run(self, plan: Plan, job: InstallJob) -> InstallSummary:
        self._ready(plan)
        s = job.settings
        python = target_interpreter(s, create=False)
        would = [] if s.torch_venv is None or Path(python).exists() else [f"would create the virtual environment {s.torch_venv}"]
        would += [f"would run: {c.render()}" for c in with_indexes(plan.commands, s.index_url, s.extra_index_urls)]
        would.append(f"would check that torch imports in {python} and sees the {plan.backend} device, "
                     "and put back what was there before if it does not")
        return InstallSummary(self.name, receipt_id(plan, python), False, plan, dry_run=True, would=would)

    def verifier(self, settings: Settings, output: Optional[Path], engine: Dict[str, Any]) -> Verifier:
        """torch operations and a diffusers step in the target interpreter."""
        if engine.get("families"):  # asked through the library: refused, never silently ignored
            raise InvalidRequestError("model families are verified on the stable-diffusion.cpp stack only, not torch",
                                      hint="leave out the families, or verify the ggml stack")

        def check(staged: StagedRuntime, progress: ProgressCallback) -> VerifyReport:
            # the plan's device, not the best one torch finds: a ROCm build that only reaches the CPU failed
            return verify_torch(python=staged.python or str(staged.path), env=dict(staged.env),
                                device=DEVICE_KIND.get(staged.backend), progress=progress)

        return check

    def import_verifier(self, timeout: float) -> Verifier:
        def check(staged: StagedRuntime, progress: ProgressCallback) -> VerifyReport:
            return import_check(staged, progress, timeout)

        return check

    def staged(self, receipt: Receipt, path: Path) -> StagedRuntime:
        """A torch receipt's path is its interpreter."""
        return StagedRuntime(stack=receipt.stack, backend=receipt.backend, path=path, env=dict(receipt.env), python=str(path))

    def interpreter(self, path: Optional[Path], active: Optional[Tuple[Receipt, Path]]) -> Tuple[Optional[str], Dict[str, str]]:
        """Where torch's own check runs: a venv's interpreter, or this one with a ``--target`` dir
        first on ``PYTHONPATH``; without a path, the active torch runtime's interpreter (its
        receipt's path), else this interpreter (None)."""
        if path is None:
            return (str(active[1]), dict(active[0].env)) if active is not None else (None, {})
        for exe in (path / "bin" / "python", path / "Scripts" / "python.exe"):
            if exe.is_file():
                return str(exe), {}
        if not path.is_dir():
            raise RuntimeNotFoundError(f"runtime directory {path} does not exist",
                                       hint="pass --runtime DIR: a venv or a pip --target directory with torch")
        return None, {"PYTHONPATH": os.pathsep.join([str(path)] + [p for p in inherited_env().get("PYTHONPATH", "").split(os.pathsep) if p])}

    def runtime_id(self, plan: Plan, settings: Settings) -> str:
        return receipt_id(plan, target_interpreter(settings, create=False))

    def repair(self, settings: Settings, verifier: Optional[Verifier], fetcher: Any, progress: ProgressCallback,
               rebuild: Optional[Any] = None) -> Any:
        raise UsageError("repair restores ggml runtimes; a torch environment is repaired by installing it again",
                         action=Action.REINSTALL)

    def upgrade_available(self, status: StackStatus, report: HardwareReport, settings: Settings) -> str:
        return ""  # the builtin matrix changes with accelstack itself

    def uninstall_note(self, home: Home, receipt: Receipt) -> str:
        return "the record only; the Python environment itself stays"

    def create_bundle(self, out: Path, settings: Settings, report: Optional[HardwareReport], *,
                      backends: Sequence[str], targets: Sequence[str], all_targets: bool,
                      requirements: Sequence[str], python_version: str, platforms: Sequence[str],
                      progress: ProgressCallback) -> Any:
        if targets or all_targets:
            raise UsageError("a torch bundle holds one torch plan: choose it with --backend and requirements, not targets")
        return torch_bundle.create(Path(out), settings, backends, report, requirements, python_version, platforms, progress)

    def install_bundle(self, opened: Any, what: str, job: InstallJob, backend: Optional[str],
                       read_seconds: float, install: InstallEntry) -> InstallSummary:
        if backend:
            raise UsageError("a torch bundle installs the build it holds", "leave out --backend")
        return torch_bundle.install_from(opened, what, job.report, job.settings, job.verifier(self.verifier(job.settings, None, {})),
                                         job.progress, read_seconds)


DRIVER = TorchDriver()
