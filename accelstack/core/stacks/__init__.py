"""The stack registry: each stack's line, and its driver and locator loaded by name.

The core, the CLI and the service never compare stack names; they ask the registry for the
stack's driver and call it. The registry sits low in the core: it imports nothing of the core but
the drivers' protocol (:mod:`.protocol`, what a driver is asked, in the pipeline's order), so
planning and every job can ask it; the drivers are leaves above everything they use, loaded here
by name on first use. A third stack is one new module here with a class that implements
:class:`StackDriver`, plus its line in :data:`STACKS` (what planning needs, known without
importing the driver, so `accelstack plan` stays light).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from ...errors import UsageError
from .protocol import RuntimeLocator, StackDriver

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
