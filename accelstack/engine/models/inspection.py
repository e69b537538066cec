"""Know a model before loading it: its family, size, weight types, parts and missing companions.

Loading a 12 GB Flux file only to learn it needs a VAE and two text encoders costs minutes and
ends in stable-diffusion.cpp's opaque "NULL pointer access". Everything needed to say so is in the
headers the format checks already read (:func:`~accelstack.engine.models.check.check_model` first,
so a bad file gets the same typed error here as anywhere): tensor names tell the family and the
parts, shapes the parameter count, dtypes the quantization. The rules are data
(:mod:`~accelstack.engine.models.families`), taken from stable-diffusion.cpp's version detection.
"""
from __future__ import annotations

import collections
import copy
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from .check import ModelFile, check_model, tensor_index
from .conversion import convertible
from .families import Condition, FamilyRule, Knowledge, PrefixRule, knowledge
from .reader import TensorInfo
from .roles import RoleDetails, file_role

__all__ = ["inspect_model", "ModelInspection", "ModelPart", "Companion", "WeightType", "QUANTIZED_PREFIXES", "RoleDetails"]

QUANTIZED_PREFIXES = ("Q", "IQ", "TQ", "MXFP", "NVFP", "F8_")  # block-quantized ggml types and 8-bit floats
MAX_SHOWN_NAME = 200  # a name read from a file is quoted this far in the evidence (a header may hold a 60 MB one)


@dataclass
class WeightType:
    dtype: str  # safetensors dtype (F16, BF16, F8_E4M3 ...) or ggml type (Q4_K, Q8_0 ...)
    tensors: int
    parameters: int


@dataclass
class ModelPart:
    """One part the file holds: the diffusion model, a VAE or a text encoder."""

    component: str  # diffusion_model | vae | text_encoder | other
    kind: str  # the family, VAE or text encoder id ("unknown" when not told)
    name: str
    prefix: str  # the tensor-name prefix it lives under ("" for a file holding only it)
    layout: str  # original | diffusers | sd.cpp | separate file | bare
    tensors: int
    parameters: int
    # a VAE's parameters that a decode-only load builds (its decoder and post_quant_conv, Wan's conv2):
    # text-to-image loads no encoder (src/auto_encoder_kl.hpp, src/wan.hpp decode_only); 0 for other parts
    decoder_parameters: int = 0
    # {ggml block size: parameters stable-diffusion.cpp converts to a type of that block} (.conversion)
    convertible: Dict[int, int] = field(default_factory=dict)


@dataclass
class Companion:
    """A part the family needs that the file does not hold, with the file names users know it by."""

    component: str  # vae | text_encoder
    kind: str
    name: str
    files: List[str]
    source: str


@dataclass
class ModelInspection:
    """What a model file is, read from its headers only."""

    path: str
    format: str  # safetensors | gguf | ckpt | diffusers
    size_bytes: int
    # checkpoint | diffusion_model | vae | text_encoder | components | unknown, or a file generate takes beside a model
    # (engine.models.roles): lora | controlnet | embedding | taesd | upscaler
    role: str
    family: str  # a family id (a LoRA's, ControlNet's, embedding's: the family it is for), "none" or "unknown"
    family_name: str  # for people: the variant's name when one is told ("FLUX.1 [dev]")
    variant: str  # e.g. dev / schnell / inpaint; "" when the family has none or it is not told
    tensors: int  # 0 when the names are not read (then parameters is None): no count is claimed
    parameters: Optional[int]  # None when the headers give no shapes (a legacy pickle)
    weight_types: List[WeightType] = field(default_factory=list)
    quantization: str = ""  # the quantized type holding most weights ("" when none)
    parts: List[ModelPart] = field(default_factory=list)
    needs: List[Companion] = field(default_factory=list)
    fits: List[str] = field(default_factory=list)  # for a VAE or text encoder file: families it serves
    evidence: List[str] = field(default_factory=list)
    source: str = ""  # where the rule that named the family comes from
    details: Optional[RoleDetails] = None  # a LoRA's kind and rank, an embedding's width... (engine.models.roles)


def inspect_model(path: Union[str, Path], data: Optional[Knowledge] = None) -> ModelInspection:
    """Inspect one model file or diffusers folder; raise ``ModelLoadError`` when it cannot be read.

    The headers are read on every call (a file changed on disk is seen at once); classifying them, the
    costly part (a generate job inspects its model three times, a warm session's every job again), is
    a pure function of what was read, so it is remembered by that (:func:`_classified`)."""
    info = check_model(path)
    k = data or knowledge()
    tensors, why = _tensors(info)
    if tensors is not None and data is None:
        return _classified(info, tuple(tensors), k)
    return _classify(info, tensors, why, k)


_CACHE: collections.OrderedDict[Tuple[Any, ...], ModelInspection] = collections.OrderedDict()
_CACHE_SIZE = 16
_CACHE_LOCK = threading.Lock()


def _classified(info: ModelFile, tensors: Tuple[TensorInfo, ...], k: Knowledge) -> ModelInspection:
    """The inspection of these headers, remembered by all they hold (the file's path, kind and size, every
    tensor's name, shape and dtype): the same headers classify the same; a copy, as callers amend theirs."""
    key = (id(k), info.path, info.kind, info.size_bytes, info.tensors, info.archive, tensors)
    with _CACHE_LOCK:
        found = _CACHE.get(key)
        if found is not None:
            _CACHE.move_to_end(key)
            return copy.deepcopy(found)
    result = _classify(info, list(tensors), "", k)
    with _CACHE_LOCK:
        _CACHE[key] = copy.deepcopy(result)
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return result


def _classify(info: ModelFile, tensors: Optional[List[TensorInfo]], why: str, k: Knowledge) -> ModelInspection:
    if tensors is None:
        return ModelInspection(info.path, info.kind, info.size_bytes, "unknown", "unknown", "unknown", "", 0,
                               None, evidence=[why])
    special = file_role(tensors)
    if special is None:
        return _inspect(info, tensors, k)
    role, family, details, why = special
    if role == "taesd":  # a VAE's kind of file (--taesd), read as one, its kind told
        result = _inspect(info, tensors, k)
        result.details = details
        result.evidence.append(why)
        return result
    name = next((f.name for f in k.families if f.id == family), family)
    result = ModelInspection(info.path, info.kind, info.size_bytes, role, family, name, "", len(tensors),
                             sum(_count(t.shape) for t in tensors), evidence=[why], details=details)
    _weights(result, tensors)
    return result


# -- reading the tensors ------------------------------------------------------------------------------
def _tensors(info: ModelFile) -> Tuple[Optional[List[TensorInfo]], str]:
    found = tensor_index(info)
    if found:
        return found, ""
    if found is not None:  # a checkpoint's pickle followed to its end, with no dict of tensors in reach
        return None, ("the checkpoint's data.pkl holds no tensor where a state dict keeps them (nested dicts), "
                      "so its tensor names are unknown")
    if not info.archive:
        return None, ("a legacy (non-zip) torch pickle: its tensor names are not read without unpickling it; "
                      "convert it to safetensors to inspect it")
    return None, ("the checkpoint's data.pkl uses pickle constructs accelstack does not follow without "
                  "unpickling it, so its tensor names are unknown")


# -- classifying --------------------------------------------------------------------------------------
def _prefix_rule(name: str, rules: Sequence[PrefixRule]) -> Optional[PrefixRule]:
    best: Optional[PrefixRule] = None
    for rule in rules:
        if name.startswith(rule.prefix) and (best is None or len(rule.prefix) > len(best.prefix)):
            best = rule
    return best


def _count(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _holds(cond: Condition, names: List[str], context_dim: int, input_channels: int) -> bool:
    def has(s: str) -> bool:
        return any(s in n for n in names)

    return ((not cond.any or any(has(s) for s in cond.any)) and all(has(s) for s in cond.all)
            and not any(has(s) for s in cond.none)
            and (not cond.context_dim or context_dim in cond.context_dim)
            and (not cond.input_channels or input_channels in cond.input_channels))


def _first(names: List[str], pick: Dict[str, Tuple[int, ...]], suffixes: Sequence[str], exact: bool) -> Optional[str]:
    for n in names:
        if any(n == s if exact else n.endswith(s) for s in suffixes) and len(pick[n]) >= 2:
            return n
    return None


def _inspect(info: ModelFile, tensors: List[TensorInfo], k: Knowledge) -> ModelInspection:
    groups: Dict[Tuple[str, str], List[TensorInfo]] = collections.OrderedDict()
    layouts: Dict[Tuple[str, str], str] = {}
    bare: List[TensorInfo] = []
    for t in tensors:
        rule = _prefix_rule(t.name, k.prefixes)
        if rule is None:
            bare.append(t)
            continue
        key = (rule.component, rule.group or rule.prefix)
        groups.setdefault(key, []).append(t)
        layouts[key] = rule.layout
    # the diffusion model: prefixed tensors with the prefix removed, plus bare ones
    dm_prefixed = [(key, ts) for key, ts in groups.items() if key[0] == "diffusion_model"]
    shapes: Dict[str, Tuple[int, ...]] = {}
    dm_names: List[str] = []
    for (_, prefix), ts in dm_prefixed:
        for t in ts:
            shapes[t.name[len(prefix):]] = t.shape
            dm_names.append(t.name[len(prefix):])
    for t in bare:
        shapes[t.name] = t.shape
        dm_names.append(t.name)
    evidence: List[str] = []
    encoders = _encoder_parts(groups, layouts, k)
    context_dim, input_channels = 0, 0
    to_k = _first(dm_names, shapes, ["attn2.to_k.weight"], exact=False)
    if to_k:
        context_dim = shapes[to_k][-1]
        evidence.append(f"cross-attention context width {context_dim} (tensor {to_k[:MAX_SHOWN_NAME]!r}: {list(shapes[to_k])})")
    else:
        clip = [p for p in encoders if p.kind in ("clip-l", "openclip-h")]
        if clip:
            context_dim = next(e.width for e in k.encoders if e.id == clip[0].kind)
            evidence.append(f"text encoder width {context_dim} ({clip[0].name})")
    conv = _first(dm_names, shapes, k.input_tensors, exact=True)
    if conv:
        input_channels = shapes[conv][1]
    family, variant, variant_name = _family(dm_names, context_dim, input_channels, k, evidence)
    parts: List[ModelPart] = []
    for (_, prefix), ts in dm_prefixed:
        parts.append(_part("diffusion_model", family.id if family else "unknown",
                           family.name if family else "diffusion model (family not recognised)", prefix,
                           layouts[("diffusion_model", prefix)], ts))
    if bare:
        if family:
            parts.append(_part("diffusion_model", family.id, family.name, "", "bare", bare))
        else:
            parts.append(_part("other", "unknown", "tensors of no known part", "", "bare", bare))
    parts += _vae_parts(groups, layouts, k) + encoders
    has_dm = any(p.component == "diffusion_model" for p in parts)
    components = {p.component for p in parts}
    role = ("checkpoint" if has_dm and len(components - {"other"}) > 1 else "diffusion_model" if has_dm
            else "unknown" if components <= {"other"} else next(iter(components - {"other"}))
            if len(components - {"other"}) == 1 else "components")
    result = ModelInspection(info.path, info.kind, info.size_bytes, role,
                             family.id if family else ("unknown" if has_dm or role == "unknown" else "none"),
                             (variant_name or family.name if family else "unknown" if has_dm or role == "unknown" else "none"),
                             variant, len(tensors), sum(_count(t.shape) for t in tensors), parts=parts,
                             evidence=evidence)
    _weights(result, tensors)
    if family:
        result.source = k.source(family.source)
        result.needs = _needs(family, variant, parts, k)
    elif has_dm or role == "unknown":
        top = collections.Counter(".".join(t.name.split(".", 2)[:2])[:MAX_SHOWN_NAME] for t in tensors)
        shown = ", ".join(f"{p} ({n})" for p, n in top.most_common(8))
        result.evidence.append(f"no family rule matched; top-level tensor prefixes: {shown}")
    if not has_dm:
        served = {p.kind for p in parts if p.component in ("vae", "text_encoder")}
        result.fits = [f.id for f in k.families if served & (set(f.vaes) | set(f.text_encoders))]
    return result


def _family(names: List[str], context_dim: int, input_channels: int, k: Knowledge,
            evidence: List[str]) -> Tuple[Optional[FamilyRule], str, str]:
    if not names:
        return None, "", ""
    for family in k.families:
        if not _holds(family.when, names, context_dim, input_channels):
            continue
        marker = next((f"{n[:MAX_SHOWN_NAME]!r} contains {s!r}" for s in family.when.any + family.when.all for n in names if s in n), "")
        evidence.append(f"{family.id}: {marker or 'its measured widths'} (rule from {k.source(family.source)})")
        for var in family.variants:
            if _holds(var.when, names, context_dim, input_channels):
                why = next((f"{n[:MAX_SHOWN_NAME]!r} contains {s!r}" for s in var.when.any for n in names if s in n), "")
                if var.when.input_channels:
                    why = f"the input layer takes {input_channels} channels"
                evidence.append(f"variant {var.id}: {why or 'none of the other variants matched'} "
                                f"(rule from {k.source(var.source)})")
                return family, var.id, var.name
        return family, "", ""
    return None, "", ""


def _part(component: str, kind: str, name: str, prefix: str, layout: str, ts: List[TensorInfo]) -> ModelPart:
    return ModelPart(component, kind, name, prefix, layout, len(ts), sum(_count(t.shape) for t in ts),
                     convertible=convertible((t.name, tuple(t.shape)) for t in ts))


def _encoder_parts(groups: Dict[Tuple[str, str], List[TensorInfo]], layouts: Dict[Tuple[str, str], str],
                   k: Knowledge) -> List[ModelPart]:
    out = []
    for key, ts in groups.items():
        if key[0] != "text_encoder":
            continue
        kind, name = "unknown", "text encoder (not recognised)"
        for t in ts:
            match = next((e for e in k.encoders if any(t.name.endswith(s) for s in e.embedding)
                          and len(t.shape) == 2 and t.shape[-1] == e.width), None)
            if match:
                kind, name = match.id, match.name
                break
        out.append(_part("text_encoder", kind, name, "" if key[1] in ("clip", "t5", "llm", "gguf") else key[1],
                         layouts[key], ts))
    return out


def _vae_parts(groups: Dict[Tuple[str, str], List[TensorInfo]], layouts: Dict[Tuple[str, str], str],
               k: Knowledge) -> List[ModelPart]:
    # a VAE's tensors may sit under several bare prefixes (encoder., decoder., quant_conv.): one part each prefix family
    by_layout: Dict[str, List[TensorInfo]] = collections.OrderedDict()
    prefix_of: Dict[str, str] = {}
    for key, ts in groups.items():
        if key[0] == "vae":
            shared = "" if layouts[key] == "separate file" else key[1]
            by_layout.setdefault(shared, []).extend(ts)
            prefix_of[shared] = layouts[key]
    out = []
    for prefix, ts in by_layout.items():
        kind, name = "unknown", "VAE (not recognised)"
        latent = next((t for t in ts if any(t.name.endswith(s) for s in k.latent_tensors) and len(t.shape) >= 2), None)
        if latent:
            match = next((v for v in k.vaes if v.latent_channels == latent.shape[1] and v.dims == len(latent.shape)), None)
            if match:
                kind, name = match.id, match.name
        part = _part("vae", kind, name, prefix, prefix_of[prefix], ts)
        part.decoder_parameters = sum(_count(t.shape) for t in ts if _decoder_tensor(t.name, prefix))
        out.append(part)
    return out


# what a decode-only VAE load builds, by the first name segment after the part's prefix
_DECODER_ROOTS = ("decoder.", "post_quant_conv.", "conv2.")


def _decoder_tensor(name: str, prefix: str) -> bool:
    rest = name[len(prefix):] if prefix and name.startswith(prefix) else name
    return rest.startswith(_DECODER_ROOTS)  # an encoder's ResBlocks have conv2 too: only the first segment


def _needs(family: FamilyRule, variant: str, parts: List[ModelPart], k: Knowledge) -> List[Companion]:
    """The companions ``parts`` lack: the variant's own text encoders where it names them (FLUX.2 [klein]
    takes Qwen3, [dev] Mistral: never the other's), else the family's."""
    out: List[Companion] = []
    var = next((v for v in family.variants if v.id == variant and v.text_encoders), None)
    have = {p.kind for p in parts}
    if family.vaes and not any(p.component == "vae" for p in parts):
        vae = next(v for v in k.vaes if v.id == family.vaes[0])
        out.append(Companion("vae", vae.id, vae.name, list(vae.files), _cite(k, k.vae_source)))
    for te_id in var.text_encoders if var else family.text_encoders:
        if te_id not in have:
            te = next(e for e in k.encoders if e.id == te_id)
            out.append(Companion("text_encoder", te.id, te.name, list(te.files), _cite(k, k.encoder_source)))
    return out


def _cite(k: Knowledge, key: str) -> str:
    return f"{k.source(key)}; file names: {k.source(k.files_source)}"


def _weights(result: ModelInspection, tensors: List[TensorInfo]) -> None:
    hist: Dict[str, List[int]] = {}
    for t in tensors:
        row = hist.setdefault(t.dtype, [0, 0])
        row[0] += 1
        row[1] += _count(t.shape)
    result.weight_types = [WeightType(d, n, p) for d, (n, p) in sorted(hist.items(), key=lambda kv: -kv[1][1])]
    quantized = [w for w in result.weight_types if w.dtype.startswith(QUANTIZED_PREFIXES)]
    result.quantization = quantized[0].dtype if quantized else ""
