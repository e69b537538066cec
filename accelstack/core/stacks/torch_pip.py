"""The torch stack's one transaction: pip (or uv) commands into the target interpreter under the
home's lock, checked there and undone if the check fails; an online plan and a bundle's both run it."""
from __future__ import annotations

from typing import List

from ...events import ProgressCallback
from ...installer.recovery import recover
from ...installer.torch_destination import PipCommands, TorchEnvironment, receipt_id
from ...installer.transaction import Provenance, Verifier
from ...installer.transaction import install as run_transaction
from ...manifests.plan import Plan
from ...settings import Settings
from ..context import prepare_home
from ..planning import target_interpreter
from ..results import InstallSummary

__all__ = ["pip_transaction"]


def pip_transaction(plan: Plan, commands: PipCommands, settings: Settings, verifier: Verifier, provenance: Provenance,
                    progress: ProgressCallback, timings: dict) -> InstallSummary:
    """Run ``commands`` for ``plan`` into the settings' torch target (a venv is made when missing);
    ``timings`` come first in the summary's (a bundle's read and check)."""
    python = target_interpreter(settings, create=True)
    home, lock = prepare_home(settings, "install torch", progress, stack="torch")
    with lock:
        recovered: List[str] = recover(home)
        rid = receipt_id(plan, python)
        dest = TorchEnvironment(home, python, settings.timeouts.pip, settings.timeouts.probe)
        outcome = run_transaction(plan, commands, dest, verifier, home=home, runtime_id=rid, provenance=provenance,
                                  progress=progress)
    return InstallSummary(plan.stack, rid, True, plan, outcome.receipt, outcome.previous, {**timings, **outcome.timings},
                          recovered)
