"""Stack drivers: what differs between the ggml and the torch stack, behind one protocol.

The core, the CLI and the service never compare stack names; they ask the registry for the
stack's driver and call it. A third stack is one new module here with a class that implements
:class:`StackDriver`, plus its line in :data:`STACKS` (what planning needs, known without
importing the driver, so `accelstack plan` stays light).

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

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Optional, Protocol, Sequence, Tuple

from ...errors import UsageError
from ...events import ProgressCallback

if TYPE_CHECKING:
    from ...hardware.report import HardwareReport
    from ...installer.home import Home
    from ...installer.maintenance import StackStatus
    from ...installer.records import Receipt
    from ...installer.transaction import StagedRuntime, Verifier
    from ...manifests.plan import Plan
    from ...settings import Settings
    from ..context import InstallJob
    from ..results import InstallSummary

__all__ = ["StackInfo", "StackDriver", "RuntimeLocator", "STACKS", "stack_names", "stack_info", "driver",
           "locator", "locator_for_backend",
           "stack_for_backend", "default_stack", "driver_of_bundle"]


@dataclass(frozen=True)
class StackInfo:
    """A stack's line in the registry: where its driver lives and what planning needs to know."""

    name: str
    module: str  # the driver's module; its ``DRIVER`` is the instance
    runtimes: str  # the module of its runtimes as the engine runs them; its ``LOCATOR`` is the instance
    reads_channels: bool  # plans from the channels' signed manifests (else from the builtin knowledge)
    needs_python: bool  # plans for the target interpreter's Python version
    engine_backends: Tuple[str, ...] = ()  # engine backends that name this stack's runtimes outright ("torch")
    default: bool = False  # the stack when none is named
    model_families: bool = False  # its verify proves other model families' kernels (verify --family)


STACKS: Dict[str, StackInfo] = {
    "ggml": StackInfo("ggml", "accelstack.core.stacks.ggml", "accelstack.core.stacks.ggml_runtime", reads_channels=True,
                      needs_python=False, default=True, model_families=True),
    "torch": StackInfo("torch", "accelstack.core.stacks.torch", "accelstack.core.stacks.torch_runtime",
                       reads_channels=False, needs_python=True, engine_backends=("torch",)),
}


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
                       read_seconds: float) -> InstallSummary: ...

    def uninstall_note(self, home: Home, receipt: Receipt) -> str: ...

    def interpreter(self, path: Optional[Path], active: Optional[Tuple[Receipt, Path]]) -> Tuple[Optional[str], Dict[str, str]]: ...


def stack_names() -> Tuple[str, ...]:
    return tuple(STACKS)


def stack_info(stack: str) -> StackInfo:
    """The registry's line for ``stack``; an unknown name is a usage error."""
    found = STACKS.get(stack)
    if found is None:
        raise UsageError(f"unknown stack {str(stack)[:40]!r}: choose one of {', '.join(STACKS)}")
    return found


_LOADED: Dict[str, StackDriver] = {}
_LOCATORS: Dict[str, RuntimeLocator] = {}


def driver(stack: str) -> StackDriver:
    """The driver of ``stack``, its module imported on first use (the registry is the package
    boundary: planning and detection never import an install's machinery)."""
    found = _LOADED.get(stack)
    if found is None:
        found = _LOADED[stack] = importlib.import_module(stack_info(stack).module).DRIVER
    return found


def locator(stack: str) -> RuntimeLocator:
    """Where ``stack``'s runtimes are, as the engine runs them (its module imported on first use)."""
    found = _LOCATORS.get(stack)
    if found is None:
        found = _LOCATORS[stack] = importlib.import_module(stack_info(stack).runtimes).LOCATOR
    return found


def locator_for_backend(backend: Optional[str]) -> RuntimeLocator:
    """The locator of the stack whose runtimes ``backend`` names (``torch``), else the default stack's."""
    named = stack_for_backend(backend)
    return locator(named.name if named is not None else default_stack())


def stack_for_backend(backend: Optional[str]) -> Optional[StackInfo]:
    """The stack whose runtimes the engine backend ``backend`` names outright (``torch``), or None
    (``cpu``, ``cuda``...: a build of the default stack)."""
    return next((s for s in STACKS.values() if backend and backend in s.engine_backends), None)


def default_stack() -> str:
    return next(s.name for s in STACKS.values() if s.default)


def driver_of_bundle(stack: object) -> Optional[StackDriver]:
    """The driver for a bundle's ``stack`` field (hostile input), or None when no stack has that name."""
    return driver(stack) if isinstance(stack, str) and stack in STACKS else None
