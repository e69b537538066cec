"""What the core asks of a stack's driver and of its locator, behind one protocol each.

The protocol, in the pipeline's order:

- plan: ``STACKS[name].reads_channels`` (the plan needs the channels' signed manifests) and
  ``needs_python`` (the plan is for the target interpreter's Python version);
- install: ``install(plan, job)`` stages the plan's build into its destination, verifies it and
  switches (``dry_run`` says what it would do); ``retries_candidates``: a build that fails verify
  gives way to the plan's next candidate; ``check_request``/``unsatisfiable`` refuse a request
  before anything is fetched;
- verify: ``verifier`` (the real check) and ``import_verifier`` (the cheap one) for a staged runtime;
- locate: ``staged`` (an installed runtime as the verifier sees it), ``interpreter`` (the Python
  and environment a runtime's own checks run in); as the engine runs a runtime, the installed one
  (``engine_runtime``) or one named by hand on the command line (``runtime_from_dir``), is the
  stack's :class:`RuntimeLocator`, a module of its own (``StackInfo.runtimes``): generating loads
  no install, download or build machinery;
- identity: ``runtime_id`` (the receipt's id for a plan);
- upkeep: ``repair``, ``upgrade_available``, ``removes_files`` (uninstall removes the runtime's files,
  or only its record), bundles (``create_bundle``, ``install_bundle``).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Protocol, Sequence, Tuple

from ...events import ProgressCallback

if TYPE_CHECKING:  # the value types a driver is handed; the registry needs none of them at run time
    from ...hardware.report import HardwareReport
    from ...installer.home import Home
    from ...installer.maintenance import StackStatus
    from ...installer.records import Receipt
    from ...installer.transaction import StagedRuntime, Verifier
    from ...manifests.plan import Plan
    from ...settings import Settings
    from ..context import InstallJob
    from ..results import InstallSummary

__all__ = ["StackDriver", "RuntimeLocator", "InstallEntry"]

InstallEntry = Callable[..., "InstallSummary"]
"""The core's ``install`` (:func:`accelstack.core.installing.install`), handed to a driver that ends
in an ordinary install (a ggml bundle): a driver never imports a job that loads drivers."""


class RuntimeLocator(Protocol):
    """A stack's runtimes as the engine runs them (an ``accelstack.engine.Runtime``)."""

    def engine_runtime(self, receipt: Receipt, path: Path) -> Any: ...

    def runtime_from_dir(self, path: Optional[Path], backend: str) -> Any: ...


class StackDriver(Protocol):
    """What the core asks of a stack; see the module docstring for the order."""

    name: str
    retries_candidates: bool
    removes_files: bool
    repairable: bool

    def check_request(self, report: HardwareReport, backend: Optional[str], settings: Settings) -> None: ...

    def unsatisfiable(self, plan: Plan, trusted: Any) -> Exception: ...

    def install(self, plan: Plan, job: InstallJob) -> InstallSummary: ...

    def dry_run(self, plan: Plan, job: InstallJob) -> InstallSummary: ...

    def verifier(self, settings: Settings, output: Optional[Path], engine: Dict[str, Any]) -> Verifier: ...

    def import_verifier(self, timeout: float) -> Verifier: ...

    def staged(self, receipt: Receipt, path: Path) -> StagedRuntime: ...

    def runtime_id(self, plan: Plan, settings: Settings) -> str: ...

    def repair(self, settings: Settings, verifier: Optional[Verifier], fetcher: Any, progress: ProgressCallback,
               rebuild: Optional[Any] = None) -> Any: ...

    def upgrade_available(self, status: StackStatus, report: HardwareReport, settings: Settings) -> str: ...

    def create_bundle(self, out: Path, settings: Settings, report: Optional[HardwareReport], *,
                      backends: Sequence[str], targets: Sequence[str], all_targets: bool,
                      requirements: Sequence[str], python_version: str, platforms: Sequence[str],
                      progress: ProgressCallback) -> Any: ...

    def install_bundle(self, opened: Any, what: str, job: InstallJob, backend: Optional[str],
                       read_seconds: float, install: InstallEntry) -> InstallSummary: ...

    def uninstall_note(self, home: Home, receipt: Receipt) -> str: ...

    def interpreter(self, path: Optional[Path], active: Optional[Tuple[Receipt, Path]]) -> Tuple[Optional[str], Dict[str, str]]: ...
