"""The pipeline's layering, checked on the source of the whole package.

detect -> manifests -> artifacts -> installer -> engine, with shared value types below all of
them, the publisher tooling beside the installer, the core above the stages, the service (the
core over HTTP) above the core, and the CLI on top.
No module imports a layer that stands after its own (not even inside a function), and there are
no import cycles among modules.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

PACKAGE = Path(__file__).resolve().parents[1] / "accelstack"
BOTTOM = ("errors", "events", "serde", "settings", "domain", "refs", "verdict", "lazy", "subprocesses", "limits", "fsio")
ORDER = ["detect", "manifests", "artifacts", "installer", "engine", "core", "service", "commands", "cli"]
FORBIDDEN = {
    **{b: tuple(ORDER) + ("publisher",) for b in BOTTOM},
    "detect": ("manifests", "artifacts", "installer", "engine", "core", "service", "commands", "cli", "publisher"),
    "manifests": ("artifacts", "installer", "engine", "core", "service", "commands", "cli", "publisher"),
    "artifacts": ("installer", "engine", "core", "service", "commands", "cli", "publisher"),
    "installer": ("engine", "core", "service", "commands", "cli", "publisher"),
    "publisher": ("installer", "engine", "core", "service", "commands", "cli"),
    "engine": ("installer", "core", "service", "commands", "cli", "publisher"),
    "core": ("service", "commands", "cli"),
    "service": ("commands", "cli"),  # the core over HTTP: it may use the core and below, never the CLI
}


def _modules() -> Dict[str, Path]:
    out = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        rel = p.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _imports(name: str, path: Path, top_only: bool, *, type_checking: bool = False) -> Set[str]:
    """The accelstack modules ``path`` imports: all, or those at module level (``top_only``; with
    ``type_checking``, also those in a module-level ``if TYPE_CHECKING:`` block)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes: List[ast.AST] = list(tree.body) if top_only else list(ast.walk(tree))
    if top_only and type_checking:
        nodes += [n for node in tree.body if isinstance(node, ast.If) for n in node.body]
    out: Set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}
    return {m for m in out if m.startswith("accelstack")}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_no_module_imports_a_layer_after_its_own():
    bad = {}
    for name, path in _modules().items():
        forbidden = FORBIDDEN.get(_layer(name), ())
        wrong = sorted(m for m in _imports(name, path, top_only=False) if _layer(m) in forbidden)
        if wrong:
            bad[name] = wrong
    assert not bad, f"imports against the pipeline order: {bad}"


def test_no_import_cycles_between_modules():
    mods = _modules()
    # module-level imports between modules; a package's __init__ re-exporting its own submodules
    # (and a submodule naming its package) is how packages work, not a cycle
    graph = {name: {m for m in _imports(name, path, top_only=True)
                    if m in mods and m != name and not name.startswith(m + ".") and not m.startswith(name + ".")}
             for name, path in mods.items()}
    state: Dict[str, int] = {}
    cycles: List[List[str]] = []

    def visit(node: str, stack: List[str]) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack)
        stack.pop()
        state[node] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [])
    assert not cycles, f"import cycles: {cycles[:5]}"
