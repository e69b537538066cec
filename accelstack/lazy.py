"""Names a package exports but imports only on first use, so a command pays for what it runs.

    __getattr__ = lazy_exports(__name__, {"fetch": ".batch", ...}, globals())

Each name is imported from its module (absolute, or relative to the package) when first read and
then kept in the package's namespace, so later reads cost nothing.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, Mapping

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str], namespace: Dict[str, Any]) -> Callable[[str], Any]:
    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    return __getattr__
