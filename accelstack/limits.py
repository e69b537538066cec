"""Bounds for everything accelstack reads that someone else wrote, and bounded parsers for it.

Manifests and signatures come from servers, captures from bug reports, config files from users:
each is size-capped *before* it is parsed and depth-checked after, so hostile input ends in a
typed :class:`MalformedInput` instead of ``RecursionError``, a hang or an exhausted memory.
Stages that need their own typed error catch ``MalformedInput`` and re-raise it as theirs.
"""
from __future__ import annotations

import json
from typing import Any, List, Tuple, Union

from .errors import AccelstackError, Action

# Documents (bytes before parsing; nesting levels after).
MAX_JSON_BYTES = 8 * 1024 * 1024  # a signed manifest with every variant is ~100 KB
MAX_SIGNATURE_BYTES = 64 * 1024  # a detached signature envelope: a few keys and signatures
MAX_CONFIG_BYTES = 256 * 1024  # a user's config.yaml
MAX_CAPTURE_FILE_BYTES = 4 * 1024 * 1024  # one replayed probe output, as capped when read live
MAX_DEPTH = 32  # no accelstack document nests deeper than ~6; 32 leaves room and stays far from recursion limits

# Strings.
MAX_ID_LENGTH = 128  # target ids, variant names, channel names
MAX_NAME_LENGTH = 256  # display names (GPU names, versions as text)


class MalformedInput(AccelstackError):
    """A document written by someone else is too large, too deep, or not what it claims to be."""

    default_action = Action.FIX_INPUT


def _depth(value: Any, limit: int) -> int:
    """The nesting depth of parsed JSON/YAML, without recursion (a hostile document may be deep)."""
    deepest = 0
    stack: List[Tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            if deepest > limit:
                return deepest
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, level + 1) for child in children)
    return deepest


def check_depth(value: Any, *, what: str, max_depth: int = MAX_DEPTH) -> Any:
    """``value`` itself, or :class:`MalformedInput` if it nests deeper than ``max_depth``."""
    if _depth(value, max_depth) > max_depth:
        raise MalformedInput(f"{what} nests deeper than {max_depth} levels",
                             "it is not a document accelstack writes; get a fresh copy")
    return value


def parse_json(data: Union[str, bytes], *, what: str, max_bytes: int = MAX_JSON_BYTES,
               max_depth: int = MAX_DEPTH) -> Any:
    """Parse JSON written by someone else: size-capped first, depth-checked after.

    ``what`` names the document in the error ("manifest https://…", "capture.json").
    """
    if len(data) > max_bytes:
        raise MalformedInput(f"{what} is {len(data)} bytes, more than the {max_bytes} accepted",
                             "it is not a document accelstack writes; get a fresh copy")
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
        value = json.loads(text)
    except RecursionError:
        raise MalformedInput(f"{what} nests too deeply to read",
                             "it is not a document accelstack writes; get a fresh copy") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise MalformedInput(f"{what} is not valid JSON: {str(exc)[:200]}",
                             "get a fresh copy of it") from None
    return check_depth(value, what=what, max_depth=max_depth)


def parse_yaml(data: Union[str, bytes], *, what: str, max_bytes: int = MAX_CONFIG_BYTES,
               max_depth: int = MAX_DEPTH) -> Any:
    """Parse YAML written by a person: size-capped, no aliases (no billion laughs), depth-checked."""
    import yaml

    if len(data) > max_bytes:
        raise MalformedInput(f"{what} is {len(data)} bytes, more than the {max_bytes} accepted",
                             "a config file needs only a few lines")
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    except UnicodeDecodeError:
        raise MalformedInput(f"{what} is not UTF-8 text", "save it as UTF-8 text") from None
    if "\x00" in text:
        raise MalformedInput(f"{what} contains NUL bytes; it is not a text file", "save it as UTF-8 text")

    class _NoAliasLoader(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise MalformedInput(f"{what} uses a YAML alias (*{event.anchor}) at line "
                                     f"{event.start_mark.line + 1}; aliases are not accepted",
                                     "write the value out in full")
            return super().compose_node(parent, index)

    try:
        value = yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise MalformedInput(f"{what} nests too deeply to read", "a config file needs only a few levels") from None
    except yaml.YAMLError as exc:
        raise MalformedInput(f"{what} is not valid YAML: {str(exc)[:300]}", "fix the file or remove it") from None
    return check_depth(value, what=what, max_depth=max_depth)

# --- Documents from elsewhere: manifests, signatures, captures (issue 10, documents side) ---
MIN_DATETIME_YEAR = 2000  # an `expires` before this is a typo or an attack on the clock check
MAX_DATETIME_YEAR = 2200  # far past any real expiry, far from datetime's year 9999 overflow
MAX_TEXT_LENGTH = 4096  # any other string of a manifest (a URL, a description, a version range)
MAX_SIGNATURES = 64  # co-signatures in one `.sig`; each costs a signature check
MAX_DOCUMENT_INT = 2 ** 63 - 1  # integers of manifests and captures (versions, sizes, return codes)
MAX_ARTIFACT_BYTES = 1 << 44  # 16 TiB: larger than any model or build, small enough to be a size
MAX_CAPTURE_FILES = 10_000  # probe outputs (files, commands) listed in one capture.json
