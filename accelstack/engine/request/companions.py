"""LoRAs and textual-inversion embeddings for one generation: resolved, checked and staged.

The bindings would load a ``<lora:NAME:WEIGHT>`` tag's NAME from any path (absolute, or with
``..``) and an embedding from any file. So the parent resolves each name only inside the folder
the request names (a plain name, no separator, no leading dot, no ``..``: see
:func:`~accelstack.engine.worker.protocol.check_companion_name`), opens it without following links and
refuses what is not a regular file. Time of check and time of use: stable-diffusion.cpp reopens
the file by path, so the checked file is staged first into a private folder of this run (a hard
link to the very inode that was opened, verified by device and inode; a copy from the open file
when a link is impossible, such as across file systems, made only once the source's size and
header passed, so that a huge broken file is refused uncopied) and the headers are checked on the
staged file, which is what the worker loads: nothing another process does to the user's folder
after the check reaches the worker. A tag is resolved to its file first, as the bindings resolve
it: one file named two ways is staged once, and the weights the bindings add up for it are capped
on their sum. A ``<lora:`` tag the bindings would not read (``<lora:NAME>``) is refused.

A LoRA must touch the model, and in a way stable-diffusion.cpp applies without aborting: its
tensor names, after the conversions stable-diffusion.cpp applies (``convert_tensor_name`` in its
``name_conversion.cpp``), must name weights of the model, with matching sizes, ranks, layouts and
types (:mod:`accelstack.engine.loras.check`); the naming conventions read are
:mod:`accelstack.engine.loras.names`'. An embedding's vectors must be as wide as one of the model's
CLIP text encoders (768 for SD 1.x), the model's own or one given as a file (``--clip-l``).
"""
from __future__ import annotations

import functools
import math
import os
import re
import shutil
import stat
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Set, Tuple, TypeVar

from ...errors import Action
from ..errors import GenerationError, InvalidRequestError, ModelLoadError
from ..loras.check import LoraMatch, applied_at_runtime, check_lora, model_weights
from ..loras.names import COMPONENT_PREFIXES, ENCODER_PREFIXES, UNET_ENCODER_PREFIXES, as_loaded, canonical_module
from ..loras.tags import check_lora_tag_syntax
from ..models.check import ModelFile, check_model, tensor_index
from ..models.reader import TensorInfo
from ..supervision import workdirs
from ..worker.protocol import MAX_LORA_WEIGHT, check_companion_name, lora_tags

__all__ = ["AppliedLora", "Companions", "prepare_companions", "tensor_index", "canonical_module",
           "LORA_EXTENSIONS", "EMBEDDING_EXTENSIONS", "MAX_EMBEDDINGS", "MAX_EMBEDDING_VECTORS", "MAX_EMBEDDING_BYTES"]

# The order the bindings try extensions in (stable_diffusion.py ``_extract_and_build_loras``).
LORA_EXTENSIONS = (".pt", ".safetensors", ".gguf")
EMBEDDING_EXTENSIONS = (".safetensors", ".gguf", ".pt", ".bin")
_UNET_NAMES = ("model.diffusion_model.input_blocks.", "unet.down_blocks.", "model.diffusion_model.down_blocks.")
MAX_EMBEDDINGS = 256
MAX_EMBEDDING_VECTORS = 75  # one prompt chunk
MAX_EMBEDDING_BYTES = 100 << 20  # what sd.cpp loads an embedding into (conditioner.hpp load_embedding: mem_size)


@dataclass
class AppliedLora:
    """A LoRA file of the prompt: its name (as in its first tag), the weights of its tags summed (as the
    bindings sum them), how many model weights it changes (``tensors``), and how many of the file's ``total``
    tensors stable-diffusion.cpp applies (``applied``, counted as its "(N / M) LoRA tensors have been applied")."""

    name: str
    weight: float
    tensors: int = 0
    applied: int = 0
    total: int = 0
    warning: str = ""  # why it applies only in part ("" when whole): see :meth:`partial_warning`

    def summary(self) -> str:
        """``watercolor ×0.8: 342 of 342 tensors`` (the result, the terminal and the PNG say it)."""
        return f"{self.name} ×{self.weight:g}: {self.applied} of {self.total} tensors"

    def partial_warning(self) -> str:
        """Why the LoRA applies only in part ("" when whole): what the user would otherwise see only in
        stable-diffusion.cpp's log ("Only (N / M) LoRA tensors have been applied")."""
        if self.applied >= self.total:
            return ""
        left = self.total - self.applied
        return (f"the LoRA {self.name} applies only in part: {left} of its {self.total} tensors "
                f"({100 * left / self.total:.0f}%) name nothing stable-diffusion.cpp applies to this model (weights it "
                "lacks, a slice after a missing one, or tensors it does not read); the image changes less than its trainer meant")


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


Identity = Tuple[int, int]  # (device, inode) of a file opened in the user's folder
T = TypeVar("T")


def _stage(folder: str, name: str, dest_dir: str, what: str, check: Callable[[str], T],
           max_bytes: Optional[int] = None) -> Optional[Tuple[str, Identity, T]]:
    """Stage ``folder/name`` into ``dest_dir`` if it is a regular file there (not a link), and ``check``
    it (headers only; it raises what it refuses): (staged path, identity, what ``check`` returned), or
    None when there is no such file. The staged file is the inode that was opened: a hard link to it,
    else (another file system) a copy, made only once the source's size and header passed (a 2 GB
    file with a broken header is not copied first), and checked again as copied: the worker loads it."""
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
        if max_bytes is not None and st.st_size > max_bytes:
            raise InvalidRequestError(f"the {what} {name} is {st.st_size / (1 << 20):.0f} MB, more than the "
                                      f"{max_bytes >> 20} MB stable-diffusion.cpp loads one into",
                                      hint=f"a {what} is far smaller; re-download it or remove it from the folder")
        if os.path.lexists(dest):  # a file system that ignores case: another spelling of a name staged already
            raise InvalidRequestError(f"the {what} {name} is named twice in the prompt, spelled two ways",
                                      hint=f"name each {what} once, spelled as its file is")
        identity = (st.st_dev, st.st_ino)
        if _link(source, dest, identity):
            return dest, identity, check(dest)
        check(source)  # before any byte is copied
        try:
            now = os.stat(source, follow_symlinks=False)
        except OSError:
            now = None
        if now is None or (now.st_dev, now.st_ino) != identity:
            raise InvalidRequestError(f"the {what} {name} in {folder} was replaced while it was checked",
                                      hint="try again once nothing writes to the folder")
        try:
            os.set_blocking(fd, True)
            os.lseek(fd, 0, os.SEEK_SET)
            with os.fdopen(os.dup(fd), "rb") as src, open(dest, "xb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
        except OSError as exc:  # the temp folder's disk is full, say
            raise GenerationError(f"the {what} {name} could not be copied into this run's private folder "
                                  f"({os.path.dirname(dest_dir)}): {exc.strerror or exc}",
                                  hint="free disk space in the temp folder, or put the folder on its file system",
                                  action=Action.FREE_DISK) from None
        return dest, identity, check(dest)  # the copy is what the worker loads, whatever changed meanwhile
    finally:
        os.close(fd)


def _link(source: str, dest: str, identity: Identity) -> bool:
    """Hard-link ``source`` as ``dest`` if it still is the inode ``identity``; False where no link can be
    made (another file system) or the file was replaced since it was opened."""
    try:
        os.link(source, dest, follow_symlinks=False)
    except OSError:
        return False
    try:
        linked = os.stat(dest, follow_symlinks=False)
        if (linked.st_dev, linked.st_ino) == identity:
            return True
        os.unlink(dest)
    except OSError:
        pass  # the copy's exclusive create then says so
    return False


def _count(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _index(path: str, name: str, what: str) -> List[TensorInfo]:
    return _read(path, name, what)[0]


def _read(path: str, name: str, what: str) -> Tuple[List[TensorInfo], str]:
    """The tensors of a companion file and its kind (``ModelFile.kind``); InvalidRequestError when unreadable."""
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
    return tensors, info.kind


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


def _encoder_tensors(encoders: Dict[str, str], unet: bool = False) -> List[TensorInfo]:
    """The tensors of separate text-encoder files (``{"clip_l": path}``), under the prefix each is loaded
    with unless the file already names its part: a UNet model's under cond_stage_model. (``unet``), a DiT's under
    text_encoders. (src/stable-diffusion.cpp new_sd_ctx: is_unet)."""
    out: List[TensorInfo] = []
    for kind, path in sorted(encoders.items()):
        prefix = (UNET_ENCODER_PREFIXES if unet else ENCODER_PREFIXES).get(kind)
        if prefix is None:
            continue  # T5-XXL and LLM encoders take no embedding, and no LoRA is matched against them here
        for t in _index(path, os.path.basename(path), "text encoder"):
            out.append(t if canonical_module(t.name) is not None else t._replace(name=prefix + t.name))
    return out


# -- entry point ----------------------------------------------------------------------------------------
def prepare_companions(prompt: str, lora_dir: str, embeddings_dir: str, model: ModelFile,
                       encoders: Optional[Dict[str, str]] = None, weight_type: str = "") -> Companions:
    """Resolve, stage and check the prompt's LoRAs in ``lora_dir`` and every embedding of
    ``embeddings_dir`` against ``model`` (with its component files ``encoders``, loaded as ``weight_type``);
    the caller removes the staging (:meth:`Companions.cleanup`)."""
    check_lora_tag_syntax(prompt)  # <lora:NAME>: a typo stable-diffusion.cpp would leave in the prompt as text
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
        if (encoders or {}).get("diffusion_model"):  # given as --diffusion-model: loaded under its prefix
            prefix = COMPONENT_PREFIXES["diffusion_model"]
            model_tensors = [t._replace(name=as_loaded(t.name, prefix)) for t in model_tensors]
        unet = any(t.name.startswith(_UNET_NAMES) for t in model_tensors)
        model_tensors = model_tensors + _encoder_tensors(encoders or {}, unet)
        if tags:
            out.lora_dir = os.path.join(out.folder, "lora")
            os.mkdir(out.lora_dir, 0o700)
            runtime = applied_at_runtime(model_tensors + _other_tensors(encoders or {}), weight_type)
            flag = "--diffusion-model" if (encoders or {}).get("diffusion_model") else "--model"
            out.loras = _loras(tags, lora_src, lora_dir, out.lora_dir, model_tensors, runtime,
                               f"{flag} {os.path.basename(model.path)}")
        if emb_src:
            out.embeddings, out.embedding_paths = _embeddings(emb_src, embeddings_dir, out.folder, model_tensors)
    except BaseException:
        out.cleanup()
        raise
    return out


def _other_tensors(encoders: Dict[str, str]) -> List[TensorInfo]:
    """The tensors of the component files :func:`_encoder_tensors` does not read (T5-XXL, LLM, VAE...), for
    their weight types only; a file whose tensors are not read (a legacy pickle) counts for none."""
    out: List[TensorInfo] = []
    for kind, path in sorted(encoders.items()):
        if kind not in ENCODER_PREFIXES:
            try:
                out += _index(path, os.path.basename(path), kind)
            except InvalidRequestError:
                pass
    return out


def _lora_checker(name: str, weights: Dict[Tuple[str, str], Tuple[int, ...]], dit: Dict[Tuple[str, str], str],
                  runtime: str, label: str) -> Callable[[str], LoraMatch]:
    def check(path: str) -> LoraMatch:
        tensors, kind = _read(path, name, "LoRA")
        return check_lora(name, tensors, weights, dit, gguf=kind == "gguf", at_runtime=runtime, model_label=label)
    return check


def _loras(tags: List[Tuple[str, float]], source: str, given: str, dest: str,
           model_tensors: List[TensorInfo], runtime: str, label: str = "") -> List[AppliedLora]:
    """Each tag's LoRA, resolved to its file as the bindings resolve it, staged once and checked; one
    :class:`AppliedLora` a file, its weights summed as the bindings sum them (a file named two ways,
    ``<lora:x:1>`` and ``<lora:x.safetensors:1>``, is one LoRA of weight 2), and capped on that sum."""
    weights, dit = model_weights(model_tensors)
    staged: Dict[str, Tuple[Identity, LoraMatch]] = {}  # by the file name a tag resolved to
    applied: Dict[Identity, AppliedLora] = {}
    named: Dict[Identity, List[str]] = {}
    for name, weight in tags:
        if not math.isfinite(weight):
            raise InvalidRequestError(f"the LoRA weight of {name} is not a finite number")
        candidates = [name] if name.lower().endswith(LORA_EXTENSIONS) else [name + ext for ext in LORA_EXTENSIONS]
        for candidate in candidates:  # the bindings' order (a name with its extension is taken as it is)
            if candidate not in staged:
                found = _stage(source, candidate, dest, "LoRA", _lora_checker(name, weights, dit, runtime, label))
                if found is None:
                    continue
                staged[candidate] = found[1], found[2]
            identity, changed = staged[candidate]
            break
        else:
            raise InvalidRequestError(f"there is no LoRA {name!r} in {given}",
                                      hint=f"looked for {', '.join(candidates)}; name a file of the folder")
        lora = applied.setdefault(identity, AppliedLora(name, 0.0, changed.weights, changed.applied, changed.total))
        lora.weight += weight
        named.setdefault(identity, []).append(name)
        if abs(lora.weight) > MAX_LORA_WEIGHT:
            raise InvalidRequestError(
                f"the LoRA {lora.name!r} is named {len(named[identity])} times "
                f"({', '.join(map(repr, named[identity]))}: one file), with weights that add up to {lora.weight:g}, "
                f"past {MAX_LORA_WEIGHT:g} (the bindings add the weights of one file)", hint="name each LoRA once")
    for lora in applied.values():
        lora.weight = round(lora.weight, 6)
        lora.warning = lora.partial_warning()
    return list(applied.values())


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
        staged = _stage(source, entry, dest, "embedding", functools.partial(_check_embedding, stem, widths=widths),
                        max_bytes=MAX_EMBEDDING_BYTES)
        if staged is None:
            continue  # gone since the listing
        names[stem.lower()] = entry
        paths.append(staged[0])
    return [os.path.splitext(names[k])[0] for k in sorted(names)], paths
