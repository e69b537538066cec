"""The public API as an app's type checker sees it.

Public names load lazily (a package's ``__getattr__`` over its ``_EXPORTS``), which a type checker
cannot follow: it saw ``Any`` for every name, so ``x: str = accelstack.install(123, forse=True)``
passed ``mypy --strict``. Each lazy package now mirrors its exports in an ``if TYPE_CHECKING:``
block and hides ``__getattr__`` from the checker; these tests hold the two lists together and run
the real mypy on a small app.
"""
from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path
from typing import Dict, Set, Tuple

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "accelstack"


def _lazy_modules() -> Dict[str, Path]:
    """Every module whose names load lazily: those that call ``lazy_exports``."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "lazy_exports(" in path.read_text(encoding="utf-8") and path.name != "lazy.py":
            rel = path.relative_to(REPO).with_suffix("")
            parts = list(rel.parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _absolute(module: str, package: str) -> str:
    return importlib.util.resolve_name(module, package) if module.startswith(".") else module


def _exports_and_typed(name: str, path: Path) -> Tuple[Dict[str, str], Dict[str, str]]:
    """(name -> module) of the lazy table, and of the names the ``TYPE_CHECKING`` block imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    typed: Dict[str, str] = {}
    module = importlib.import_module(name)
    lazy = getattr(module, "_EXPORTS", None) or getattr(module, "_LAZY", {})
    table = {k: _absolute(v, package) for k, v in lazy.items()}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imp in node.body:
                if isinstance(imp, ast.ImportFrom):
                    mod = _absolute("." * imp.level + (imp.module or ""), package)
                    typed.update({(a.asname or a.name): mod for a in imp.names})
    return table, typed


@pytest.mark.parametrize("name", sorted(_lazy_modules()))
def test_each_lazy_name_is_typed_from_the_module_it_loads_from(name):
    table, typed = _exports_and_typed(name, _lazy_modules()[name])
    assert table, f"{name}: no lazy table found"
    missing = {k: v for k, v in table.items() if typed.get(k) != v}
    assert not missing, f"{name}: lazy names the TYPE_CHECKING block does not import from the same module: {missing}"
    extra: Set[str] = set(typed) - set(table)
    if _lazy_modules()[name].name != "__init__.py":  # a module may import more for its own annotations
        return
    assert not extra, f"{name}: typed names that are not lazy exports: {sorted(extra)}"


@pytest.mark.parametrize("name", sorted(_lazy_modules()))
def test_the_lazy_getattr_is_hidden_from_type_checkers(name):
    text = _lazy_modules()[name].read_text(encoding="utf-8")
    assert "if not TYPE_CHECKING:" in text and "\n__getattr__ = lazy_exports" not in text, \
        f"{name}: a visible __getattr__ makes every unknown name Any to a type checker"


GOOD = '''\
from __future__ import annotations

import accelstack
from accelstack import InstallSummary, ProgressEvent, VerifyReport


def callback(event: ProgressEvent) -> None:
    print(event.stage, event.kind, event.task, event.done, event.total)


report = accelstack.detect()
plan = accelstack.plan(report, stack="ggml")
summary: InstallSummary = accelstack.install(plan, on_progress=callback, force=False)
result: VerifyReport = accelstack.verify(summary.receipt)
print(result.verdict, result.device.name if result.device else "", result.step_seconds)
'''

BAD = '''\
from __future__ import annotations

import accelstack

x: str = accelstack.install(123, forse=True)
y = accelstack.instal()
'''


def _mypy(tmp_path: Path, **apps: str) -> subprocess.CompletedProcess:
    """One mypy run over the given apps (name -> source): mypy's start-up, not the checking, is its cost."""
    paths = []
    for name, source in apps.items():
        (tmp_path / f"{name}.py").write_text(source, encoding="utf-8")
        paths.append(str(tmp_path / f"{name}.py"))
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-incremental",
                           "--cache-dir", str(tmp_path / "cache"), *paths],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, timeout=900)


def test_mypy_strict_accepts_the_readme_snippet_and_refuses_a_wrong_call(tmp_path):
    run = _mypy(tmp_path, good_app=GOOD, bad_app=BAD)
    out = run.stdout
    assert run.returncode == 1, out
    assert "good_app.py" not in out, out  # the README's snippet: no error
    assert 'bad_app.py:5: error: Argument 1 to "install" has incompatible type "int"' in out, out
    assert 'Unexpected keyword argument "forse"' in out, out
    assert 'Incompatible types in assignment (expression has type "InstallSummary", variable has type "str")' in out, out
    assert 'bad_app.py:6: error: Module has no attribute "instal"' in out, out
