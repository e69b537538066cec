"""Dataclass <-> JSON, strict on the way in.

Every value that crosses a pipeline stage is a dataclass; ``to_dict``/``from_dict`` make it
JSON, and back, so each stage can be run and tested alone. Loading checks types and names
the offending field, because these documents are often hand-edited or attached to bug reports.

Annotations must use ``typing`` forms (``Optional[int]``, ``List[str]``) so Python 3.9 can
evaluate them.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import typing
from typing import Any, Dict, Type, TypeVar, Union

from .errors import SerializationError

__all__ = ["T", "to_dict", "from_dict", "dumps", "loads", "size_text", "plural"]

T = TypeVar("T")

_HINTS: Dict[type, Dict[str, Any]] = {}


def size_text(n: float) -> str:
    """A number of bytes for people, in the one unit family messages use (binary: ``512 B``,
    ``3.4 KiB``, ``79 MiB``, ``4.1 GiB``); JSON keeps the byte counts themselves."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{value:.0f} B"
            return f"{value:.1f} {unit}" if abs(value) < 100 else f"{value:.0f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def plural(n: int, word: str, many: str = "") -> str:
    """``1 file``, ``2 files`` (``many`` for words that do not just take an s)."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def _hints(cls: type) -> Dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def to_dict(obj: Any) -> Any:
    """Turn a dataclass (recursively) into plain JSON-able data."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        for name in getattr(type(obj), "__derived__", ()):  # read-only properties shown in JSON
            out[name] = to_dict(getattr(obj, name))
        return out
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_dict(v) for k, v in obj.items()}
    return obj


def from_dict(cls: Type[T], data: Any, path: str = "") -> T:
    """Build ``cls`` from plain data, checking types; unknown keys are ignored (forward compat).

    Properties a class lists in ``__derived__`` are written by :func:`to_dict` and ignored here,
    since they are computed from the fields."""
    return _convert(cls, data, path or cls.__name__)


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin is Union:
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, path)
            except SerializationError as exc:
                errors.append(exc)
        raise errors[0] if errors else SerializationError(f"{path}: unexpected null")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise SerializationError(f"{path}: expected an object, got {type(value).__name__}")
        kwargs: Dict[str, Any] = {}
        hints = _hints(tp)
        for f in dataclasses.fields(tp):
            if not f.init:
                continue
            if f.name in value:
                kwargs[f.name] = _convert(hints[f.name], value[f.name], f"{path}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise SerializationError(f"{path}.{f.name}: required field is missing")
        return tp(**kwargs)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            allowed = ", ".join(str(m.value) for m in tp)
            raise SerializationError(f"{path}: {value!r} is not one of {allowed}") from None
    if origin in (list, typing.List, tuple):
        if not isinstance(value, list):
            raise SerializationError(f"{path}: expected a list, got {type(value).__name__}")
        item = args[0] if args else Any
        return [_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin in (dict, typing.Dict):
        if not isinstance(value, dict):
            raise SerializationError(f"{path}: expected an object, got {type(value).__name__}")
        vt = args[1] if len(args) == 2 else Any
        return {k: _convert(vt, v, f"{path}.{k}") for k, v in value.items()}
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SerializationError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SerializationError(f"{path}: expected an integer, got {value!r}")
        return value
    if tp in (str, bool):
        if not isinstance(value, tp):
            raise SerializationError(f"{path}: expected {tp.__name__}, got {value!r}")
        return value
    return value


def dumps(obj: Any) -> str:
    return json.dumps(to_dict(obj), indent=2, sort_keys=False)


def loads(cls: Type[T], text: str, what: str = "") -> T:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SerializationError(f"{what or cls.__name__}: not valid JSON ({exc})") from None
    return from_dict(cls, data)
