"""Checked reads of manifest fields, each error naming the field's path.

A manifest is often hand-edited by a publisher, so every error says where:
``targets[2].artifacts[0].sha256: missing``. Shared by the envelope, the ggml schema and the
torch matrix, which is why it is a module of its own (none of them imports another's parser).
"""
from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

from packaging.version import InvalidVersion, Version

from ..errors import Action
from ..limits import (
    MAX_DOCUMENT_INT,
    MAX_ID_LENGTH,
    MAX_JSON_BYTES,
    MAX_NAME_LENGTH,
    MAX_TEXT_LENGTH,
    MalformedInput,
    parse_json,
    too_large,
)
from .errors import ManifestFormatError

__all__ = ["CC", "FEATURE", "GFX", "ID", "ID_RULE", "SHA256", "check_file_name", "check_id", "check_text", "decode",
           "describe", "fail", "get", "get_str", "get_str_list", "get_str_map", "get_tiers", "get_version", "join",
           "parse_version", "quote", "read_document"]

# Every pattern ends in \Z, not $: "$" also matches before a trailing newline, so "<64 hex>\n"
# would pass as a hash and then never equal a real digest. ASCII only: \d would match any digit.
SHA256 = re.compile(r"^[0-9a-f]{64}\Z")  # exactly 64 lowercase hex digits, nothing around them
CC = re.compile(r"^[0-9]{1,2}\.[0-9][a-z]?\Z")  # "8.6", "12.0a"
GFX = re.compile(r"^gfx[0-9a-f]{3,4}\Z")
FEATURE = re.compile(r"^[a-z0-9_.]{1,64}\Z")
# Target ids, variant and channel names: lowercase (ids become directory names, and Windows and
# macOS file systems ignore case), no path separators, no NUL, bounded.
ID = re.compile(r"^[a-z0-9][a-z0-9._+-]{0,%d}\Z" % (MAX_ID_LENGTH - 1))
ID_RULE = f"1 to {MAX_ID_LENGTH} characters of a-z, 0-9, '.', '_', '+', '-', starting with a letter or digit"
# File names a manifest installs under: anything a file system takes, but one plain name.
_BAD_FILE_NAME = re.compile(r"[/\\\x00-\x1f]")

_TYPE_NAMES = {str: "a string", int: "an integer", list: "a list", dict: "an object", bool: "true or false"}


def fail(path: str, message: str, hint: Optional[str] = None, *, action: Optional[Action] = None) -> ManifestFormatError:
    """The error for field ``path`` (raise it)."""
    return ManifestFormatError(f"{path}: {message}" if path else message, hint, action=action)


def join(path: str, key: Union[str, int]) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def describe(value: Any) -> str:
    """``value`` in a message: JSON, shortened (a hostile value may be megabytes)."""
    if isinstance(value, str) and len(value) > 64:
        value = value[:64]
    try:
        text = json.dumps(value) if not isinstance(value, (dict, list)) else type(value).__name__
    except ValueError:  # an int of thousands of digits
        text = type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def quote(value: str) -> str:
    """``repr`` of a string for a message, shortened (a hostile value may be megabytes)."""
    return repr(value) if len(value) <= 64 else repr(value[:61]) + "..."


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
    if kind is int and abs(value) > MAX_DOCUMENT_INT:
        raise fail(p, f"{describe(value)} is out of range (at most {MAX_DOCUMENT_INT} either way)")
    return value


def get_str(obj: dict, key: str, path: str, *, required: bool = True, default: str = "",
            choices: Optional[Sequence[str]] = None, pattern: Optional[re.Pattern[str]] = None,
            max_length: int = MAX_TEXT_LENGTH) -> str:
    """``obj[key]`` as a string: no NUL, at most ``max_length`` characters, one of ``choices`` or
    matching ``pattern`` when given."""
    value: str = get(obj, key, path, str, required=required, default=default)
    p = join(path, key)
    check_text(value, p, max_length)
    if required and not value.strip():
        raise fail(p, "must not be empty")
    if value and choices is not None and value not in choices:
        raise fail(p, f"unknown value {quote(value)} (known: {', '.join(choices)})")
    if value and pattern is not None and not pattern.match(value):
        raise fail(p, f"{quote(value)} is not of the expected form")
    return value


def check_text(value: str, path: str, max_length: int = MAX_TEXT_LENGTH) -> str:
    """``value`` if it has no NUL and at most ``max_length`` characters."""
    if len(value) > max_length:
        raise fail(path, f"{len(value)} characters, more than the {max_length} accepted")
    if "\x00" in value:
        raise fail(path, f"{quote(value)} contains a NUL character")
    return value


def check_id(value: str, path: str, what: str = "id") -> str:
    """``value`` if it is a valid id (:data:`ID`), else the error naming ``path``."""
    if not ID.match(value):
        raise fail(path, f"{quote(value)} is not a valid {what} ({ID_RULE})")
    return value


def check_file_name(value: str, path: str) -> str:
    """``value`` if it is one plain file name: no separator, no control character, not . or .."""
    if value in (".", "..") or _BAD_FILE_NAME.search(value) or len(value) > MAX_NAME_LENGTH or value != value.strip():
        raise fail(path, f"{quote(value)} must be a plain file name (at most {MAX_NAME_LENGTH} characters, "
                         "no path separators, control characters or surrounding spaces)")
    return value


def parse_version(text: str, path: str) -> Version:
    if len(text) > MAX_NAME_LENGTH:
        raise fail(path, f"a version of {len(text)} characters is not a version number")
    try:
        return Version(text)
    except (InvalidVersion, ValueError):  # ValueError: int() of thousands of digits
        raise fail(path, f"{quote(text)} is not a version number") from None


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
        check_text(v, join(p, i))
        if pattern is not None and not pattern.match(v):
            raise fail(join(p, i), f"{quote(v)} is not of the expected form")
        if choices is not None and v not in choices:
            raise fail(join(p, i), f"unknown value {quote(v)} (known: {', '.join(choices)})")
    return list(values)


def get_str_map(obj: dict, key: str, path: str, *, required: bool = False) -> Dict[str, str]:
    values = get(obj, key, path, dict, required=required, default={})
    for k, v in values.items():
        if not isinstance(v, str):
            raise fail(join(join(path, key), k), f"expected a string, got {describe(v)}")
        check_text(k, join(path, key), MAX_ID_LENGTH)
        check_text(v, join(join(path, key), k))
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
            if not isinstance(b, str) or b not in backends:
                raise fail(join(p, j), f"unknown backend {quote(b) if isinstance(b, str) else describe(b)} (known: {', '.join(backends)})")
            if b in seen:
                raise fail(join(p, j), f"backend {b!r} is listed twice")
            seen.add(b)
        tiers.append(list(tier))
    return tiers


def decode(data: Union[bytes, str], what: str = "manifest") -> Any:
    """The JSON value of a document's bytes; a format error when it is not UTF-8 JSON, larger
    than :data:`~accelstack.limits.MAX_JSON_BYTES` or nested deeper than ``MAX_DEPTH``."""
    try:
        if isinstance(data, bytes) and len(data) <= MAX_JSON_BYTES:
            try:
                data = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise fail("", f"{what} is not UTF-8 ({exc})") from None
        return parse_json(data, what=what, max_bytes=MAX_JSON_BYTES)
    except MalformedInput as exc:
        raise fail("", exc.message, "get the manifest again from its publisher") from None


def read_document(path: Union[str, Path], max_bytes: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes`` (one more is read to tell).

    Raises ``OSError`` as reading would, and :class:`ManifestFormatError` for a file that is not
    a regular file (a FIFO would block forever) or is too large. Opened non-blocking, so naming a
    FIFO never hangs.
    """
    fd = os.open(str(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise fail("", f"{path} is not a regular file", "name the manifest file itself")
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise fail("", too_large(str(path), len(data), max_bytes),
                   "it is not a manifest accelstack writes; get a fresh copy")
    return data
