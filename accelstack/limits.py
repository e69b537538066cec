"""Bounds for everything accelstack reads that someone else wrote, and bounded parsers for it.

Manifests and signatures come from servers, captures from bug reports, config files from users:
each is size-capped *before* it is parsed and depth-checked after, so hostile input ends in a
typed :class:`MalformedInput` instead of ``RecursionError``, a hang or an exhausted memory.
Stages that need their own typed error catch ``MalformedInput`` and re-raise it as theirs.
"""
from __future__ import annotations

import errno
import json
import math
import os
import stat
from typing import Any, Dict, List, Tuple, Union

from .errors import AccelstackError, Action
from .serde import size_text

__all__ = ["CRASH_LOG_KEEP_SECONDS", "MAX_ARTIFACT_BYTES", "MAX_CAPTURE_FILES", "MAX_CAPTURE_FILE_BYTES",
           "MAX_CFG_SCALE", "MAX_CKPT_PICKLE_BYTES", "MAX_CLIP_SKIP", "MAX_CONFIG_BYTES", "MAX_DATETIME_YEAR",
           "MAX_DEPTH", "MAX_DETECT_CACHE_BYTES", "MAX_DETECT_CACHE_ENTRIES", "MAX_DOCUMENT_INT", "MAX_ID_LENGTH",
           "MAX_JSON_BYTES", "MAX_MODEL_HEADER_BYTES", "MAX_NAME_LENGTH", "MAX_PROMPT_CHARS", "MAX_PROMPT_CHUNKS", "MAX_PROMPT_TOKENS",
           "MAX_SEED", "MAX_SIGNATURES", "MAX_SIGNATURE_BYTES", "MAX_TEXT_LENGTH", "MAX_THREADS", "MAX_VAE_TILE",
           "MAX_ZIP_ENTRIES", "MIN_CLIP_SKIP", "MIN_DATETIME_YEAR", "MIN_SEED", "PROMPT_CHUNK_TOKENS",
           "WORKER_DIR_STALE_SECONDS", "WORKER_MAX_BODY_BYTES", "WORKER_MAX_CONNECTIONS", "WORKER_MAX_HEADER_BYTES",
           "WORKER_MAX_QUERY_CHARS", "WORKER_MAX_UNAUTHENTICATED", "WORKER_SOCKET_TIMEOUT", "MalformedInput",
           "check_depth", "parse_json", "parse_yaml", "read_capped", "read_fd", "sizes_apart", "too_large"]

# Documents (bytes before parsing; nesting levels after).
MAX_JSON_BYTES = 8 * 1024 * 1024  # a signed manifest with every variant is ~100 KB
MAX_SIGNATURE_BYTES = 64 * 1024  # a detached signature envelope: a few keys and signatures
MAX_CONFIG_BYTES = 256 * 1024  # a user's config.yaml
MAX_CAPTURE_FILE_BYTES = 4 * 1024 * 1024  # one replayed probe output, as capped when read live
MAX_DEPTH = 32  # no accelstack document nests deeper than ~6; 32 leaves room and stays far from recursion limits

# Strings.
MAX_ID_LENGTH = 128  # target ids, variant names, channel names
MAX_NAME_LENGTH = 256  # display names (GPU names, versions as text)


def sizes_apart(a: int, b: int) -> Tuple[str, str]:
    """``a`` and ``b`` for people (:func:`~accelstack.serde.size_text`), each with its exact byte
    count added only where the two differ by less than rounding shows (``1.0 MiB`` and ``1.0 MiB``,
    or ``1.0 MiB`` and ``1024 KiB`` two bytes apart)."""
    x, y = size_text(a), size_text(b)
    if a != b and (x == y or abs(a - b) * 100 < max(abs(a), abs(b))):
        return f"{x} ({a:,} bytes)", f"{y} ({b:,} bytes)"
    return x, y


def too_large(what: str, n: int, limit: int, within: str = "accepted") -> str:
    """``"{what} is 1.2 MiB, more than the 1.0 MiB accepted"``: a size refused, in human units; just
    ``"{what} is more than the 1.0 MiB accepted"`` where the two would read the same (a document
    read only up to one byte past its limit, as :func:`read_capped` callers do, is no bigger)."""
    shown, most = size_text(n), size_text(limit)
    if shown == most:
        return f"{what} is more than the {most} {within}"
    return f"{what} is {shown}, more than the {most} {within}"


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
               max_depth: int = MAX_DEPTH, strict: bool = False) -> Any:
    """Parse JSON written by someone else: size-capped first, depth-checked after.

    ``what`` names the document in the error ("manifest https://…", "capture.json"). ``strict``
    (requests to the service) also refuses what Python reads but JSON (RFC 8259) does not hold or
    leaves open: ``NaN``, ``Infinity`` and numbers too large for a float, a key given twice (the
    last would win where a proxy may have checked the first), and lone UTF-16 surrogates (text
    that cannot be written back as UTF-8).
    """
    if len(data) > max_bytes:
        raise MalformedInput(too_large(what, len(data), max_bytes),
                             "it is not a document accelstack writes; get a fresh copy")
    hooks = dict(parse_constant=_not_a_number, parse_float=_finite, object_pairs_hook=_unique_keys) if strict else {}
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
        value = check_depth(json.loads(text, **hooks), what=what, max_depth=max_depth)  # type: ignore[arg-type]
        if strict:  # a lone surrogate, from an escape such as \\ud800, cannot be encoded
            json.dumps(value, ensure_ascii=False).encode("utf-8")
    except RecursionError:
        raise MalformedInput(f"{what} nests too deeply to read",
                             "it is not a document accelstack writes; get a fresh copy") from None
    except (UnicodeError, ValueError) as exc:
        raise MalformedInput(f"{what} is not valid JSON: {str(exc)[:200]}",
                             "get a fresh copy of it") from None
    return value


def _not_a_number(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is too large for a number")
    return value


def _unique_keys(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    value: Dict[str, Any] = {}
    for key, item in pairs:
        if key in value:
            raise ValueError(f"the key {key[:40]!r} is given twice")
        value[key] = item
    return value


def _cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, marked "..." when cut (hostile values flood messages)."""
    return text if len(text) <= limit else text[:limit] + "..."


def parse_yaml(data: Union[str, bytes], *, what: str, max_bytes: int = MAX_CONFIG_BYTES,
               max_depth: int = MAX_DEPTH) -> Any:
    """Parse YAML written by a person: size-capped, no aliases (no billion laughs), depth-checked."""
    import yaml

    if len(data) > max_bytes:
        raise MalformedInput(too_large(what, len(data), max_bytes),
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
                raise MalformedInput(f"{what} uses a YAML alias (*{_cut(str(event.anchor), 40)}) at line "
                                     f"{event.start_mark.line + 1}; aliases are not accepted",
                                     "write the value out in full")
            return super().compose_node(parent, index)

    try:
        value = yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise MalformedInput(f"{what} nests too deeply to read", "a config file needs only a few levels") from None
    except yaml.YAMLError as exc:
        raise MalformedInput(f"{what} is not valid YAML: {str(exc)[:300]}", "fix the file or remove it") from None
    except (ValueError, TypeError, AttributeError, IndexError, KeyError, OverflowError) as exc:
        # PyYAML's constructors let these through for explicit tags with odd values
        # (`!!timestamp x`, an empty `!!float`): the document is malformed, not our code broken
        raise MalformedInput(f"{what} is not valid YAML: a value cannot be constructed ({type(exc).__name__}: {_cut(str(exc), 200)})",
                             "fix the file or remove it") from None
    return check_depth(value, what=what, max_depth=max_depth)

# --- Documents from elsewhere: manifests, signatures, captures (issue 10, documents side) ---
MIN_DATETIME_YEAR = 2000  # an `expires` before this is a typo or an attack on the clock check
MAX_DATETIME_YEAR = 2200  # far past any real expiry, far from datetime's year 9999 overflow
MAX_TEXT_LENGTH = 4096  # any other string of a manifest (a URL, a description, a version range)
MAX_SIGNATURES = 64  # co-signatures in one `.sig`; each costs a signature check
MAX_DOCUMENT_INT = 2 ** 63 - 1  # integers of manifests and captures (versions, sizes, return codes)
MAX_ARTIFACT_BYTES = 1 << 44  # 16 TiB: larger than any model or build, small enough to be a size
MAX_CAPTURE_FILES = 10_000  # probe outputs (files, commands) listed in one capture.json
MAX_DETECT_CACHE_BYTES = 1024 * 1024  # one cached probe answer (the Vulkan enumeration of 16 GPUs is ~10 KB)
MAX_DETECT_CACHE_ENTRIES = 8  # cached Vulkan enumerations kept (one per set of inputs: drivers, environment)

# -- The generation engine's inputs (issue 10, engine) ---------------------------------------------
# Prompts. stable-diffusion.cpp splits a long prompt into 77-token CLIP chunks (75 usable) and
# encodes every chunk, so length is not capped by the encoder; but before tokenizing it runs the
# prompt through a std::regex whose matcher recurses once per character of a run of plain text:
# measured on the CPU build (0.4.7), 10,000 characters of plain text work and 40,000 kill the
# worker with SIGSEGV (and each extra chunk costs a text-encoder pass). 8 chunks (600 tokens, more
# than SD models attend to usefully) at ~4 characters per token is 2,400, rounded to 2,500: four
# times below what was seen to work.
PROMPT_CHUNK_TOKENS = 75  # usable CLIP tokens per 77-token chunk (BOS and EOS take two)
MAX_PROMPT_CHUNKS = 8
MAX_PROMPT_CHARS = 2500  # ~ MAX_PROMPT_CHUNKS * PROMPT_CHUNK_TOKENS * 4 characters per token, rounded
# Characters are not tokens outside ASCII: the CLIP tokenizer is byte-level BPE, so a character
# it has no merge for is one token per UTF-8 byte (3 for CJK, 4 for an emoji), and a run of them
# is one piece whose BPE merging costs grow with the square of its length (2,500 CJK characters,
# one 7,500-byte piece, took 312 s to tokenize; 2,500 ASCII ones 37 s). So prompts are also capped
# in tokens, counted as the tokenizer can at most make them: ASCII at 4 characters a token (the
# rule MAX_PROMPT_CHARS rests on), every other character one token per UTF-8 byte.
MAX_PROMPT_TOKENS = MAX_PROMPT_CHARS // 4  # 625: what MAX_PROMPT_CHARS of ASCII counts; ~8 chunks
# Engine options and generation parameters.
MAX_THREADS = 512  # ggml's GGML_MAX_N_THREADS: its thread pool's arrays hold no more
MAX_VAE_TILE = 512  # latent pixels: one tile as large as the largest image (4096 px / 8)
MAX_CFG_SCALE = 100.0
MIN_CLIP_SKIP, MAX_CLIP_SKIP = -1, 32  # -1 = the model's default; 32 = the deepest SD text encoder (bigG)
MIN_SEED, MAX_SEED = -(2 ** 63), 2 ** 63 - 1  # int64 in stable-diffusion.cpp; < 0 picks a random seed
# The worker's HTTP server (127.0.0.1, one token holder: the supervisor).
WORKER_SOCKET_TIMEOUT = 10.0  # seconds one read or write on a connection may block
WORKER_MAX_UNAUTHENTICATED = 32  # connections that have not yet shown the token; the oldest is dropped
WORKER_MAX_CONNECTIONS = 96  # all connections (the supervisor uses one or two at a time)
WORKER_MAX_HEADER_BYTES = 16 * 1024  # request line + headers; the supervisor sends ~200 bytes
WORKER_MAX_BODY_BYTES = 256 * 1024  # a GenerateRequest: two prompts of MAX_PROMPT_CHARS, JSON-escaped
WORKER_MAX_QUERY_CHARS = 256  # one query value (job ids are 12 hex digits, versions are ints)
# Model files (header checks before stable-diffusion.cpp parses them).
MAX_MODEL_HEADER_BYTES = 64 * 1024 * 1024  # GGUF metadata + tensor table, safetensors JSON header
MAX_CKPT_PICKLE_BYTES = 64 * 1024 * 1024  # data.pkl of a torch zip checkpoint (SD 1.x: ~100 KB)
MAX_ZIP_ENTRIES = 100_000  # a torch checkpoint holds one entry per tensor storage (~1-3 thousand)
# Worker folders in the temp dir: a killed CLI's are removed this long after it died; a crashed
# worker's folder (its log) is kept for CRASH_LOG_KEEP_SECONDS so the message can point at it.
WORKER_DIR_STALE_SECONDS = 10 * 60
CRASH_LOG_KEEP_SECONDS = 7 * 24 * 3600


_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)


def read_capped(path: Union[str, os.PathLike[str]], limit: int) -> bytes:
    """The first ``limit`` bytes of the regular file ``path``; ``OSError`` for anything else.

    Opened without following a symbolic link and without blocking (a FIFO opened for reading
    would wait forever for a writer), then checked to be a regular file before it is read.
    """
    fd = os.open(os.fspath(path), _OPEN_FLAGS)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return read_fd(fd, limit)
    finally:
        os.close(fd)


def read_fd(fd: int, limit: int) -> bytes:
    """At most ``limit`` bytes from the open file ``fd``, read in chunks to its end."""
    chunks: List[bytes] = []
    remaining = limit
    while remaining > 0:
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)
