"""Layering of the manifests and artifacts stages, beyond the package-wide rules of ``tests/test_layers.py``.

That test checks the pipeline order and import cycles for every module; here, with its import
parser: the fetch stage stands apart from detection and manifests, a sibling module is never
imported inside a function (such an import hides a cycle from the cycle check), and reading a
plan does not load the HTTP stack (in a fresh interpreter).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest
from test_layers import PACKAGE, _imports, _modules  # the one import parser (tests/ is on sys.path)

# artifacts only fetches files named by an ArtifactRef: it knows neither the machine nor the manifests
APART_FROM_ARTIFACTS = ("accelstack.hardware", "accelstack.manifests")


def stage_modules(stage: str) -> Dict[str, Path]:
    pkg = f"accelstack.{stage}"
    return {name: path for name, path in _modules().items() if name == pkg or name.startswith(pkg + ".")}


def test_artifacts_imports_neither_detect_nor_manifests():
    bad = {}
    for name, path in stage_modules("artifacts").items():
        wrong = sorted(m for m in _imports(name, path, top_only=False) if m.startswith(APART_FROM_ARTIFACTS))
        if wrong:
            bad[name] = wrong
    assert not bad, f"artifacts/ imports detection or manifests: {bad}"


@pytest.mark.parametrize("stage", ["manifests", "artifacts"])
def test_no_function_level_imports_of_siblings(stage):
    mods = stage_modules(stage)
    assert len(mods) > 5, mods  # the parser found the stage
    hidden = {}
    for name, path in mods.items():
        late = _imports(name, path, top_only=False) - _imports(name, path, top_only=True, type_checking=True)
        late_siblings = sorted(m for m in late if m in mods and m != name)
        if late_siblings:
            hidden[name] = late_siblings
    assert not hidden, f"function-level imports of sibling modules (they hide cycles): {hidden}"


PROBE = """
import json, sys, types
if {bare}:  # the stage alone: the top-level package's own imports (the core) left out
    root = types.ModuleType("accelstack")
    root.__path__ = [{package!r}]
    sys.modules["accelstack"] = root
import accelstack.manifests.plan
import accelstack.manifests.resolver
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
