"""Run what is installed: ``verify`` (does it generate here) and ``generate`` (make images).

Both default to the runtime ``install`` activated, with its receipt's backend and environment;
the stack's driver says how its runtime is found and run.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union

from ..engine import GenerateRequest
from ..engine.config import load_config
from ..engine.runtime import Runtime
from ..errors import AccelstackError, Action
from ..events import ProgressCallback, null_progress
from ..hardware.protocol import System
from ..installer.errors import StateError
from ..installer.home import Home
from ..installer.records import Receipt, now_iso
from ..settings import Settings
from ..verdict import VerifyReport
from .disk_state import runtime_path
from .stacks import driver, locator
from .verifiers import default_verifier

__all__ = ["NoRuntimeError", "active_receipt", "verify", "generate"]


class NoRuntimeError(StateError):
    """No runtime was given and none is active."""

    default_action = Action.INSTALL


def active_receipt(stack: str = "ggml", settings: Optional[Settings] = None) -> Receipt:
    s = settings or Settings.resolve()
    home = Home(s.home)
    rid = home.read_active().active.get(stack)
    if not rid:
        raise NoRuntimeError(f"no {stack} runtime is active", hint="install one first")
    return home.read_receipt(rid)


def installed_runtime(receipt: Optional[Receipt] = None, *, stack: str = "ggml",
                      settings: Optional[Settings] = None) -> Runtime:
    """The engine's :class:`~accelstack.engine.Runtime` of an installed runtime (default: the active one)."""
    s = settings or Settings.resolve()
    receipt = receipt if receipt is not None else active_receipt(stack, s)
    return locator(receipt.stack).engine_runtime(receipt, runtime_path(s, receipt))


def verify(receipt: Optional[Receipt] = None, *, stack: str = "ggml", settings: Optional[Settings] = None,
           output: Optional[Union[str, Path]] = None, on_progress: Optional[ProgressCallback] = None,
           **engine: Any) -> VerifyReport:
    """Prove that an installed runtime generates on this machine (default: the active one).

    A FAIL is a report (``result.ok`` is False, ``reason`` says why), not an exception; the receipt
    of an installed runtime records the latest verdict of the runtime's own check (the one install
    runs, that status, doctor and the fleet view show), never a check of other model families
    (``families``): a flux-only FAIL does not mean the runtime fails. ``engine`` goes to the engine's
    check (options, cpu_runtime, tolerance, probe_seed, families)."""
    s = settings or Settings.resolve()
    home = Home(s.home)
    receipt = receipt if receipt is not None else active_receipt(stack, s)
    if not home.runtime_path(receipt).exists():
        raise StateError(f"the runtime {receipt.id} is missing from {home.runtime_path(receipt)}", hint="repair restores it",
                         action=Action.REPAIR)
    check = default_verifier(s, Path(output) if output is not None else None, **engine)
    report = check(driver(receipt.stack).staged(receipt, home.runtime_path(receipt)), on_progress or null_progress)
    if home.receipt_path(receipt.id).is_file():
        families = list(engine.get("families") or [])
        if families:  # when the families were checked, and how: beside the runtime's own verdict (issue 42)
            receipt.families, receipt.families_verified_at, receipt.families_ok = families, now_iso(), report.ok
        else:
            receipt.verification, receipt.verified_at = report, now_iso()
        try:
            home.write_receipt(receipt)
        except OSError:
            pass  # a read-only home still verifies
    return report


def generate(model: Optional[Union[str, Path]], prompt: str, output: Union[str, Path], *, receipt: Optional[Receipt] = None,
             stack: str = "ggml", settings: Optional[Settings] = None, on_progress: Optional[ProgressCallback] = None,
             options: Any = None, system: Optional[System] = None, dry_run: bool = False, machine: Any = None,
             **request: Any) -> Any:
    """Generate images with an installed runtime (default: the active one); ``request`` takes the
    fields of :class:`accelstack.engine.GenerateRequest` (negative_prompt, width, height, steps,
    seed, sampler...); ``options`` are the engine's (default: the settings' config file); ``system``:
    the machine whose memory the planner fits the generation to (default: this one).
    Returns the engine's ``GenerateReport`` with the saved PNG paths. ``dry_run``: nothing is loaded or
    written; returns the memory planner's ``MemoryDecision`` on ``machine`` (a ``MachineMemory``, e.g.
    ``machine.declared_machine``; default: ``system``'s), planned for the installed runtime if there is one."""
    s = settings or Settings.resolve()
    from . import direct  # the engine's calls: loaded with the first generate

    options = direct.with_caches(load_config(s.config_file, missing_ok=True) if options is None else options, s)

    if dry_run:
        try:
            at_hand: Optional[Runtime] = installed_runtime(receipt, stack=stack, settings=s)
        except AccelstackError:
            at_hand = None  # none installed: planned for the declared GPU's backend, else the CPU
        return direct.dry_run(GenerateRequest(prompt=prompt, **request), model, output, options, runtime=at_hand,
                              system=system, machine=machine)
    runtime = installed_runtime(receipt, stack=stack, settings=s)

    return direct.generate(runtime, model, GenerateRequest(prompt=prompt, **request), output, options=options,
                           progress=on_progress or null_progress, system=system)
