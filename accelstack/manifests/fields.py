"""Checked reads of manifest fields, each error naming the field's path.

A manifest is often hand-edited by a publisher, so every error says where:
``targets[2].artifacts[0].sha256: missing``. Shared by the envelope, the ggml schema and the
torch matrix, which is why it is a module of its own (none of them imports another's parser).
"""
from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Optional, Sequence, Union

from packaging.version import InvalidVersion, Version

from ..errors import Action
from .errors import ManifestFormatError

SHA256 = re.compile(r"^[0-9a-f]{64}$")
CC = re.compile(r"^\d{1,2}\.\d[a-z]?$")  # "8.6", "12.0a"
GFX = re.compile(r"^gfx[0-9a-f]{3,4}$")
FEATURE = re.compile(r"^[a-z0-9_.]+$")

_TYPE_NAMES = {str: "a string", int: "an integer", list: "a list", dict: "an object", bool: "true or false"}


def fail(path: str, message: str, hint: Optional[str] = None, *, action: Optional[Action] = None) -> ManifestFormatError:
    """The error for field ``path`` (raise it)."""
    return ManifestFormatError(f"{path}: {message}" if path else message, hint, action=action)


def join(path: str, key: Union[str, int]) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def describe(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, (dict, list)) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def get(obj: dict, key: str, path: str, kind: type, *, required: bool = True, default: Any = None) -> Any:
    """``obj[key]`` checked to be of ``kind``; missing and required -> error naming the field."""
    p = join(path, key)
    if key not in obj or obj[key] is None:
        if required:
            raise fail(p, "missing")
        return default
    value = obj[key]
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        raise fail(p, f"expected {_TYPE_NAMES.get(kind, kind.__name__)}, got {describe(value)}")
    return value


def get_str(obj: dict, key: str, path: str, *, required: bool = True, default: str = "",
            choices: Optional[Sequence[str]] = None, pattern: Optional[re.Pattern[str]] = None) -> str:
    value: str = get(obj, key, path, str, required=required, default=default)
    p = join(path, key)
    if required and not value.strip():
        raise fail(p, "must not be empty")
    if value and choices is not None and value not in choices:
        raise fail(p, f"unknown value {value!r} (known: {', '.join(choices)})")
    if value and pattern is not None and not pattern.match(value):
        raise fail(p, f"{value!r} is not of the expected form")
    return value


def parse_version(text: str, path: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise fail(path, f"{text!r} is not a version number") from None


def get_version(obj: dict, key: str, path: str, *, required: bool = True) -> str:
    """A dotted version string ("12.8", "570.26"), checked to parse."""
    value = get_str(obj, key, path, required=required)
    if value:
        parse_version(value, join(path, key))
    return value


def get_str_list(obj: dict, key: str, path: str, *, required: bool = False,
                 pattern: Optional[re.Pattern[str]] = None, choices: Optional[Sequence[str]] = None) -> List[str]:
    values = get(obj, key, path, list, required=required, default=[])
    p = join(path, key)
    for i, v in enumerate(values):
        if not isinstance(v, str) or not v:
            raise fail(join(p, i), f"expected a non-empty string, got {describe(v)}")
        if pattern is not None and not pattern.match(v):
            raise fail(join(p, i), f"{v!r} is not of the expected form")
        if choices is not None and v not in choices:
            raise fail(join(p, i), f"unknown value {v!r} (known: {', '.join(choices)})")
    return list(values)


def get_str_map(obj: dict, key: str, path: str, *, required: bool = False) -> Dict[str, str]:
    values = get(obj, key, path, dict, required=required, default={})
    for k, v in values.items():
        if not isinstance(v, str):
            raise fail(join(join(path, key), k), f"expected a string, got {describe(v)}")
    return dict(values)


def get_tiers(doc: dict, path: str, backends: Sequence[str], default: Sequence[Sequence[str]]) -> List[List[str]]:
    """``backend_tiers``: groups of equally preferred backends, best first; each known, none listed twice."""
    raw = get(doc, "backend_tiers", path, list, required=False, default=None)
    if raw is None:
        return [list(t) for t in default]
    tiers: List[List[str]] = []
    seen = set()
    for i, tier in enumerate(raw):
        p = join(join(path, "backend_tiers"), i)
        if not isinstance(tier, list) or not tier:
            raise fail(p, f"expected a non-empty list of backends, got {describe(tier)}")
        for j, b in enumerate(tier):
            if b not in backends:
                raise fail(join(p, j), f"unknown backend {b!r} (known: {', '.join(backends)})")
            if b in seen:
                raise fail(join(p, j), f"backend {b!r} is listed twice")
            seen.add(b)
        tiers.append(list(tier))
    return tiers


def decode(data: Union[bytes, str], what: str = "manifest") -> Any:
    """The JSON value of a document's bytes; a format error when it is not UTF-8 JSON."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise fail("", f"{what} is not UTF-8 ({exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise fail("", f"{what} is not valid JSON ({exc})") from None
