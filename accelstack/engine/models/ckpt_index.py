"""The tensors a torch zip checkpoint's ``data.pkl`` declares, read without unpickling anything.

:mod:`~accelstack.engine.models.ckpt_check` has already checked the archive and decoded its pickle as
opcodes; here a small stack machine follows those opcodes far enough to learn each tensor's
name, shape and storage type (``torch._utils._rebuild_tensor_v2`` calls and the persistent ids
of their storages). Nothing is imported or called: a ``GLOBAL`` stays a pair of names and a
``REDUCE`` becomes a record of what it would have built. An opcode it does not follow ends the
reading with ``None`` (the caller then says the names could not be read safely).

Nothing read from the pickle is ever passed to ``repr`` or ``str``: memo GETs let 400 bytes build a
list holding 2^40 copies of another, which a ``repr`` would expand. Keys are kept only when they are
text or int64 integers, and the work is bounded by ``MAX_OPS`` opcodes and one visit of each dict.
"""
from __future__ import annotations

import pickletools
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

from ..errors import ModelLoadError
from .ckpt_check import MAX_PICKLE_OPS, ZIP_ERRORS, read_pickle
from .reader import INT64_MAX, TensorInfo, damaged, is_int, open_regular, reading, text_of

__all__ = ["checkpoint_index", "STORAGE_DTYPES"]

# torch storage class -> safetensors dtype name (torch/storage.py's legacy typed storages)
STORAGE_DTYPES = {"HalfStorage": "F16", "FloatStorage": "F32", "BFloat16Storage": "BF16", "DoubleStorage": "F64",
                  "LongStorage": "I64", "IntStorage": "I32", "ByteStorage": "U8", "CharStorage": "I8",
                  "BoolStorage": "BOOL", "ShortStorage": "I16"}
_REBUILD = {("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_tensor")}
MAX_OPS = MAX_PICKLE_OPS  # far above a real checkpoint's pickle (an SD 1.x one has ~60 k opcodes)
MAX_DIMS = 8  # a diffusion checkpoint's tensors have at most 5; a longer size is not a weight
MAX_DTYPE_NAME = 40
OTHER_KEY = "?"  # a dict key that is neither text nor an int64: never turned into text


class _Mark:
    pass


class _Global:
    def __init__(self, module: str, attr: str) -> None:
        self.module, self.attr = module, attr


class _Tensor:
    def __init__(self, shape: Tuple[int, ...], dtype: str) -> None:
        self.shape, self.dtype = shape, dtype


_MARK = _Mark()
_SIMPLE = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False, "EMPTY_TUPLE": (), "EMPTY_LIST": None}
_VALUES = ("BININT", "BININT1", "BININT2", "LONG1", "LONG4", "LONG", "INT", "BINFLOAT", "FLOAT", "BINUNICODE",
           "SHORT_BINUNICODE", "UNICODE", "BINUNICODE8", "BINSTRING", "SHORT_BINSTRING", "STRING", "BINBYTES",
           "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8")


def checkpoint_index(path: Path) -> Optional[List[TensorInfo]]:
    """The tensors of the checkpoint at ``path`` (already checked by ``check_model``), or None
    when its pickle uses something this reader does not follow; ``ModelLoadError`` when the archive
    cannot be read (it changed since the check)."""
    fh, _size = open_regular(path)
    with fh, reading(path):
        try:
            with zipfile.ZipFile(fh) as archive:
                pickles = [info for info in archive.infolist() if info.filename.endswith("data.pkl")]
                if len(pickles) != 1:
                    return None
                data = read_pickle(path, archive, pickles[0])
        except ModelLoadError:
            raise
        except ZIP_ERRORS as exc:  # the file changed since it was checked, or its entry lies about its size
            raise damaged(path, "checkpoint", f"its zip archive is broken ({str(exc)[:100]})") from None
    try:
        root = _run(data)
    except (ValueError, IndexError, KeyError, TypeError, AttributeError, RecursionError, MemoryError):
        return None
    out: List[TensorInfo] = []
    _collect(root, out, depth=0, seen=set())
    return out


def _run(data: bytes) -> Any:
    stack: List[Any] = []
    memo: Dict[int, Any] = {}
    for n, (op, arg, _pos) in enumerate(pickletools.genops(data)):
        name = op.name
        if n > MAX_OPS:
            raise ValueError("too many opcodes")
        if name == "PROTO" or name == "FRAME":
            continue
        if name == "STOP":
            return stack.pop()
        if name in _VALUES:
            stack.append(arg)
        elif name in _SIMPLE:
            stack.append([] if name == "EMPTY_LIST" else _SIMPLE[name])
        elif name == "EMPTY_DICT":
            stack.append({})
        elif name == "EMPTY_SET":
            stack.append(None)  # a set holds no tensors we name
        elif name in ("ADDITEMS", "POP_MARK"):
            _pop_mark(stack)
        elif name == "FROZENSET":
            _pop_mark(stack)
            stack.append(None)
        elif name == "DUP":
            stack.append(stack[-1])
        elif name == "NEWOBJ_EX":
            del stack[-3:]
            stack.append(None)
        elif name == "MARK":
            stack.append(_MARK)
        elif name in ("TUPLE", "LIST", "DICT", "APPENDS", "SETITEMS"):
            items = _pop_mark(stack)
            if name == "TUPLE":
                stack.append(tuple(items))
            elif name == "LIST":
                stack.append(items)
            elif name == "APPENDS":
                stack[-1].extend(items)
            else:
                target = {} if name == "DICT" else stack[-1]
                for i in range(0, len(items) - 1, 2):
                    target[_key(items[i])] = items[i + 1]
                if name == "DICT":
                    stack.append(target)
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            k = int(name[-1])
            items = stack[-k:]
            del stack[-k:]
            stack.append(tuple(items))
        elif name == "SETITEM":
            value, key = stack.pop(), stack.pop()
            stack[-1][_key(key)] = value
        elif name == "APPEND":
            value = stack.pop()
            stack[-1].append(value)
        elif name == "GLOBAL":
            module, _, attr = arg.partition(" ") if isinstance(arg, str) else ("", "", "")
            stack.append(_Global(module, attr))
        elif name == "STACK_GLOBAL":
            attr, module = stack.pop(), stack.pop()
            if not isinstance(module, str) or not isinstance(attr, str):
                raise ValueError("STACK_GLOBAL of something that is not text")  # pickle refuses it too
            stack.append(_Global(module, attr))
        elif name == "BINPERSID":
            stack.append(("persid", stack.pop()))
        elif name in ("REDUCE", "NEWOBJ"):
            args, func = stack.pop(), stack.pop()
            stack.append(_reduce(func, args))
        elif name == "BUILD":
            stack.pop()  # an object's state: not needed for names and shapes
        elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
            memo[_index(arg)] = stack[-1]
        elif name == "MEMOIZE":
            memo[len(memo)] = stack[-1]
        elif name in ("BINGET", "LONG_BINGET", "GET"):
            stack.append(memo[_index(arg)])
        elif name == "POP":
            stack.pop()
        else:
            raise ValueError(f"opcode {name} is not followed")
    raise ValueError("no STOP")


def _index(arg: Any) -> int:
    if not isinstance(arg, int):
        raise ValueError("memo index is not an integer")
    return arg


def _pop_mark(stack: List[Any]) -> List[Any]:
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is _MARK:
            items = stack[i + 1:]
            del stack[i:]
            return items
    raise ValueError("no MARK")


def _key(value: Any) -> Any:
    """A dict key as a name: text, or an int64 (a huge int's digits cost quadratic time); anything
    else, a list holding 2^40 copies perhaps, is one placeholder, never hashed nor turned into text."""
    if isinstance(value, str) or (is_int(value) and -INT64_MAX - 1 <= value <= INT64_MAX):
        return value
    return OTHER_KEY


def _reduce(func: Any, args: Any) -> Any:
    if isinstance(func, _Global) and (func.module, func.attr) in _REBUILD and isinstance(args, tuple) and len(args) >= 3:
        storage, size = args[0], args[2]
        dtype = "unknown"
        if isinstance(storage, tuple) and len(storage) == 2 and isinstance(storage[1], tuple) and len(storage[1]) > 1:
            kind = storage[1][1]
            if isinstance(kind, _Global):
                dtype = STORAGE_DTYPES.get(kind.attr, text_of(kind.attr[:MAX_DTYPE_NAME]))
        # torch sizes are int64: a larger dimension is no tensor (and no huge product is ever formed)
        if isinstance(size, tuple) and len(size) <= MAX_DIMS and all(is_int(d) and 0 <= d <= INT64_MAX for d in size):
            return _Tensor(size, dtype)
    if isinstance(func, _Global) and func.attr == "OrderedDict":
        return {}
    return None


def _collect(node: Any, out: List[TensorInfo], depth: int, seen: Set[int]) -> None:
    """Tensors in nested dicts, named by their key in the dict that holds them (the state dict).
    Each dict is visited once: memo GETs can make a dict hold itself under many keys."""
    if not isinstance(node, dict) or depth > 4 or id(node) in seen:
        return
    seen.add(id(node))
    for key, value in node.items():
        if isinstance(value, _Tensor):
            out.append(TensorInfo(text_of(key) if isinstance(key, str) else str(key), value.shape, value.dtype))
        else:
            _collect(value, out, depth + 1, seen)
