"""Every module, file and function the docs name exists (issue 43: the docs named core/lifecycle.py,
plan_and_install and install_runtime long after they were gone, and nothing noticed).

Read from docs/*.md, the README and CONTRIBUTING.md, in backticks, as a reader meets them:
- a file path inside the repository (``core/running.py``, ``accelstack/engine/worker/main.py``,
  ``tests/engine/request/test_generate_imports.py``, ``scripts/test.sh``);
- a dotted name that starts at the package or one of its layers (``accelstack.engine.memory.plan``,
  ``engine.probes.model``, ``installer.ggml.runtime_id(plan)``): the longest importable module, then
  each attribute after it.
"""
from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path
from typing import List, Optional

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "accelstack"
DOCS = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md", REPO / "CONTRIBUTING.md"]
LAYERS = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
TOP_DIRS = ("accelstack", "tests", "scripts", "benchmarks", "docs", ".ci")

CODE = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"^(?:\./)?([A-Za-z0-9_.\-/]+\.(?:py|sh|md|json|toml))$")
DOTTED = re.compile(r"^(accelstack(?:\.[A-Za-z_][A-Za-z0-9_]*)+|(?:%s)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?:\(.*\))?$"
                    % "|".join(LAYERS))


def _names(doc: Path) -> List[str]:
    return [m.group(1).strip() for m in CODE.finditer(doc.read_text(encoding="utf-8"))]


def _path_missing(text: str) -> Optional[str]:
    m = PATH.match(text)
    if not m or "*" in text or "<" in text:
        return None
    rel = m.group(1)
    first = rel.split("/", 1)[0]
    if first in TOP_DIRS:
        candidates = [REPO / rel]
    elif first in LAYERS:
        candidates = [PACKAGE / rel]
    elif "/" in rel and rel.split("/", 1)[0] == "stacks":
        candidates = [PACKAGE / "core" / rel]
    else:
        return None  # a file name alone (`config.yaml`, `ggml-manifest.json`): not a path in this repository
    return None if any(c.exists() for c in candidates) else rel


def _dotted_missing(text: str) -> Optional[str]:
    m = DOTTED.match(text)
    if not m:
        return None
    parts = m.group(1).split(".")
    if parts[0] != "accelstack":
        parts = ["accelstack", *parts]
    top = importlib.import_module("accelstack")
    if not hasattr(top, parts[1]) and importlib.util.find_spec(f"accelstack.{parts[1]}") is None:
        return None  # a label that only looks dotted (docs/fleet.md's accelstack.gpu.count)
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(name)
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return f"{'.'.join(parts)} ({name} has no {attr})"
            obj = getattr(obj, attr)
        return None
    return ".".join(parts)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_module_file_and_function_a_doc_names_exists(doc):
    missing = sorted({x for text in _names(doc)
                      for x in (_path_missing(text), _dotted_missing(text)) if x})
    assert not missing, f"{doc.relative_to(REPO)} names what does not exist: {missing}"
