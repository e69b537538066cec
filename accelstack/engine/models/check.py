"""Check a model path before any process starts, so a bad file gets a reason, not a crash.

stable-diffusion.cpp reports a model it cannot read as a NULL context (the bindings then raise
an opaque "NULL pointer access") or, for some corrupt files, crashes: its safetensors reader
converts JSON values with exceptions nobody catches (a shape that is not a list, a dtype that is
not text), its fallback GGUF reader allocates whatever a header claims (2^62 tensors, a 2^62-byte
name), and its zip reader trusts the archive's directory. Everything this module can see in the
headers is checked here, with the file's own size as the bound, reading headers only (never whole
files, at most ``MAX_MODEL_HEADER_BYTES``), and only from regular files: a FIFO, a device or a
socket is refused without being opened for reading (opening a FIFO blocks forever).

This module identifies the format and dispatches; each format's check is a module of its own
(:mod:`~accelstack.engine.models.safetensors_check`, :mod:`~accelstack.engine.models.gguf_check`,
:mod:`~accelstack.engine.models.ckpt_check`), sharing :mod:`~accelstack.engine.models.reader`.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, List, Optional, Union

from ...limits import MAX_CKPT_PICKLE_BYTES
from ..errors import ModelLoadError, ModelNotFoundError
from ..probes.layout import probe_weights
from .ckpt_check import TORCH_LEGACY_PICKLES, check_pickles, zip_checkpoint
from .ckpt_index import checkpoint_index
from .gguf_check import gguf_index, gguf_tensors
from .reader import TensorInfo, fail, open_regular, reading
from .safetensors_check import safetensors_index, safetensors_tensors

__all__ = ["check_model", "tensor_index", "ModelFile", "KINDS", "DIFFUSERS_PARTS", "DIFFUSERS_PREFIXES"]

KINDS = ("safetensors", "gguf", "ckpt", "diffusers")
DIFFUSERS_PARTS = ("unet/diffusion_pytorch_model.safetensors", "vae/diffusion_pytorch_model.safetensors",
                   "text_encoder/model.safetensors")
DIFFUSERS_PREFIXES = ("unet.", "vae.", "te.")  # what stable-diffusion.cpp prefixes each part's names with


@dataclass
class ModelFile:
    path: str
    kind: str  # one of KINDS
    size_bytes: int
    tensors: int = 0  # tensors found in the headers (0 for checkpoints: their names are read by tensor_index)
    archive: bool = False  # a torch zip checkpoint: tensor_index reads the names its data.pkl declares


# -- entry point ------------------------------------------------------------------------------------
def _stat(path: Path) -> os.stat_result:
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise ModelNotFoundError(f"model {path} does not exist",
                             hint="check the path (use an absolute path if in doubt)") from None
    except ValueError:
        raise ModelLoadError("the model path contains a NUL character", hint="check the path") from None
    except OSError as exc:
        raise fail(path, f"cannot read it: {exc.strerror or exc}", hint="check the file's permissions") from None


def _model_path(path: Union[str, Path]) -> Path:
    """``path`` with ``~`` expanded, unless it names a file as written (``~model.safetensors`` in the
    current folder) or no user of that name exists (then it is the name as written). An empty path
    is refused: ``Path("")`` is the current folder, which nobody meant."""
    if not str(path):
        raise ModelNotFoundError("the model path is empty", hint="give the path of a model file or diffusers folder")
    p = Path(path)
    if not str(path).startswith("~") or os.path.lexists(p):
        return p
    try:
        return p.expanduser()
    except RuntimeError:  # "~name" with no user "name": the literal name, reported as missing below
        return p


def check_model(path: Union[str, Path]) -> ModelFile:
    """Identify ``path`` and check its headers; raise :class:`ModelLoadError` with the reason."""
    p = _model_path(path)
    st = _stat(p)
    if stat.S_ISDIR(st.st_mode):
        weights = probe_weights(str(p))
        if weights is not None:  # accelstack's probe model: its one weights file is what loads
            return check_model(weights)
        missing = [part for part in DIFFUSERS_PARTS if not (p / part).is_file()]
        if missing:
            raise fail(p, f"a folder must be a diffusers model, but {', '.join(missing)} is missing",
                        hint="point at the diffusers model folder (the one holding unet/, vae/, text_encoder/) "
                        "or at a single model file")
        tensors = sum(safetensors_tensors(p / part) for part in DIFFUSERS_PARTS)
        with reading(p):
            size = sum((p / part).stat().st_size for part in DIFFUSERS_PARTS)
        return ModelFile(str(p), "diffusers", size, tensors)
    if not stat.S_ISREG(st.st_mode):
        raise fail(p, "it is not a regular file (a pipe, device or socket)", hint="pass a model file or folder")
    fh, size = open_regular(p)
    with fh, reading(p):
        magic = fh.read(9)
        if size == 0:
            raise fail(p, "the file is empty")
        suffix = p.suffix.lower()
        if _safetensors_head(magic, size):  # before the pickle test: a header length may start with 0x80
            return ModelFile(str(p), "safetensors", size, safetensors_tensors(p))
        if magic[:4] == b"GGUF":
            return ModelFile(str(p), "gguf", size, gguf_tensors(p, _rewind(fh), size))
        if suffix == ".gguf":
            raise fail(p, "not a GGUF file (it does not start with the GGUF magic)")
        if magic[:2] == b"PK" or magic[:1] == b"\x80":  # torch zip checkpoint or legacy pickle
            if suffix == ".safetensors":
                raise fail(p, "it is a pickled torch checkpoint, not safetensors", hint="rename it to .ckpt")
            if magic[:2] == b"PK":
                zip_checkpoint(p, fh, size)
                return ModelFile(str(p), "ckpt", size, archive=True)
            head = _rewind(fh).read(MAX_CKPT_PICKLE_BYTES)
            check_pickles(p, head, TORCH_LEGACY_PICKLES, complete=size <= MAX_CKPT_PICKLE_BYTES)
            return ModelFile(str(p), "ckpt", size)
    if suffix in (".ckpt", ".pt", ".pth", ".bin"):
        raise fail(p, "not a torch checkpoint (neither a zip archive nor a pickle)")
    if suffix == ".safetensors":
        return ModelFile(str(p), "safetensors", size, safetensors_tensors(p))
    try:  # any other name: safetensors is the only remaining format we can recognise
        return ModelFile(str(p), "safetensors", size, safetensors_tensors(p))
    except ModelLoadError:
        raise fail(p, "unknown model format (not safetensors, GGUF or a torch checkpoint)") from None


def tensor_index(info: ModelFile) -> Optional[List[TensorInfo]]:
    """The tensors of a checked file, as stable-diffusion.cpp names them (a diffusers folder's parts
    prefixed); None where the names are not read: a legacy pickle, or a checkpoint whose pickle uses
    constructs accelstack does not follow without unpickling it."""
    path = Path(info.path)
    if info.kind == "safetensors":
        return safetensors_index(path)
    if info.kind == "gguf":
        fh, size = open_regular(path)
        with fh:
            return gguf_index(path, fh, size)
    if info.kind == "diffusers":
        out: List[TensorInfo] = []
        for part, prefix in zip(DIFFUSERS_PARTS, DIFFUSERS_PREFIXES):
            out += [t._replace(name=prefix + t.name) for t in safetensors_index(path / part)]
        return out
    return checkpoint_index(path) if info.archive else None


def _safetensors_head(magic: bytes, size: int) -> bool:
    """Whether the file starts as safetensors does: an 8-byte little-endian header length that fits
    the file, then the header's JSON object. Its first byte is 0x80 (a torch pickle's magic) for 1
    header length in 256, so this is told first."""
    if len(magic) < 9 or magic[8:9] != b"{":
        return False
    return 2 <= int.from_bytes(magic[:8], "little") <= size - 8


def _rewind(fh: BinaryIO) -> BinaryIO:
    fh.seek(0)
    return fh
