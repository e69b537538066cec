"""Check a model path before any process starts, so a bad file gets a reason, not a crash.

stable-diffusion.cpp reports a model it cannot read as a NULL context (the bindings then raise
an opaque "NULL pointer access") or, for some corrupt files, crashes. Most of those files are
recognisable from their first bytes: this module reads headers only, never whole files.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Union

from .errors import ModelLoadError

KINDS = ("safetensors", "gguf", "ckpt", "diffusers")
DIFFUSERS_PARTS = ("unet/diffusion_pytorch_model.safetensors", "vae/diffusion_pytorch_model.safetensors",
                   "text_encoder/model.safetensors")
MAX_HEADER = 100 << 20  # safetensors caps its JSON header at 100 MB


@dataclass
class ModelFile:
    path: str
    kind: str  # one of KINDS
    size_bytes: int
    tensors: int = 0  # safetensors/diffusers: tensors found in the headers


def _fail(path: Path, reason: str, hint: str = "") -> ModelLoadError:
    return ModelLoadError(f"cannot load model {path}: {reason}",
                          hint=hint or "check the file (re-download it if it is damaged) and pass a .safetensors, "
                          ".gguf or .ckpt file or a diffusers folder")


def _safetensors_tensors(path: Path) -> int:
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise _fail(path, f"not a safetensors file: only {size} bytes")
        (n,) = struct.unpack("<Q", head)
        if n == 0 or n > MAX_HEADER or 8 + n > size:
            raise _fail(path, f"not a valid safetensors file: header length {n} does not fit a {size}-byte file "
                        "(the file is truncated or not safetensors)")
        raw = fh.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise _fail(path, "not a valid safetensors file: its header is not JSON") from None
    if not isinstance(header, dict):
        raise _fail(path, "not a valid safetensors file: its header is not a JSON object")
    data_len = size - 8 - n
    count = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = info["data_offsets"]
            ok = 0 <= begin <= end <= data_len
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            raise _fail(path, f"damaged safetensors file: tensor {name!r} lies outside the file "
                        f"({data_len} data bytes); the file is probably truncated")
        count += 1
    if count == 0:
        raise _fail(path, "the safetensors file holds no tensors")
    return count


def check_model(path: Union[str, Path]) -> ModelFile:
    """Identify ``path`` and check its headers; raise :class:`ModelLoadError` with the reason."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelLoadError(f"model {p} does not exist", hint="check the path (use an absolute path if in doubt)")
    if p.is_dir():
        missing = [part for part in DIFFUSERS_PARTS if not (p / part).is_file()]
        if missing:
            raise _fail(p, f"a folder must be a diffusers model, but {', '.join(missing)} is missing",
                        hint="point at the diffusers model folder (the one holding unet/, vae/, text_encoder/) "
                        "or at a single model file")
        tensors = sum(_safetensors_tensors(p / part) for part in DIFFUSERS_PARTS)
        size = sum((p / part).stat().st_size for part in DIFFUSERS_PARTS)
        return ModelFile(str(p), "diffusers", size, tensors)
    try:
        size = p.stat().st_size
        with open(p, "rb") as fh:
            magic = fh.read(8)
    except OSError as exc:
        raise _fail(p, f"cannot read it: {exc.strerror or exc}", hint="check the file's permissions") from None
    if size == 0:
        raise _fail(p, "the file is empty")
    suffix = p.suffix.lower()
    if magic[:4] == b"GGUF":
        return ModelFile(str(p), "gguf", size)
    if suffix == ".gguf":
        raise _fail(p, "not a GGUF file (it does not start with the GGUF magic)")
    if magic[:2] == b"PK" or magic[:1] == b"\x80":  # torch zip checkpoint or legacy pickle
        if suffix == ".safetensors":
            raise _fail(p, "it is a pickled torch checkpoint, not safetensors", hint="rename it to .ckpt")
        return ModelFile(str(p), "ckpt", size)
    if suffix in (".ckpt", ".pt", ".pth", ".bin"):
        raise _fail(p, "not a torch checkpoint (neither a zip archive nor a pickle)")
    if suffix == ".safetensors":
        return ModelFile(str(p), "safetensors", size, _safetensors_tensors(p))
    try:  # any other name: safetensors is the only remaining format we can recognise
        return ModelFile(str(p), "safetensors", size, _safetensors_tensors(p))
    except ModelLoadError:
        raise _fail(p, "unknown model format (not safetensors, GGUF or a torch checkpoint)") from None
