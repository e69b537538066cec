"""``torchruntime.utils.torch_test``: the ``test`` command's checks, done by accelstack's torch check.

torchruntime's names are kept (``all``, ``import``, ``devices``, ``compile``, ``math``,
``functions``). ``import`` and ``devices`` answer from the installed torch; ``math`` and
``functions`` run accelstack's torch workload (conv2d, attention, group norm, a float16 matmul, each
compared with the CPU) on the best device; ``compile`` has no accelstack check and says so.
Each check returns a :class:`TestResult`; nothing is printed here (the command line prints them).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

from .....engine.verification.torch_check import run_check
from .....serde import plural
from ..torch_device_utils import get_device_count, get_installed_torch_platform

__all__ = ["TESTS", "TestResult", "run_tests", "test"]

TESTS = ("import", "devices", "compile", "math", "functions")


@dataclass
class TestResult:
    """One check: its name, whether it passed (or was skipped) and what it found."""

    __test__ = False  # not a pytest class
    name: str
    ok: bool
    detail: str
    skipped: bool = False


def _import() -> TestResult:
    try:
        name, _ = get_installed_torch_platform()
    except ImportError as exc:
        return TestResult("import", False, f"torch cannot be imported: {exc}")
    return TestResult("import", True, f"torch imports; its backend here is {name}")


def _devices() -> TestResult:
    name, _ = get_installed_torch_platform()
    return TestResult("devices", True, plural(get_device_count(), f"{name} device"))


def _workload(label: str) -> TestResult:
    result = run_check()
    ops = ", ".join(f"{o['name']} {'ok' if o.get('ok') else 'FAILED'}" for o in result.get("ops", []))
    where = result.get("device_kind", "?")
    if not result.get("ok"):
        return TestResult(label, False, f"on {where}: {result.get('reason') or 'failed'}" + (f" ({ops})" if ops else ""))
    return TestResult(label, True, f"on {where} ({result.get('device_name', '')}), checked against the CPU: {ops}")


def run_tests(subcommand: str = "all") -> List[TestResult]:
    """The checks ``subcommand`` names; ``ValueError`` for a name torchruntime does not have."""
    if subcommand not in ("all",) + TESTS:
        raise ValueError(f"unknown test {subcommand!r}: one of all, {', '.join(TESTS)}")
    names = TESTS if subcommand == "all" else (subcommand,)
    out: List[TestResult] = []
    for name in names:
        if name == "import":
            out.append(_import())
            if not out[-1].ok:
                break
        elif name == "devices":
            out.append(_devices())
        elif name == "compile":
            out.append(TestResult("compile", True, "torch.compile is not checked by accelstack", skipped=True))
        elif name == "math" or (name == "functions" and subcommand != "all"):
            out.append(_workload(name))
        # "all" runs the workload once: math and functions are the same check here
    return out


def test(subcommand: str = "all") -> List[TestResult]:
    """torchruntime's ``test(subcommand)``: the results (the command line prints them)."""
    return run_tests(subcommand)
