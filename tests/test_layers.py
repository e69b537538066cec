"""The pipeline's layering, checked on the source of the whole package.

hardware -> manifests -> artifacts -> installer -> engine, with shared value types below all of
them (the engine never reads the machine: the core hands it what it needs), the publisher tooling beside the installer, the core above the stages, the service (the
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
ORDER = ["hardware", "manifests", "artifacts", "installer", "engine", "core", "service", "commands", "cli"]
FORBIDDEN = {
    **{b: tuple(ORDER) + ("publisher",) for b in BOTTOM},
    "hardware": ("manifests", "artifacts", "installer", "engine", "core", "service", "commands", "cli", "publisher"),
    "manifests": ("artifacts", "installer", "engine", "core", "service", "commands", "cli", "publisher"),
    "artifacts": ("installer", "engine", "core", "service", "commands", "cli", "publisher"),
    "installer": ("engine", "core", "service", "commands", "cli", "publisher"),
    "publisher": ("installer", "engine", "core", "service", "commands", "cli"),
    # the engine never reads the machine: the core hands it the memory it plans with (core/machine.py)
    "engine": ("hardware", "installer", "core", "service", "commands", "cli", "publisher"),
    "core": ("service", "commands", "cli"),
    "service": ("commands", "cli"),  # the core over HTTP: it may use the core and below, never the CLI
}
# accelstack.compat (other tools' interfaces, such as torchruntime's) is an app of the core, like the CLI: nothing imports it
FORBIDDEN = {layer: banned + ("compat",) for layer, banned in FORBIDDEN.items()}


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


def test_every_part_of_the_package_has_its_layer():
    """The rules above name layers by their package: a package renamed or added without its rule
    would be checked by none of them (``hardware/`` went unchecked after its rename from ``detect``)."""
    parts = {p.stem for p in PACKAGE.iterdir()
             if (p.is_dir() and (p / "__init__.py").is_file()) or (p.suffix == ".py" and p.stem not in ("__init__", "__main__"))}
    known = set(FORBIDDEN) | set(ORDER) | {"compat", "schemas"}  # compat: nothing imports it; schemas: data files
    assert parts - known == set(), f"parts of accelstack no layering rule names: {sorted(parts - known)}"
    assert {layer for layer in known if layer not in ("cli",)} - parts == set(), "rules name packages that do not exist"


def test_no_import_cycles_between_modules():
    mods = _modules()
    # module-level imports between modules; a package's __init__ re-exporting its own submodules
    # (and a submodule naming its package) is how packages work, not a cycle
    graph = {name: {m for m in _imports(name, path, top_only=True)
                    if m in mods and m != name and not name.startswith(m + ".") and not m.startswith(name + ".")}
             for name, path in mods.items()}
    cycles = _cycles(graph)
    assert not cycles, f"import cycles: {cycles[:5]}"


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The circles of an import graph (module -> the modules it imports), each as the path that closes it."""
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
    return cycles


CORE = "accelstack.core"
REGISTRY = "accelstack.core.stacks"
DRIVER_PROTOCOL = "accelstack.core.stacks.protocol"
DISPATCH = ("driver", "driver_of_bundle", "locator", "locator_for_backend")  # the registry's calls that load a driver


def _core_graph() -> Dict[str, Set[str]]:
    """The core's modules and every core module each imports: at module level, inside a function and
    for type checking alike (a type-only import closes a circle as surely for a reader), with the
    package ``__init__`` that importing a submodule runs first (a module's own packages aside)."""
    mods = _modules()
    graph: Dict[str, Set[str]] = {}
    for name, path in mods.items():
        if not name.startswith(CORE):
            continue
        deps: Set[str] = set()
        for m in _imports(name, path, top_only=False):
            while m not in mods and "." in m:  # a name imported from a module: the module
                m = m.rsplit(".", 1)[0]
            parts = m.split(".")
            deps |= {".".join(parts[:i]) for i in range(2, len(parts) + 1)}
        graph[name] = {d for d in deps if d.startswith(CORE) and d in mods and d != name and not name.startswith(d + ".")}
    return graph


def test_no_import_cycles_in_the_core():
    """No circle among the core's modules, type-only and function-level imports included (issue 43:
    context -> options -> planning -> stacks -> context was closed by a type-only import)."""
    cycles = [[m[len(CORE) + 1:] for m in cycle] for cycle in _cycles(_core_graph())]
    assert not cycles, f"import cycles in the core: {cycles[:5]}"


def _driver_stack(name: str) -> str:
    """The stack a module of ``core/stacks/`` belongs to (``ggml_bundle`` is ggml's), or ""."""
    rest = name[len(REGISTRY) + 1:] if name.startswith(REGISTRY + ".") else ""
    return rest.split("_")[0] if rest and name != DRIVER_PROTOCOL else ""


def test_the_stack_registry_sits_low_and_the_drivers_are_leaves():
    """The registry (``core/stacks/__init__.py``) imports from the core only the drivers' protocol;
    the drivers are leaves: the registry loads them by name, no other module imports them (one
    stack's modules aside), and they import no module that loads a driver (an install or a bundle
    job is above them, never below)."""
    graph = _core_graph()
    mods = _modules()
    bad = [f"the registry imports {dep}" for dep in sorted(graph[REGISTRY] - {DRIVER_PROTOCOL})]
    dispatchers = {name for name, path in mods.items() if name.startswith(CORE) and name != CORE
                   and any(f"{REGISTRY}.{call}" in _imports(name, path, top_only=False) for call in DISPATCH)}
    drivers = {name for name in graph if _driver_stack(name)}
    assert drivers, "no driver modules found"
    for name, path in mods.items():
        for dep in _imports(name, path, top_only=False):
            if dep in drivers and _driver_stack(dep) != _driver_stack(name):
                bad.append(f"{name} imports the driver module {dep}")
    for name in sorted(drivers):
        bad += [f"{name} imports {dep}, which loads drivers" for dep in sorted(graph[name] & dispatchers)]
    assert not bad, bad


# -- the structure the design promises (issue 24), measured on the source -------------------------
CORE_AND_ABOVE = ("core", "service", "commands", "cli", "compat")
# the one OS access object of detection: LiveSystem reads the live environment for the System protocol
ENV_READERS = {"accelstack.settings", "accelstack.hardware.live",
               "accelstack.compat.torchruntime.configuration"}  # torchruntime's configure(): it sets os.environ
# HTTP: artifacts/ is the network; the engine's client talks to its own worker on 127.0.0.1 and the
# service serves on loopback (neither ever reaches another host)
HTTP_MODULES = ("urllib.request", "http.client", "requests", "urllib3", "httpx")
HTTP_ALLOWED = ("accelstack.artifacts", "accelstack.engine.supervision.client", "accelstack.service")
STACK_NAMES = ("ggml", "torch")
MAX_FUNCTION_IMPORTS = 50
MAX_MODULE_LINES = 400
# value types the CLI may import from below the core (what crosses stages; the core re-exports the rest)
CLI_VALUE_TYPES = ("accelstack.hardware.report", "accelstack.manifests.plan", "accelstack.installer.records",
                   "accelstack.verdict")


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _below_core(name: str) -> bool:
    return _layer(name) not in CORE_AND_ABOVE


def test_nothing_below_the_core_resolves_settings():
    bad = []
    for name, path in _modules().items():
        if not _below_core(name) or name == "accelstack.settings":
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    isinstance(node.func.value, ast.Name) and node.func.value.id == "Settings" and \
                    node.func.attr.startswith("resolve"):
                bad.append(f"{name}:{node.lineno}")
    assert not bad, f"Settings resolved below the core (pass Settings or values down instead): {bad}"


def test_environment_variables_are_read_in_settings_only():
    bad = []
    for name, path in _modules().items():
        if name in ENV_READERS:
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os" \
                    and node.attr in ("environ", "getenv", "environb", "putenv"):
                bad.append(f"{name}:{node.lineno}")
            if isinstance(node, ast.ImportFrom) and node.module == "os" and \
                    any(a.name in ("environ", "getenv") for a in node.names):
                bad.append(f"{name}:{node.lineno}")
    assert not bad, f"environment read outside settings.py: {bad}"


def test_only_artifacts_talks_http():
    bad = []
    for name, path in _modules().items():
        if name.startswith(HTTP_ALLOWED):
            continue
        for node in ast.walk(_tree(path)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(m == h or m.startswith(h + ".") for m in mods for h in HTTP_MODULES):
                bad.append(f"{name}:{node.lineno}")
    assert not bad, f"HTTP outside accelstack.artifacts: {bad}"


def _names_a_stack(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in STACK_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_stack(e) for e in node.elts)
    return False


def test_stacks_are_told_apart_only_by_their_drivers():
    bad = []
    for name, path in _modules().items():
        if name.startswith("accelstack.core.stacks"):
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Compare) and any(_names_a_stack(x) for x in [node.left, *node.comparators]):
                bad.append(f"{name}:{node.lineno}")
    assert not bad, f"stack-name comparisons outside accelstack.core.stacks (ask the stack's driver): {bad}"


def test_the_stack_registry_names_the_domain_stacks():
    from accelstack.core.stacks import STACKS, driver
    from accelstack.domain import STACKS as DOMAIN_STACKS

    assert tuple(STACKS) == tuple(DOMAIN_STACKS)
    for name in STACKS:
        assert driver(name).name == name


def _function_imports(tree: ast.Module) -> List[int]:
    top = {id(n) for n in tree.body}
    for n in tree.body:
        if isinstance(n, (ast.If, ast.Try)):
            top |= {id(m) for m in n.body}
            for h in getattr(n, "handlers", []):
                top |= {id(m) for m in h.body}
    return [n.lineno for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in top]


def test_imports_live_at_module_level():
    counts = {name: len(_function_imports(_tree(path))) for name, path in _modules().items()}
    total = sum(counts.values())
    worst = sorted(((c, n) for n, c in counts.items() if c), reverse=True)[:10]
    assert total <= MAX_FUNCTION_IMPORTS, f"{total} imports inside functions (at most {MAX_FUNCTION_IMPORTS}): {worst}"


def test_no_module_is_over_the_size_limit():
    big = {name: n for name, path in _modules().items()
           if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not big, f"modules over {MAX_MODULE_LINES} lines (split them by role): {big}"


def test_every_public_module_says_what_it_exports():
    missing = [name for name, path in _modules().items()
               if not any(part.startswith("_") for part in name.split(".")[1:])
               and not any(isinstance(n, (ast.Assign, ast.AnnAssign)) and
                           any(isinstance(t, ast.Name) and t.id == "__all__"
                               for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))
                           for n in _tree(path).body)]
    assert not missing, f"modules without __all__: {missing}"


def test_the_cli_imports_only_the_core_and_shared_value_types():
    bottom = tuple(f"accelstack.{b}" for b in BOTTOM)
    bad = {}
    for name, path in _modules().items():
        if _layer(name) not in ("commands", "cli", "service"):
            continue
        wrong = sorted(m for m in _imports(name, path, top_only=False)
                       if m not in ("accelstack", "accelstack.__version__")
                       and _layer(m) not in ("core", "commands", "cli", "service")
                       and not m.startswith(bottom + CLI_VALUE_TYPES))
        if wrong:
            bad[name] = wrong
    assert not bad, f"the CLI and the service reach below the core: {bad}"


# every file written whole (from memory, or streamed: fsio.replacing) goes through accelstack.fsio
RENAMES_ALLOWED = {
    "accelstack.fsio",
    "accelstack.artifacts.partfile",  # a resumable download's .part file, synced as it grows, never replaced whole
}


def test_one_atomic_write():
    bad = []
    for name, path in _modules().items():
        if name in RENAMES_ALLOWED:
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    isinstance(node.func.value, ast.Name) and node.func.value.id == "tempfile" and \
                    node.func.attr == "mkstemp":
                bad.append(f"{name}:{node.lineno} tempfile.mkstemp")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "fsync" \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "os":
                bad.append(f"{name}:{node.lineno} os.fsync")
    assert not bad, f"a file write of its own instead of accelstack.fsio: {bad}"


def test_the_architecture_page_names_what_exists():
    """docs/architecture.md is the design: each module it names exists, its bottom layer is this
    test's, and each registered stack and each core job it names is there."""
    import re

    import accelstack.core
    from accelstack.core.stacks import STACKS

    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:core|hardware|manifests|artifacts|installer|engine|publisher|service|commands)/[a-z_/]+\.py)`", doc))
    named |= {f"core/stacks/{m}" for m in re.findall(r"`(?:core/)?stacks/([a-z_]+\.py)`", doc)}
    missing = sorted(p for p in named if not (PACKAGE / p).is_file() and not (PACKAGE / "core" / p).is_file())
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"
    row = next(line for line in doc.splitlines() if line.startswith("| bottom |"))
    assert set(re.findall(r"`([a-z_]+)`", row.split("|")[2])) == set(BOTTOM)
    for name in STACKS:
        assert f"stacks/{name}.py" in doc
    for job in ("detect", "plan", "install", "upgrade", "repair", "rollback", "uninstall", "gc", "status", "verify", "generate"):
        assert callable(getattr(accelstack.core, job)), job


def test_no_exported_name_is_also_a_submodule():
    """A package's lazy export that shares a submodule's name is replaced by the module as soon as
    the submodule is imported (``accelstack.core.install`` became a module, not the function)."""
    import importlib

    bad = []
    for name, path in _modules().items():
        if path.name != "__init__.py" or "lazy_exports(" not in path.read_text(encoding="utf-8"):
            continue
        subs = {p.stem for p in path.parent.glob("*.py")} | {p.name for p in path.parent.iterdir() if (p / "__init__.py").is_file()}
        exported = set(getattr(importlib.import_module(name), "__all__", ()))
        bad += [f"{name}.{n}" for n in sorted(exported & subs)]
    assert not bad, f"exports named like a submodule of their package: {bad}"


def test_each_layer_owns_its_cache_names():
    """``core/caches.py`` lists and purges every cache, but the names in each are declared by the
    layer that writes them (artifacts, publisher, the engine's probes, hardware, fsio): it gathers
    those patterns and compiles none of its own (issue 43: it restated eleven)."""
    tree = _tree(PACKAGE / "core" / "caches.py")
    own = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
           and isinstance(n.func.value, ast.Name) and n.func.value.id == "re"]
    assert not own, f"core/caches.py compiles name patterns of its own (lines {own}): declare them where the names are made"
