"""Layering of the manifests stage: it imports only what stands before it, and holds no cycles.

Checked on the source (every ``import``, at module level or inside a function) and, for the
promise that reading a plan does not load the HTTP stack, in a fresh interpreter.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, Set

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "accelstack"
AFTER_MANIFESTS = ("accelstack.artifacts", "accelstack.installer", "accelstack.engine", "accelstack.core",
                   "accelstack.commands", "accelstack.publisher", "accelstack.cli")
AFTER_ARTIFACTS = ("accelstack.installer", "accelstack.engine", "accelstack.core", "accelstack.commands",
                   "accelstack.publisher", "accelstack.cli", "accelstack.manifests", "accelstack.detect")


def imports_of(path: Path, package: str) -> Dict[str, bool]:
    """Modules ``path`` imports (absolute names) -> whether the import is at module level."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(node) for node in tree.body}
    top |= {id(n) for node in tree.body if isinstance(node, ast.If) for n in node.body}  # TYPE_CHECKING
    out: Dict[str, bool] = {}
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names = [mod] + [f"{mod}.{a.name}" for a in node.names]
        for name in names:
            out[name] = out.get(name, False) or id(node) in top
    return out


def modules(stage: str) -> Dict[str, Path]:
    return {f"accelstack.{stage}.{p.stem}": p for p in sorted((PACKAGE / stage).glob("*.py"))}


@pytest.mark.parametrize("stage, forbidden", [("manifests", AFTER_MANIFESTS), ("artifacts", AFTER_ARTIFACTS)])
def test_stage_imports_nothing_after_it(stage, forbidden):
    bad = {}
    for name, path in modules(stage).items():
        pkg = f"accelstack.{stage}"
        wrong = sorted(m for m in imports_of(path, pkg) if m.startswith(forbidden))
        if wrong:
            bad[name] = wrong
    assert not bad, f"{stage}/ imports stages after it: {bad}"


@pytest.mark.parametrize("stage", ["manifests", "artifacts"])
def test_no_cycles_and_no_hidden_ones(stage):
    mods = modules(stage)
    graph: Dict[str, Set[str]] = {}
    hidden = {}
    for name, path in mods.items():
        deps = imports_of(path, f"accelstack.{stage}")
        graph[name] = {m for m in deps if m in mods and m != name}
        late = sorted(m for m, top in deps.items() if m in mods and m != name and not top)
        if late:
            hidden[name] = late
    assert not hidden, f"function-level imports of sibling modules (they hide cycles): {hidden}"
    state: Dict[str, int] = {}

    def visit(node: str, path: list) -> None:
        state[node] = 1
        for dep in graph[node]:
            if state.get(dep) == 1:
                raise AssertionError(f"import cycle: {' -> '.join(path[path.index(dep):] + [dep]) if dep in path else dep}")
            if dep not in state:
                visit(dep, path + [dep])
        state[node] = 2

    for name in graph:
        if name not in state:
            visit(name, [name])


PROBE = """
import json, sys, types
if {bare}:  # the stage alone: the top-level package's own imports (the core) left out
    root = types.ModuleType("accelstack")
    root.__path__ = [{package!r}]
    sys.modules["accelstack"] = root
import accelstack.manifests.plan
import accelstack.manifests.resolve
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("requests", "urllib3", "cryptography")
                        or m.startswith("accelstack.artifacts"))))
"""


def loaded_by_plan(bare: bool) -> list:
    code = PROBE.format(bare=bare, package=str(PACKAGE))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def test_manifests_stage_loads_neither_http_nor_artifacts():
    assert loaded_by_plan(bare=True) == []


def test_reading_a_plan_loads_neither_http_nor_artifacts():
    """The same through ``import accelstack``, as an app does it."""
    assert loaded_by_plan(bare=False) == []
