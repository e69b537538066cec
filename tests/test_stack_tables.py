"""Every table keyed by stack names names exactly the domain's stacks (accelstack.domain.STACKS).

A third stack must be added to each such table (docs/architecture.md, "Adding a stack"); one that
names a stack the domain does not have, or misses one it has, is found here on the source instead
of by a KeyError on a user's machine. A table is a dict literal with at least one stack name among
its string keys.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import List, Tuple

from accelstack.domain import STACKS

PACKAGE = Path(__file__).resolve().parents[1] / "accelstack"


def _stack_tables() -> List[Tuple[str, int, set]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
                if keys & set(STACKS):
                    out.append((str(path.relative_to(PACKAGE.parent)), node.lineno, keys))
    return out


def test_the_tables_are_found():
    assert len(_stack_tables()) >= 4  # the registry, the resolver's, the schema's, the knowledge's


def test_every_stack_keyed_table_names_exactly_the_domains_stacks():
    wrong = [f"{where}:{line} {sorted(keys)}" for where, line, keys in _stack_tables() if keys != set(STACKS)]
    assert not wrong, f"stack-keyed tables that do not name exactly {sorted(STACKS)}: {wrong}"
