"""LoRAs and textual-inversion embeddings for one generation: resolved, checked and staged.

The bindings would load a ``<lora:NAME:WEIGHT>`` tag's NAME from any path (absolute, or with
``..``) and an embedding from any file. So the parent resolves each name only inside the folder
the request names (a plain name, no separator, no leading dot, no ``..``: see
:func:`~accelstack.engine.protocol.check_companion_name`), opens it without following links and
refuses what is not a regular file. Time of check and time of use: stable-diffusion.cpp reopens
the file by path, so the checked file is staged first into a private folder of this run (a hard
link to the very inode that was opened, verified by device and inode; a copy from the open file
when a link is impossible, such as across file systems) and the headers are checked on the staged
file, which is what the worker loads: nothing another process does to the user's folder after
the check reaches the worker.

A LoRA must touch the model: its tensor names, after the conversions stable-diffusion.cpp applies
(``convert_tensor_name`` in its ``name_conversion.cpp``), must name weights of the model, with
matching sizes (else its ``GGML_ASSERT`` aborts the worker); the naming conventions read are
:mod:`accelstack.engine.lora_names`'. An embedding's vectors must be as wide as one of the model's
CLIP text encoders (768 for SD 1.x), the model's own or one given as a file (``--clip-l``).
"""
from __future__ import annotations

import math
import os
import re
import shutil
import stat
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Set, Tuple

from . import workdirs
from .errors import InvalidRequestError, ModelLoadError
from .lora_names import ENCODER_PREFIXES, LORA_PARTS, canonical_module, dotted_module, is_kohya, kohya_dotted
from .model_io import TensorInfo
from .modelfile import ModelFile, check_model, tensor_index
from .protocol import check_companion_name, lora_tags

__all__ = ["AppliedLora", "Companions", "prepare_companions", "tensor_index", "canonical_module",
           "LORA_EXTENSIONS", "EMBEDDING_EXTENSIONS", "MAX_EMBEDDINGS", "MAX_EMBEDDING_VECTORS"]

# The order the bindings try extensions in (stable_diffusion.py ``_extract_and_build_loras``).
LORA_EXTENSIONS = (".pt", ".safetensors", ".gguf")
EMBEDDING_EXTENSIONS = (".safetensors", ".gguf", ".pt", ".bin")
MAX_EMBEDDINGS = 256
MAX_EMBEDDING_VECTORS = 75  # one prompt chunk; sd.cpp also caps an embedding at 100 MB (conditioner.hpp)


@dataclass
class AppliedLora:
    """A LoRA of the prompt: its name (as in the tag), summed weight, and how many model weights it changes."""

    name: str
    weight: float
    tensors: int = 0


@dataclass
class Companions:
    """What a run stages for the worker: ``folder`` (a marked worker folder, private, removed by
    :meth:`cleanup`, or by :func:`workdirs.clean_stale` after a killed run) holds
    ``lora/`` (the lora_dir the worker is given) and ``embeddings/``."""

    loras: List[AppliedLora] = field(default_factory=list)
    embeddings: List[str] = field(default_factory=list)  # names, as the prompt triggers them
    lora_dir: str = ""
    embedding_paths: List[str] = field(default_factory=list)
    folder: str = ""

    def cleanup(self) -> None:
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = ""


# -- staging ------------------------------------------------------------------------------------------
def _folder(path: str, what: str) -> str:
    try:
        real = os.path.realpath(os.path.expanduser(path))
        st = os.stat(real)
    except (OSError, ValueError) as exc:
        raise InvalidRequestError(f"the {what} folder {path} cannot be read: {getattr(exc, 'strerror', None) or exc}",
                                  hint=f"name an existing folder of {what} files") from None
    if not stat.S_ISDIR(st.st_mode):
        raise InvalidRequestError(f"the {what} folder {path} is not a folder", hint=f"name the folder holding the {what} files")
    return real


def _stage(folder: str, name: str, dest_dir: str, what: str) -> Optional[str]:
    """Link (else copy) ``folder/name`` into ``dest_dir`` if it is a regular file there (not a link);
    None when it does not exist. The staged file is the inode that was opened."""
    source = os.path.join(folder, name)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        if stat.S_ISLNK(os.lstat(source).st_mode):
            raise InvalidRequestError(f"the {what} {name} in {folder} is a symbolic link",
                                      hint=f"put the {what} file itself in the folder, not a link to it")
        fd = os.open(source, flags)
    except FileNotFoundError:
        return None
    except InvalidRequestError:
        raise
    except OSError as exc:  # ELOOP: it became a link since the lstat
        raise InvalidRequestError(f"the {what} {name} in {folder} cannot be opened: {exc.strerror or exc}",
                                  hint=f"put a regular {what} file there") from None
    dest = os.path.join(dest_dir, name)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidRequestError(f"the {what} {name} in {folder} is not a regular file",
                                      hint=f"a {what} is a .safetensors, .gguf or .pt file")
        if os.path.dirname(os.path.realpath(source)) != folder:
            raise InvalidRequestError(f"the {what} {name} resolves outside {folder}")
        try:
            os.link(source, dest, follow_symlinks=False)
            linked = os.stat(dest, follow_symlinks=False)
            if (linked.st_dev, linked.st_ino) != (st.st_dev, st.st_ino):  # replaced between open and link
                os.unlink(dest)
                raise OSError("replaced")
        except OSError:
            os.set_blocking(fd, True)
            with os.fdopen(os.dup(fd), "rb") as src, open(dest, "xb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
    finally:
        os.close(fd)
    return dest


def _lora_modules(tensors: List[TensorInfo], flux: bool = True) -> Dict[Tuple[str, str], Dict[str, Tuple[int, ...]]]:
    """{(part, module): {"down"|"up"|...: shape}} of a LoRA's tensors (``flux``: for a FLUX.1 model)."""
    out: Dict[Tuple[str, str], Dict[str, Tuple[int, ...]]] = {}
    for t in tensors:
        m = LORA_PARTS.search(t.name)
        if not m:
            continue
        base = t.name[:m.start()]
        key = canonical_module(base, flux)
        if key is None:
            continue
        role = m.group(0)
        kind = "down" if ("down" in role or "lora_A" in role) else "up" if ("up" in role or "lora_B" in role) else "other"
        out.setdefault(key, {})[kind] = tuple(t.shape)
        if is_kohya(base):
            out[key]["kohya"] = ()
    return out


def _count(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _model_weights(tensors: List[TensorInfo]) -> Tuple[Dict[Tuple[str, str], Tuple[int, ...]], Dict[Tuple[str, str], str]]:
    """({key: shape} of the model's weights, {key: dotted name} of a DiT's diffusion weights), in one pass.
    The second is empty for a UNet model, whose kohya names stable-diffusion.cpp reads through the UNet's
    own conversion; for a DiT it is what a kohya module is checked against (:func:`kohya_dotted`)."""
    out: Dict[Tuple[str, str], Tuple[int, ...]] = {}
    dit: Dict[Tuple[str, str], str] = {}
    unet = False
    for t in tensors:
        if t.name.endswith(".weight"):
            key = canonical_module(t.name[:-len(".weight")])
            if key is None:
                continue
            out[key] = tuple(t.shape)
            if key[0] == "unet" and not unet:
                unet = key[1].startswith(("input_blocks_", "output_blocks_", "middle_block_"))
                dotted = dotted_module(t.name[:-len(".weight")])
                if dotted is not None:
                    dit[key] = dotted
    return out, ({} if unet else dit)


def _check_lora(name: str, path: str, model: Dict[Tuple[str, str], Tuple[int, ...]],
                dit: Optional[Dict[Tuple[str, str], str]] = None) -> int:
    """How many model weights the LoRA at ``path`` changes; InvalidRequestError when none, or when a
    size does not fit (stable-diffusion.cpp would abort on it). ``dit``: a DiT model's dotted names,
    against which a kohya module is read as stable-diffusion.cpp reads it (:func:`kohya_dotted`)."""
    tensors = _index(path, name, "LoRA")
    modules = _lora_modules(tensors, flux=any(module.startswith("double_blocks_") for _part, module in model))
    misread = [(key, dit[key]) for key, roles in modules.items()
               if dit and "kohya" in roles and key in dit and kohya_dotted(key[1]) != dit[key]]
    for key, _dotted in misread:
        del modules[key]
    if misread and not any(key in model for key in modules):
        (part, flat), dotted = misread[0]
        raise InvalidRequestError(
            f"the LoRA {name} changes nothing in this model: stable-diffusion.cpp 0.4.7 reads its kohya name "
            f"lora_{part}_{flat} as {kohya_dotted(flat)}, not the model's {dotted} (it turns every underscore into a "
            "dot but in the words it knows: src/name_conversion.cpp convert_sep_to_dot), so none of its "
            f"{len(misread)} such modules would apply",
            hint="use the LoRA in the model's own dotted names (ComfyUI's diffusion_model.… or diffusers' "
                 "transformer.…), or a runtime whose name conversion knows this family's words")
    if not modules:
        raise InvalidRequestError(f"the LoRA {name} holds no LoRA tensors stable-diffusion.cpp reads "
                                  f"({len(tensors)} tensors, none named like lora_down/lora_up or lora_A/lora_B)",
                                  hint="use a LoRA in the kohya, diffusers/PEFT or stable-diffusion.cpp naming")
    matched = 0
    for key, roles in modules.items():
        shape = model.get(key)
        if shape is None:
            continue
        down, up = roles.get("down"), roles.get("up")
        if down and up and len(down) >= 2:
            out_rows, in_count = int(up[0]), _count(down[1:])
            want_rows, want_in = int(shape[0]), _count(shape[1:])
            fits = (out_rows, in_count) == (want_rows, want_in) or (
                len(shape) == 2 and in_count == want_in and out_rows < want_rows)  # sd.cpp pads that case
            if not fits:
                raise InvalidRequestError(
                    f"the LoRA {name} does not fit this model: its {'_'.join(key)} is {out_rows}x{in_count}, "
                    f"the model's weight {'x'.join(map(str, shape))}",
                    hint="the LoRA was trained for another model family; use one made for this model")
        matched += 1
    if not matched:
        sample = sorted(modules)[0]
        raise InvalidRequestError(
            f"the LoRA {name} changes nothing in this model: none of its {len(modules)} modules "
            f"(such as {sample[0]}:{sample[1][:80]}) names a weight of the model",
            hint="the LoRA was made for another model family (or another naming); use one made for this model")
    return matched


def _index(path: str, name: str, what: str) -> List[TensorInfo]:
    try:
        info = check_model(path)
        tensors = tensor_index(info)
    except ModelLoadError as exc:
        reason = exc.message.split(": ", 1)[-1]
        raise InvalidRequestError(f"the {what} {name} cannot be read: {reason}",
                                  hint=f"re-download the {what} file or remove it from the folder") from None
    if tensors is None:
        raise InvalidRequestError(f"the {what} {name} is a legacy torch pickle whose tensors are not read without "
                                  "unpickling it", hint=f"convert the {what} to safetensors")
    return tensors


def _encoder_widths(tensors: List[TensorInfo]) -> Set[int]:
    return {int(t.shape[-1]) for t in tensors
            if t.name.endswith("token_embedding.weight") and len(t.shape) == 2}


def _check_embedding(name: str, path: str, widths: Set[int]) -> None:
    # Vectors only: an A1111 .pt also holds its token id (an integer tensor), which is no vector.
    tensors = [t for t in _index(path, name, "embedding") if t.shape and not t.dtype.upper().startswith(("I", "U", "BOOL"))]
    if not tensors:
        raise InvalidRequestError(f"the embedding {name} holds no vectors", hint="use a textual-inversion embedding file")
    for t in tensors:
        rows = _count(t.shape[:-1])
        if len(t.shape) > 2 or int(t.shape[-1]) not in widths or not 1 <= rows <= MAX_EMBEDDING_VECTORS:
            raise InvalidRequestError(
                f"the embedding {name} does not fit this model: its tensor {t.name[:60]} is "
                f"{'x'.join(map(str, t.shape))}, the model's text encoder takes vectors of "
                f"{' or '.join(map(str, sorted(widths)))} (at most {MAX_EMBEDDING_VECTORS} of them)",
                hint="use an embedding trained for this model family")


def _encoder_tensors(encoders: Dict[str, str]) -> List[TensorInfo]:
    """The tensors of separate text-encoder files (``{"clip_l": path}``), under the prefix each is loaded
    with unless the file already names its part."""
    out: List[TensorInfo] = []
    for kind, path in sorted(encoders.items()):
        prefix = ENCODER_PREFIXES.get(kind)
        if prefix is None:
            continue  # T5-XXL and LLM encoders take no embedding, and no LoRA is matched against them here
        for t in _index(path, os.path.basename(path), "text encoder"):
            out.append(t if canonical_module(t.name) is not None else t._replace(name=prefix + t.name))
    return out


# -- entry point ----------------------------------------------------------------------------------------
def prepare_companions(prompt: str, lora_dir: str, embeddings_dir: str, model: ModelFile,
                       encoders: Optional[Dict[str, str]] = None) -> Companions:
    """Resolve, stage and check the prompt's LoRAs in ``lora_dir`` and every embedding of
    ``embeddings_dir`` against ``model``; the caller removes the staging (:meth:`Companions.cleanup`)."""
    tags = lora_tags(prompt)
    if tags and not lora_dir:
        raise InvalidRequestError("the prompt holds a <lora:NAME:WEIGHT> tag but no LoRA folder is given",
                                  hint="name the folder holding the LoRA files, or remove the tag")
    if not tags and not embeddings_dir:
        return Companions()
    lora_src = _folder(lora_dir, "LoRA") if tags else ""
    emb_src = _folder(embeddings_dir, "embeddings") if embeddings_dir else ""
    out = Companions(folder=str(workdirs.make()))  # marked: a killed run's copies go with clean_stale
    try:
        model_tensors = tensor_index(model)
        if model_tensors is None:
            raise InvalidRequestError(f"the model {model.path} is a legacy torch pickle whose tensor names are not read, "
                                      "so LoRAs and embeddings cannot be checked against it",
                                      hint="convert the model to safetensors")
        model_tensors = model_tensors + _encoder_tensors(encoders or {})
        if tags:
            out.lora_dir = os.path.join(out.folder, "lora")
            os.mkdir(out.lora_dir, 0o700)
            weights, dit = _model_weights(model_tensors)
            for name, weight in tags:
                if not math.isfinite(weight):
                    raise InvalidRequestError(f"the LoRA weight of {name} is not a finite number")
                candidates = [name] if name.lower().endswith(LORA_EXTENSIONS) else [name + ext for ext in LORA_EXTENSIONS]
                staged = None
                for candidate in candidates:
                    staged = _stage(lora_src, candidate, out.lora_dir, "LoRA")
                    if staged:
                        break
                if staged is None:
                    raise InvalidRequestError(f"there is no LoRA {name!r} in {lora_dir}",
                                              hint=f"looked for {', '.join(candidates)}; name a file of the folder")
                out.loras.append(AppliedLora(name, round(weight, 6), _check_lora(name, staged, weights, dit)))
        if emb_src:
            out.embeddings, out.embedding_paths = _embeddings(emb_src, embeddings_dir, out.folder, model_tensors)
    except BaseException:
        out.cleanup()
        raise
    return out


def _embeddings(source: str, given: str, folder: str, model_tensors: List[TensorInfo]) -> Tuple[List[str], List[str]]:
    widths = _encoder_widths(model_tensors)
    if not widths:
        raise InvalidRequestError("this model has no CLIP text encoder that textual-inversion embeddings apply to",
                                  hint="leave out the embeddings folder for this model")
    dest = os.path.join(folder, "embeddings")
    os.mkdir(dest, 0o700)
    try:
        entries = sorted(os.listdir(source))
    except OSError as exc:
        raise InvalidRequestError(f"the embeddings folder {given} cannot be read: {exc.strerror or exc}") from None
    names: Dict[str, str] = {}
    paths: List[str] = []
    for entry in entries:
        stem, ext = os.path.splitext(entry)
        if ext.lower() not in EMBEDDING_EXTENSIONS or entry.startswith("."):
            continue  # not an embedding file (a README, a preview image)
        check_companion_name(stem, "embedding")
        if not re.fullmatch(r"[\w\-]+", stem):
            raise InvalidRequestError(f"the embedding {entry!r} has a name that is not one prompt word",
                                      hint="rename it to letters, digits, _ and - only (its name is how a prompt uses it)")
        if stem.lower() in names:
            raise InvalidRequestError(f"the embeddings {names[stem.lower()]!r} and {entry!r} have the same name "
                                      "(names are not case-sensitive in a prompt)", hint="rename or remove one")
        if len(names) >= MAX_EMBEDDINGS:
            raise InvalidRequestError(f"the embeddings folder holds more than {MAX_EMBEDDINGS} embeddings",
                                      hint="keep the ones you use in a folder of their own")
        staged = _stage(source, entry, dest, "embedding")
        if staged is None:
            continue  # gone since the listing
        _check_embedding(stem, staged, widths)
        names[stem.lower()] = entry
        paths.append(staged)
    return [os.path.splitext(names[k])[0] for k in sorted(names)], paths
