"""Check a model path before any process starts, so a bad file gets a reason, not a crash.

stable-diffusion.cpp reports a model it cannot read as a NULL context (the bindings then raise
an opaque "NULL pointer access") or, for some corrupt files, crashes: its safetensors reader
converts JSON values with exceptions nobody catches (a shape that is not a list, a dtype that is
not text), its fallback GGUF reader allocates whatever a header claims (2^62 tensors, a 2^62-byte
name), and its zip reader trusts the archive's directory. Everything this module can see in the
headers is checked here, with the file's own size as the bound, reading headers only (never whole
files, at most ``MAX_MODEL_HEADER_BYTES``), and only from regular files: a FIFO, a device or a
socket is refused without being opened for reading (opening a FIFO blocks forever).
"""
from __future__ import annotations

import io
import os
import pickletools
import stat
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Dict, List, Tuple, Union

from ..limits import MAX_CKPT_PICKLE_BYTES, MAX_MODEL_HEADER_BYTES, MAX_ZIP_ENTRIES, MalformedInput, parse_json
from .errors import ModelLoadError
from .probe_layout import probe_weights

KINDS = ("safetensors", "gguf", "ckpt", "diffusers")
DIFFUSERS_PARTS = ("unet/diffusion_pytorch_model.safetensors", "vae/diffusion_pytorch_model.safetensors",
                   "text_encoder/model.safetensors")
MAX_HEADER = 100 << 20  # safetensors caps its JSON header at 100 MB (we read at most MAX_MODEL_HEADER_BYTES)

# safetensors dtypes stable-diffusion.cpp reads (U8 tensors it skips), with their item sizes.
SAFETENSORS_DTYPES = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1, "I32": 4, "I64": 8,
                      "U8": 1}
SD_MAX_DIMS = 5  # stable-diffusion.cpp folds a 5-dim safetensors tensor into 4

# GGUF: ggml type id -> (elements per block, bytes per block), from ggml 0.4.7's type traits.
GGML_TYPES: Dict[int, Tuple[int, int]] = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 36),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
    16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82),
    23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2),
    34: (256, 54), 35: (256, 66), 39: (32, 17), 40: (64, 36)}
GGUF_VERSIONS = (2, 3)  # ggml refuses 1; the fallback reader would take anything
GGUF_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # KV type -> bytes
GGUF_STRING, GGUF_ARRAY, GGUF_UINT32 = 8, 9, 4
GGML_MAX_NAME = 64  # ggml's tensor name buffer (with its NUL)
GGML_MAX_DIMS = 4
GGUF_MAX_KEY = 4096  # the fallback reader's own key limit
GGUF_DEFAULT_ALIGNMENT = 32
# Smallest possible entries, to bound the counts a header claims by the file's size.
GGUF_MIN_TENSOR_INFO = 8 + 1 + 4 + 8 + 4 + 8  # name length, 1-byte name, n_dims, one dim, type, offset
GGUF_MIN_KV = 8 + 1 + 4 + 1  # key length, 1-byte key, type, 1-byte value
INT64_MAX = 2 ** 63 - 1
TORCH_LEGACY_PICKLES = 5  # magic number, protocol, sys info, the state, storage keys


@dataclass
class ModelFile:
    path: str
    kind: str  # one of KINDS
    size_bytes: int
    tensors: int = 0  # tensors found in the headers (0 for legacy pickles)


def _fail(path: Path, reason: str, hint: str = "") -> ModelLoadError:
    return ModelLoadError(f"cannot load model {path}: {reason}",
                          hint=hint or "check the file (re-download it if it is damaged) and pass a .safetensors, "
                          ".gguf or .ckpt file or a diffusers folder")


def _damaged(path: Path, kind: str, reason: str) -> ModelLoadError:
    return _fail(path, f"damaged {kind} file: {reason}")


def _open_regular(path: Path) -> Tuple[BinaryIO, int]:
    """Open ``path`` for reading only if it is a regular file; (file, size). ``O_NONBLOCK`` makes
    opening a FIFO that replaced the file since the stat return at once; fstat then refuses it."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise _fail(path, f"cannot read it: {exc.strerror or exc}", hint="check the file's permissions") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _fail(path, "it is not a regular file", hint="pass a model file, not a pipe, device or socket")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), st.st_size
    except BaseException:
        os.close(fd)
        raise


# -- safetensors --------------------------------------------------------------------------------
def _safetensors_tensors(path: Path) -> int:
    fh, size = _open_regular(path)
    with fh:
        head = fh.read(8)
        if len(head) < 8:
            raise _fail(path, f"not a safetensors file: only {size} bytes")
        (n,) = struct.unpack("<Q", head)
        if n == 0 or n > MAX_HEADER or 8 + n > size:
            raise _fail(path, f"not a valid safetensors file: header length {n} does not fit a {size}-byte file "
                        "(the file is truncated or not safetensors)")
        if n > MAX_MODEL_HEADER_BYTES:
            raise _fail(path, f"its safetensors header is {n} bytes, more than the {MAX_MODEL_HEADER_BYTES} accepted")
        raw = fh.read(n)
    if raw[:1] != b"{":
        raise _fail(path, "not a valid safetensors file: its header is not JSON")
    try:
        header = parse_json(raw, what="its safetensors header", max_bytes=MAX_MODEL_HEADER_BYTES, max_depth=4)
    except MalformedInput:
        raise _fail(path, "not a valid safetensors file: its header is not JSON") from None
    if not isinstance(header, dict):
        raise _fail(path, "not a valid safetensors file: its header is not a JSON object")
    data_len = size - 8 - n
    count = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        _check_safetensor(path, name, info, data_len)
        count += 1
    if count == 0:
        raise _fail(path, "the safetensors file holds no tensors")
    return count


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_safetensor(path: Path, name: str, info: object, data_len: int) -> None:
    """One tensor entry, as stable-diffusion.cpp will read it (it throws on wrong JSON types)."""
    shown = repr(name[:60])
    if not isinstance(info, dict):
        raise _damaged(path, "safetensors", f"the entry of tensor {shown} is not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPES:
        raise _damaged(path, "safetensors", f"tensor {shown} has dtype {str(dtype)[:20]!r}, which stable-diffusion.cpp "
                       f"does not read (it reads {', '.join(SAFETENSORS_DTYPES)})")
    if (not isinstance(shape, list) or len(shape) > SD_MAX_DIMS
            or not all(_is_int(d) and 0 <= d <= INT64_MAX for d in shape)):
        raise _damaged(path, "safetensors", f"tensor {shown} has an invalid shape (it must be a list of at most "
                       f"{SD_MAX_DIMS} non-negative integers)")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data_len):
        raise _damaged(path, "safetensors", f"tensor {shown} lies outside the file ({data_len} data bytes); "
                       "the file is probably truncated")
    elements = 1
    for d in shape:
        elements *= d
        if elements > data_len:  # stays small: no product of huge dimensions is ever formed
            break
    if elements * SAFETENSORS_DTYPES[dtype] != offsets[1] - offsets[0]:
        raise _damaged(path, "safetensors", f"tensor {shown} has shape {shape[:SD_MAX_DIMS]} of {dtype} but "
                       f"{offsets[1] - offsets[0]} bytes of data")


# -- GGUF -----------------------------------------------------------------------------------------
class _Cursor:
    """Reads little-endian values from the in-memory header, never past its end."""

    def __init__(self, data: bytes, path: Path, complete: bool) -> None:
        self.data, self.pos, self.path, self.complete = data, 0, path, complete

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            if self.complete:
                raise _damaged(self.path, "GGUF", "its header runs past the end of the file (truncated?)")
            raise _fail(self.path, f"its GGUF header is larger than the {MAX_MODEL_HEADER_BYTES} bytes accepted")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def u32(self) -> int:
        return int(struct.unpack("<I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack("<Q", self.take(8))[0])

    def string(self, limit: int, what: str) -> bytes:
        n = self.u64()
        if n > limit:
            raise _damaged(self.path, "GGUF", f"{what} is {n} bytes long, more than the {limit} allowed")
        return self.take(n)


def _gguf_tensors(path: Path, fh: BinaryIO, size: int) -> int:
    data = fh.read(MAX_MODEL_HEADER_BYTES)
    cur = _Cursor(data, path, complete=size <= MAX_MODEL_HEADER_BYTES)
    cur.take(4)  # the magic
    version = cur.u32()
    if version not in GGUF_VERSIONS:
        raise _fail(path, f"GGUF version {version} is not supported (only {' and '.join(map(str, GGUF_VERSIONS))})")
    n_tensors, n_kv = cur.u64(), cur.u64()
    room = max(0, size - 24)
    if n_tensors > room // GGUF_MIN_TENSOR_INFO:
        raise _damaged(path, "GGUF", f"it claims {n_tensors} tensors, more than a {size}-byte file can hold")
    if n_kv > room // GGUF_MIN_KV:
        raise _damaged(path, "GGUF", f"it claims {n_kv} metadata entries, more than a {size}-byte file can hold")
    alignment = GGUF_DEFAULT_ALIGNMENT
    for _ in range(n_kv):
        key = cur.string(GGUF_MAX_KEY, "a metadata key")
        kind = cur.u32()
        if key == b"general.alignment":
            value = cur.u32() if kind == GGUF_UINT32 else 0
            if value <= 0 or value & (value - 1):
                raise _damaged(path, "GGUF", "general.alignment is not a power of two (as a uint32)")
            alignment = value
            continue
        _skip_gguf_value(cur, kind, nested=False)
    tensors: List[Tuple[int, int]] = []
    for _ in range(n_tensors):
        name = cur.string(GGML_MAX_NAME - 1, "a tensor name")
        shown = repr(name[:GGML_MAX_NAME].decode("utf-8", "replace"))
        n_dims = cur.u32()
        if not 1 <= n_dims <= GGML_MAX_DIMS:
            raise _damaged(path, "GGUF", f"tensor {shown} has {n_dims} dimensions (1 to {GGML_MAX_DIMS} allowed)")
        dims = [cur.u64() for _ in range(n_dims)]
        ggml_type, offset = cur.u32(), cur.u64()
        if any(d > INT64_MAX for d in dims):
            raise _damaged(path, "GGUF", f"tensor {shown} has a negative dimension")
        if ggml_type not in GGML_TYPES:
            raise _damaged(path, "GGUF", f"tensor {shown} has an unknown type {ggml_type}")
        block, block_bytes = GGML_TYPES[ggml_type]
        if dims[0] % block:
            raise _damaged(path, "GGUF", f"tensor {shown}: its first dimension {dims[0]} is not a multiple of its "
                           f"type's block of {block}")
        elements = 1
        for d in dims:
            elements *= d
        if elements > INT64_MAX:
            raise _damaged(path, "GGUF", f"tensor {shown} has more elements than ggml can count")
        if offset % alignment:
            raise _damaged(path, "GGUF", f"tensor {shown} is not aligned to {alignment} bytes")
        tensors.append((offset, elements // block * block_bytes))
    data_start = -(-cur.pos // alignment) * alignment
    for offset, nbytes in tensors:
        if data_start + offset + nbytes > size:
            raise _damaged(path, "GGUF", f"a tensor's data ({nbytes} bytes at {data_start + offset}) lies outside "
                           f"the {size}-byte file; the file is probably truncated")
    return n_tensors


def _skip_gguf_value(cur: _Cursor, kind: int, nested: bool) -> None:
    if kind in GGUF_SCALARS:
        cur.take(GGUF_SCALARS[kind])
    elif kind == GGUF_STRING:
        cur.string(len(cur.data), "a metadata string")
    elif kind == GGUF_ARRAY and not nested:
        elem, count = cur.u32(), cur.u64()
        if elem in GGUF_SCALARS:
            cur.take(count * GGUF_SCALARS[elem] if count <= len(cur.data) else -1)
        elif elem == GGUF_STRING:
            if count > (len(cur.data) - cur.pos) // 8:
                cur.take(-1)
            for _ in range(count):
                cur.string(len(cur.data), "a metadata string")
        else:
            raise _damaged(cur.path, "GGUF", f"a metadata array has elements of type {elem} (arrays of arrays "
                           "are not read)")
    else:
        raise _damaged(cur.path, "GGUF", f"a metadata value has an unknown type {kind}")


# -- torch checkpoints ------------------------------------------------------------------------------
ZIP_EOCD, ZIP64_LOCATOR, ZIP64_EOCD = b"PK\x05\x06", b"PK\x06\x07", b"PK\x06\x06"


def _zip_directory(path: Path, fh: BinaryIO, size: int) -> Tuple[int, int, int]:
    """(entries, central directory offset, its size) from the end records, checked against the
    file before :mod:`zipfile` reads the directory (it would read whatever size is claimed)."""
    tail_len = min(size, 22 + 65535)
    fh.seek(size - tail_len)
    tail = fh.read(tail_len)
    at = tail.rfind(ZIP_EOCD)
    if at < 0 or at + 22 > len(tail):
        raise _damaged(path, "checkpoint", "it starts like a zip archive but has no zip directory")
    entries, cd_size, cd_offset = struct.unpack("<6xHII", tail[at + 4:at + 20])
    if entries == 0xFFFF or 0xFFFFFFFF in (cd_size, cd_offset):  # zip64: the real values are elsewhere
        loc = tail.rfind(ZIP64_LOCATOR, 0, at)
        if loc < 0 or loc + 20 > len(tail):
            raise _damaged(path, "checkpoint", "its zip64 directory locator is missing")
        (eocd64,) = struct.unpack("<Q", tail[loc + 8:loc + 16])
        if eocd64 + 56 > size:
            raise _damaged(path, "checkpoint", "its zip64 directory lies outside the file")
        fh.seek(eocd64)
        rec = fh.read(56)
        if rec[:4] != ZIP64_EOCD:
            raise _damaged(path, "checkpoint", "its zip64 directory record is missing")
        entries, cd_size, cd_offset = struct.unpack("<QQQ", rec[32:56])
    if entries > MAX_ZIP_ENTRIES:
        raise _damaged(path, "checkpoint", f"its zip directory lists {entries} entries, more than the "
                       f"{MAX_ZIP_ENTRIES} accepted")
    if cd_offset + cd_size > size or cd_size > MAX_MODEL_HEADER_BYTES:
        raise _damaged(path, "checkpoint", "its zip directory lies outside the file")
    return entries, cd_offset, cd_size


def _check_pickles(path: Path, data: bytes, count: int, complete: bool) -> None:
    """``count`` consecutive pickles in ``data`` decode as opcodes (nothing is unpickled)."""
    stream = io.BytesIO(data)
    try:
        for _ in range(count):
            for _op in pickletools.genops(stream):
                pass
    except (ValueError, KeyError, struct.error, UnicodeDecodeError, OverflowError, IndexError, TypeError):
        if not complete:
            raise _fail(path, f"its pickled header is larger than the {MAX_CKPT_PICKLE_BYTES} bytes accepted") from None
        raise _damaged(path, "checkpoint", "its pickled data is not a valid pickle") from None


def _zip_checkpoint(path: Path, fh: BinaryIO, size: int) -> int:
    _zip_directory(path, fh, size)
    fh.seek(0)
    try:
        with zipfile.ZipFile(fh) as archive:
            infos = archive.infolist()
            for info in infos:
                if info.header_offset + info.compress_size > size or not info.filename:
                    raise _damaged(path, "checkpoint", "a zip entry lies outside the file")
            pickles = [info for info in infos if "data.pkl" in info.filename]
            if not pickles:
                raise _fail(path, "it is a zip archive but not a torch checkpoint (it has no data.pkl)")
            for info in pickles:
                if info.file_size > MAX_CKPT_PICKLE_BYTES:
                    raise _fail(path, f"its data.pkl is {info.file_size} bytes, more than the "
                                f"{MAX_CKPT_PICKLE_BYTES} accepted")
                if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                    raise _damaged(path, "checkpoint", "its data.pkl uses a compression stable-diffusion.cpp cannot read")
                _check_pickles(path, archive.read(info), 1, complete=True)
            return len(infos)
    except ModelLoadError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError, OSError, ValueError,
            struct.error, OverflowError, KeyError, RuntimeError, UnicodeDecodeError) as exc:
        raise _damaged(path, "checkpoint", f"its zip archive is broken ({str(exc)[:100]})") from None


# -- entry point ------------------------------------------------------------------------------------
def _stat(path: Path) -> os.stat_result:
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise ModelLoadError(f"model {path} does not exist",
                             hint="check the path (use an absolute path if in doubt)") from None
    except ValueError:
        raise ModelLoadError("the model path contains a NUL character", hint="check the path") from None
    except OSError as exc:
        raise _fail(path, f"cannot read it: {exc.strerror or exc}", hint="check the file's permissions") from None


def check_model(path: Union[str, Path]) -> ModelFile:
    """Identify ``path`` and check its headers; raise :class:`ModelLoadError` with the reason."""
    p = Path(path).expanduser()
    st = _stat(p)
    if stat.S_ISDIR(st.st_mode):
        weights = probe_weights(str(p))
        if weights is not None:  # accelstack's probe model: its one weights file is what loads
            return check_model(weights)
        missing = [part for part in DIFFUSERS_PARTS if not (p / part).is_file()]
        if missing:
            raise _fail(p, f"a folder must be a diffusers model, but {', '.join(missing)} is missing",
                        hint="point at the diffusers model folder (the one holding unet/, vae/, text_encoder/) "
                        "or at a single model file")
        tensors = sum(_safetensors_tensors(p / part) for part in DIFFUSERS_PARTS)
        size = sum((p / part).stat().st_size for part in DIFFUSERS_PARTS)
        return ModelFile(str(p), "diffusers", size, tensors)
    if not stat.S_ISREG(st.st_mode):
        raise _fail(p, "it is not a regular file (a pipe, device or socket)", hint="pass a model file or folder")
    fh, size = _open_regular(p)
    with fh:
        magic = fh.read(8)
        if size == 0:
            raise _fail(p, "the file is empty")
        suffix = p.suffix.lower()
        if magic[:4] == b"GGUF":
            return ModelFile(str(p), "gguf", size, _gguf_tensors(p, _rewind(fh), size))
        if suffix == ".gguf":
            raise _fail(p, "not a GGUF file (it does not start with the GGUF magic)")
        if magic[:2] == b"PK" or magic[:1] == b"\x80":  # torch zip checkpoint or legacy pickle
            if suffix == ".safetensors":
                raise _fail(p, "it is a pickled torch checkpoint, not safetensors", hint="rename it to .ckpt")
            if magic[:2] == b"PK":
                return ModelFile(str(p), "ckpt", size, _zip_checkpoint(p, fh, size))
            head = _rewind(fh).read(MAX_CKPT_PICKLE_BYTES)
            _check_pickles(p, head, TORCH_LEGACY_PICKLES, complete=size <= MAX_CKPT_PICKLE_BYTES)
            return ModelFile(str(p), "ckpt", size)
    if suffix in (".ckpt", ".pt", ".pth", ".bin"):
        raise _fail(p, "not a torch checkpoint (neither a zip archive nor a pickle)")
    if suffix == ".safetensors":
        return ModelFile(str(p), "safetensors", size, _safetensors_tensors(p))
    try:  # any other name: safetensors is the only remaining format we can recognise
        return ModelFile(str(p), "safetensors", size, _safetensors_tensors(p))
    except ModelLoadError:
        raise _fail(p, "unknown model format (not safetensors, GGUF or a torch checkpoint)") from None


def _rewind(fh: BinaryIO) -> BinaryIO:
    fh.seek(0)
    return fh
