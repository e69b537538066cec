"""Whether stable-diffusion.cpp 0.4.7 can apply a LoRA's tensors to a model, told from the headers alone.

A LoRA that names the model's weights can still abort the worker: stable-diffusion.cpp multiplies each
module's lora_up by its lora_down without checking that their ranks meet (``ggml_ext_merge_lora`` in
src/ggml_extend.hpp: ``GGML_ASSERT(ggml_can_mul_mat)``), casts every tensor to f32 with a matrix product
(``ggml_ext_cast_f32``: an I32 tensor segfaults), reads an alpha's first value whatever its size (an
empty one aborts), and applies a module only when both halves are there (src/lora.hpp
``get_lora_weight_diff``; a lone half changes nothing). On a model with quantized weights (or loaded
with a quantized weight_type) it applies LoRAs at run time instead (``get_out_diff``): a lora_down
then multiplies the layer's input as a linear layer's or a convolution's weight, so its layout must be
the layer's. The cases were run on the CPU build (aborting, or applied), with the model as stored
and as Q8_0. The naming conventions are :mod:`accelstack.engine.loras.names`'.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from ..errors import InvalidRequestError
from ..models.reader import TensorInfo
from .names import LORA_PARTS, canonical_module, dotted_module, is_kohya, kohya_dotted

__all__ = ["check_lora", "model_weights", "applied_at_runtime", "FLOAT_DTYPES", "LoraMatch"]

# The float types stable-diffusion.cpp casts to f32 (ggml_ext_cast_f32): those the loader reads a
# safetensors or torch file's tensors as (safetensors_io.cpp safetensors_dtype_to_ggml_type, pickle_io.cpp
# parse_storage_type: F64 as F32, F8 as F16), and a GGUF file's F32/F16/BF16 as they are (no F64, no
# quantized type). An alpha or scale may also be an integer (ggml_ext_backend_tensor_get_f32 reads I32).
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2")
SCALAR_DTYPES = FLOAT_DTYPES + ("I32", "I64")
GGUF_FLOAT_DTYPES = ("F32", "F16", "BF16")
GGUF_SCALAR_DTYPES = GGUF_FLOAT_DTYPES + ("I32",)
# A LoRA tensor's role, from its name's suffix (name_conversion.cpp convert_tensor_name's lora_suffix_map).
_ROLES = {"lora_down": "lora_down", "lora.down": "lora_down", "lora_A": "lora_down", "lora_up": "lora_up",
          "lora.up": "lora_up", "lora_B": "lora_up", "lora_mid": "lora_mid", "lora.mid": "lora_mid",
          "lora_linear": "alpha"}
_HALVES = ("hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b")
# A diffusers DiT module that is a slice of a fused weight (its module is not the weight's own): the index
# stable-diffusion.cpp gives it (src/name_conversion.cpp: to_k as qkv.weight.1, proj_mlp as linear1.weight.3;
# FLUX.1, SD3, Z-Image). It applies the slices from .weight on, up to the first one missing.
_SLICES = {"to_q": 0, "add_q_proj": 0, "to_k": 1, "add_k_proj": 1, "to_v": 2, "add_v_proj": 2, "proj_mlp": 3}
_SLICE = re.compile(r"(?:^|[._])(" + "|".join(_SLICES) + r")$")
_QUANTIZED = ("Q", "IQ", "TQ", "MXFP", "NVFP")  # the block-quantized ggml types (ggml_is_quantized), by name
Key = Tuple[str, str]


@dataclass
class _Module:
    """One module of a LoRA file: its tensors by role, and the model weight it names."""

    key: Key
    kohya: bool
    roles: Dict[str, TensorInfo] = field(default_factory=dict)


def _role(suffix: str) -> str:
    role = suffix.lstrip("._")
    for tail in (".weight", ".default"):
        role = role[:-len(tail)] if role.endswith(tail) else role
    return _ROLES.get(role, role)


def _modules(tensors: List[TensorInfo], flux: bool) -> Dict[str, _Module]:
    """The LoRA's modules by their name in the file (``flux``: for a FLUX.1 model); those naming no part of
    a model are left out."""
    out: Dict[str, _Module] = {}
    for t in tensors:
        m = LORA_PARTS.search(t.name)
        if not m:
            continue
        base = t.name[:m.start()]
        key = canonical_module(base, flux, lora=True)
        if key is None:
            continue
        out.setdefault(base, _Module(key, is_kohya(base))).roles[_role(m.group(0))] = t
    return out


def model_weights(tensors: List[TensorInfo]) -> Tuple[Dict[Key, Tuple[int, ...]], Dict[Key, str]]:
    """({key: shape} of the model's weights, {key: dotted name} of a DiT's diffusion weights), in one pass.
    The second is empty for a UNet model, whose kohya names stable-diffusion.cpp reads through the UNet's
    own conversion; for a DiT it is what a kohya module is checked against (:func:`kohya_dotted`)."""
    out: Dict[Key, Tuple[int, ...]] = {}
    dit: Dict[Key, str] = {}
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


def _count(shape: Tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _shape(t: TensorInfo) -> str:
    return "x".join(map(str, t.shape)) or "a scalar"


def _rows(shape: Tuple[int, ...], even: bool) -> int:
    """The rows ``ggml_ext_merge_lora`` flattens a tensor to: ``ne[ggml_n_dims - 1]``, ggml_n_dims rounded
    up to even for a lora_down ("otherwise rank 1 doesn't work"); ggml_n_dims drops outer sizes of 1."""
    ne = list(reversed(shape)) + [1] * (4 - len(shape))
    dims = next((i + 1 for i in (3, 2, 1) if ne[i] != 1), 1)
    return ne[dims + dims % 2 - 1] if even else ne[dims - 1]


def _damaged(name: str, module: str, why: str) -> InvalidRequestError:
    return InvalidRequestError(f"the LoRA {name} cannot be applied: its module {module[:80]} {why}",
                               hint="the LoRA file is damaged or is not a LoRA stable-diffusion.cpp reads; "
                                    "re-download it or remove it from the folder")


def _check_tensors(name: str, base: str, module: _Module, gguf: bool) -> None:
    """Types, sizes and halves of a module that names a model weight (each one aborts, or changes nothing)."""
    for role, t in sorted(module.roles.items()):
        scalar = role in ("alpha", "scale")
        allowed = (GGUF_SCALAR_DTYPES if scalar else GGUF_FLOAT_DTYPES) if gguf else \
            (SCALAR_DTYPES if scalar else FLOAT_DTYPES)
        if t.dtype not in allowed:
            raise _damaged(name, base, f"has its {role} stored as {t.dtype}: stable-diffusion.cpp applies "
                           f"only {', '.join(allowed)} tensors{' of a GGUF file' if gguf else ''} (it crashes "
                           "casting any other to f32)")
        if _count(t.shape) == 0:
            raise _damaged(name, base, f"has {'an' if role[0] in 'aeiou' else 'a'} {role} of shape {list(t.shape)}, "
                           "which holds no value")
    halves = [role for role in ("lora_down", "lora_mid", "lora_up") if role in module.roles]
    if halves and len({"lora_down", "lora_up"} & set(halves)) < 2:
        lack = " or ".join(role for role in ("lora_down", "lora_up") if role not in halves)
        raise _damaged(name, base, f"has a {' and a '.join(halves)} but no {lack}: stable-diffusion.cpp applies a "
                       "module only with both (src/lora.hpp get_lora_weight_diff), so it would change nothing")


def _product(name: str, base: str, module: _Module, roles: Tuple[str, str] = ("lora_down", "lora_up")) -> Tuple[int, int]:
    """(rows, columns) of the lora_up x lora_down product stable-diffusion.cpp adds to the model weight
    (``ggml_ext_merge_lora``, emulated); InvalidRequestError where computing it aborts. ``roles``: the
    (down, up) pair multiplied (a LoHa's hada_w1_b and hada_w1_a, a LoKr's lokr_w1_b and lokr_w1_a)."""
    down, up = module.roles[roles[0]], module.roles[roles[1]]
    mid = module.roles.get("lora_mid") if roles[0] == "lora_down" else None
    for t, role in ((down, roles[0]), (up, roles[1])):
        if len(t.shape) not in (2, 4):
            dims = f"{len(t.shape)} dimension{'s' * (len(t.shape) != 1)}"
            raise _damaged(name, base, f"has a {role} of {_shape(t)} ({dims}): stable-diffusion.cpp applies a {roles[0]} "
                           f"and {roles[1]} as matrices (2 dimensions) or convolution kernels (4)")
    up_rows, down_rows = _rows(up.shape, False), _rows(down.shape, True)
    up_rank, down_cols = _count(up.shape) // up_rows, _count(down.shape) // down_rows
    if mid is None:
        if up_rank != down_rows:
            raise _damaged(name, base, f"has a {roles[0]} of {_shape(down)} (rank {down_rows}) and a {roles[1]} of "
                           f"{_shape(up)} (rank {up_rank}): stable-diffusion.cpp multiplies the two "
                           "(ggml_ext_merge_lora in src/ggml_extend.hpp) and aborts when the ranks differ")
        return up_rows, down_cols
    # Tucker: down (rank, in, 1, 1), mid (rank, rank', kh, kw), up (out, rank', 1, 1) (ggml_ext_mul_n_mode)
    if len(mid.shape) != 4 or (mid.shape[0], mid.shape[1]) != (down_rows, up_rank) or len(down.shape) != 4 \
            or tuple(down.shape[2:]) != (1, 1):
        raise _damaged(name, base, f"has a lora_mid of {_shape(mid)} that does not join its lora_down of "
                       f"{_shape(down)} and lora_up of {_shape(up)} (ggml_ext_merge_lora aborts on it)")
    return up_rows, down_cols * _count(mid.shape[2:])


def _check_layout(name: str, base: str, module: _Module, shape: Tuple[int, ...]) -> None:
    """A LoRA that fits the weight as stored can still abort where stable-diffusion.cpp applies it at run
    time (src/lora.hpp ``get_out_diff``: for quantized weights, which the memory planner may also choose),
    where the lora_down multiplies the layer's input and the lora_up the lora_down's output: the ranks
    must meet in PyTorch's order, a linear layer's LoRA must be matrices, a convolution's lora_down a
    kernel of the layer's size (a matrix for a 1x1 one), and a lora_up a matrix or a 1x1 kernel."""
    down, up, mid = module.roles["lora_down"], module.roles["lora_up"], module.roles.get("lora_mid")
    weight, rank = "x".join(map(str, shape)), down.shape[0]
    if up.shape[1] != rank or (mid is not None and tuple(mid.shape[:2]) != (rank, rank)):
        raise _damaged(name, base, f"has a lora_down of {_shape(down)} and a lora_up of {_shape(up)}"
                       f"{f' and a lora_mid of {_shape(mid)}' if mid is not None else ''}: where stable-diffusion.cpp "
                       f"applies LoRAs at run time (for quantized weights) each takes the {rank} outputs of the one "
                       "before as its inputs, and ggml_can_mul_mat aborts otherwise")
    if len(shape) == 2 and (len(down.shape), len(up.shape)) != (2, 2):
        raise _damaged(name, base, f"has a lora_down of {_shape(down)} and a lora_up of {_shape(up)} for the linear "
                       f"weight {weight}: a linear layer's LoRA must be matrices, as stable-diffusion.cpp aborts on "
                       "kernels where it applies LoRAs at run time (ggml_can_mul_mat; for quantized weights)")
    if len(shape) != 4:
        return
    kernel, down_kernel = tuple(shape[2:]), (1, 1) if mid is None else tuple(mid.shape[2:])
    if len(down.shape) == 4 and mid is None:
        down_kernel = tuple(down.shape[2:])
    if down_kernel != kernel or (len(up.shape) == 4 and tuple(up.shape[2:]) != (1, 1)):
        raise _damaged(name, base, f"has a lora_down of {_shape(down)} and a lora_up of {_shape(up)} for the "
                       f"convolution {weight}: its lora_down must have the layer's {'x'.join(map(str, kernel))} "
                       "kernel and its lora_up a 1x1 one, as stable-diffusion.cpp aborts on others where it "
                       "applies LoRAs at run time (src/lora.hpp get_out_diff; for quantized weights)")


def _ne(shape: Tuple[int, ...]) -> List[int]:
    return list(reversed(shape))[:4] + [1] * (4 - min(len(shape), 4))


def _check_lycoris_size(name: str, base: str, module: _Module, shape: Tuple[int, ...],
                        scalar: InvalidRequestError) -> None:
    """A LoHa's (hada_w1_a x hada_w1_b) * (hada_w2_a x hada_w2_b) and a LoKr's lokr_w1 (or lokr_w1_a x lokr_w1_b)
    Kronecker lokr_w2 (or its pair) (src/lora.hpp get_loha_weight_diff, get_lokr_weight_diff): the two LoHa
    products must be one size (ggml_mul), and the result as many values as the model weight, or a matrix of
    its columns and fewer rows, which it pads (get_weight_diff: GGML_ASSERT on the counts)."""
    roles, weight = module.roles, "x".join(map(str, shape)) or "a scalar"
    if set(_HALVES) <= set(roles):
        if {"hada_t1", "hada_t2"} & set(roles):
            return  # Tucker LoHa: the cores' layout is LyCORIS's own; sd.cpp's emulation is not repeated here
        first = _product(name, base, module, ("hada_w1_b", "hada_w1_a"))
        second = _product(name, base, module, ("hada_w2_b", "hada_w2_a"))
        if first != second:
            raise _damaged(name, base, f"has hada_w1_a x hada_w1_b of {first[0]}x{first[1]} and hada_w2_a x hada_w2_b "
                           f"of {second[0]}x{second[1]}: stable-diffusion.cpp multiplies the two value by value "
                           "(src/lora.hpp get_loha_weight_diff) and aborts on two sizes")
        ne, what = [first[1], first[0], 1, 1], f"hada_w1_a x hada_w1_b is {first[0]}x{first[1]}"
    elif "lokr_w1" in roles or "lokr_w1_a" in roles:
        factors = []
        for i in (1, 2):
            whole = roles.get(f"lokr_w{i}")
            if whole is not None:
                factors.append(_ne(whole.shape))
            else:
                rows, cols = _product(name, base, module, (f"lokr_w{i}_b", f"lokr_w{i}_a"))
                factors.append([cols, rows, 1, 1])
        ne = [a * b for a, b in zip(*factors)]
        dims = list(reversed(ne))
        while len(dims) > 2 and dims[0] == 1:
            dims.pop(0)
        what = f"lokr_w1 (x) lokr_w2 is {'x'.join(map(str, dims))}"
    else:
        return
    values = _count(tuple(ne))
    if not shape and values != 1:
        raise scalar  # a weight of no dimensions (issue 44: the flag and the weight named)
    dims2 = ne[2] == ne[3] == 1
    if values != _count(shape) and not (len(shape) == 2 and dims2 and ne[0] == shape[1] and values < _count(shape)):
        raise InvalidRequestError(
            f"the LoRA {name} does not fit this model: its module {base[:80]}'s {what} ({values} values), the model's "
            f"weight {weight} ({_count(shape)}): stable-diffusion.cpp aborts on a change of another size "
            "(src/lora.hpp get_weight_diff)", hint="the LoRA was trained for another model family; use one made for this model")


def _applies(module: _Module) -> bool:
    roles = module.roles
    lokr = all(f"lokr_w{i}" in roles or {f"lokr_w{i}_a", f"lokr_w{i}_b"} <= set(roles) for i in (1, 2))
    return "lora_down" in roles or "diff" in roles or "diff_b" in roles or set(_HALVES) <= set(roles) or lokr


def applied_at_runtime(tensors: List[TensorInfo], weight_type: str = "") -> str:
    """Why stable-diffusion.cpp will apply LoRAs at run time rather than to the weights as loaded, or "": its
    "auto" lora_apply_mode (the bindings' default) does so when any weight it loads is quantized, as stored
    or converted on load (``weight_type``; src/stable-diffusion.cpp ``have_quantized_weight``)."""
    if weight_type.upper().startswith(_QUANTIZED):
        return f"the weight type {weight_type} (--weight-type, or the memory plan's choice) quantizes its weights"
    found = next((t for t in tensors if t.dtype.upper().startswith(_QUANTIZED)), None)
    return f"the model's weights are quantized, such as {found.name[:60]} in {found.dtype}" if found else ""


@dataclass(frozen=True)
class LoraMatch:
    """What stable-diffusion.cpp applies of a LoRA: the model ``weights`` it changes, and ``applied`` of the
    file's ``total`` tensors, counted as it counts them ("(applied / total) LoRA tensors have been applied",
    src/lora.hpp LoraModel::stat: a module's halves, its mid, its alpha or scale, once applied)."""

    weights: int
    applied: int
    total: int

    @property
    def partial(self) -> bool:
        return self.applied < self.total


def _applied_tensors(module: _Module) -> int:
    """The tensors of one applied module that stable-diffusion.cpp marks applied (src/lora.hpp): a lora_down and
    lora_up (and lora_mid), with the scale, else the alpha; a diff; a LoHa's halves, Tucker cores and alpha; a
    LoKr's factors and alpha."""
    roles = set(module.roles)
    if {"lora_down", "lora_up"} <= roles:
        return 2 + ("lora_mid" in roles) + bool(roles & {"scale", "alpha"})
    if roles & {"diff", "diff_b"}:
        return len(roles & {"diff", "diff_b"})
    if set(_HALVES) <= roles:
        return 4 + len(roles & {"hada_t1", "hada_t2", "alpha"})
    return len(roles & {"lokr_w1", "lokr_w1_a", "lokr_w1_b", "lokr_w2", "lokr_w2_a", "lokr_w2_b", "alpha"})


def _scalar(name: str, module: _Module, what: str, dotted: Optional[str], model_label: str) -> InvalidRequestError:
    weight = f"{dotted}.weight" if dotted else "_".join(module.key)
    return InvalidRequestError(
        f"the LoRA {name} does not fit this model: its {'_'.join(module.key)} is {what}, and the weight {weight} of "
        f"{model_label or 'the model'} a scalar (no dimensions), which no LoRA changes",
        hint="the model file is damaged (its weight holds one value), or the LoRA was trained for another model family; "
             "re-download the model, or use a LoRA made for it")


def check_lora(name: str, tensors: List[TensorInfo], model: Dict[Key, Tuple[int, ...]],
               dit: Optional[Dict[Key, str]] = None, gguf: bool = False, at_runtime: str = "",
               model_label: str = "") -> LoraMatch:
    """What of the LoRA of ``tensors`` applies to the model (:class:`LoraMatch`); InvalidRequestError when none, or when
    stable-diffusion.cpp would abort on it. ``dit``: a DiT model's dotted names, against which a kohya
    module is read as stable-diffusion.cpp reads it (:func:`kohya_dotted`); ``gguf``: the LoRA is a GGUF
    file (whose types the loader keeps); ``at_runtime``: why stable-diffusion.cpp will apply it at run time
    (:func:`applied_at_runtime`), or empty; ``model_label``: the flag and file that gave the model, as messages name it."""
    modules = _modules(tensors, flux=any(module.startswith("double_blocks_") for _part, module in model))
    misread = {base: m for base, m in modules.items()
               if dit and m.kohya and m.key in dit and kohya_dotted(m.key[1]) != dit[m.key]}
    for base in misread:
        del modules[base]
    if misread and not any(m.key in model for m in modules.values()):
        (part, flat) = next(iter(misread.values())).key
        raise InvalidRequestError(
            f"the LoRA {name} changes nothing in this model: stable-diffusion.cpp 0.4.7 reads its kohya name "
            f"lora_{part}_{flat} as {kohya_dotted(flat)}, not the model's {(dit or {})[(part, flat)]} (it turns every "
            "underscore into a dot but in the words it knows: src/name_conversion.cpp convert_sep_to_dot), so none "
            f"of its {len(misread)} such modules would apply",
            hint="use the LoRA in the model's own dotted names (ComfyUI's diffusion_model.… or diffusers' "
                 "transformer.…), or a runtime whose name conversion knows this family's words")
    if not modules:
        raise InvalidRequestError(f"the LoRA {name} holds no LoRA tensors stable-diffusion.cpp reads "
                                  f"({len(tensors)} tensors, none named like lora_down/lora_up or lora_A/lora_B)",
                                  hint="use a LoRA in the kohya, diffusers/PEFT or stable-diffusion.cpp naming")
    changed: Set[Key] = set()
    slots: Dict[Key, Dict[int, int]] = {}  # of each weight, the rows each of its slices' modules changes
    used: Dict[Key, Dict[int, int]] = {}  # of each weight, the LoRA tensors each slice's modules apply
    for base, module in sorted(modules.items()):
        shape = model.get(module.key)
        if shape is None:
            continue  # never applied: stable-diffusion.cpp warns of it as unused, and no more
        _check_tensors(name, base, module, gguf)
        if not _applies(module):
            continue
        found = _SLICE.search(base)
        index = _SLICES[found.group(1)] if found and not module.key[1].endswith(found.group(1)) else 0
        count = used.setdefault(module.key, {})
        count[index] = count.get(index, 0) + _applied_tensors(module)
        diff = module.roles.get("diff")
        if diff is not None and _count(diff.shape) != _count(shape) and not (
                len(shape) == len(diff.shape) == 2 and diff.shape[1] == shape[1] and diff.shape[0] < shape[0]):
            raise _damaged(name, base, f"has a diff of {_shape(diff)} for the model weight "
                           f"{'x'.join(map(str, shape))}: stable-diffusion.cpp aborts on a diff of another size "
                           "(src/lora.hpp get_weight_diff)")
        if "lora_down" in module.roles:
            if not shape:  # a scalar weight has no rows for the product to add to (issue 47: IndexError)
                raise _scalar(name, module, "a lora_down/lora_up pair", (dit or {}).get(module.key), model_label)
            out_rows, in_count = _product(name, base, module)
            want_rows, want_in = int(shape[0]), _count(shape[1:])
            fits = (out_rows, in_count) == (want_rows, want_in) or (
                len(shape) == 2 and in_count == want_in and out_rows < want_rows)  # sd.cpp pads that case
            if not fits:
                raise InvalidRequestError(
                    f"the LoRA {name} does not fit this model: its {'_'.join(module.key)} is {out_rows}x{in_count}, "
                    f"the model's weight {'x'.join(map(str, shape))}",
                    hint="the LoRA was trained for another model family; use one made for this model")
            _check_layout(name, base, module, shape)
            slot = slots.setdefault(module.key, {})
            slot[index] = slot.get(index, 0) + out_rows
            continue
        _check_lycoris_size(name, base, module, shape, _scalar(
            name, module, "a LyCORIS module", (dit or {}).get(module.key), model_label))
        changed.add(module.key)
    applied = sum(sum(itertools.takewhile(bool, (slot.get(i, 0) for i in range(max(_SLICES.values()) + 1))))
                  for slot in used.values())
    for key, slot in sorted(slots.items()):
        # src/lora.hpp get_lora_weight_diff/get_out_diff: the slices .weight, .weight.1 ... until one is missing
        total = sum(itertools.takewhile(bool, (slot.get(i, 0) for i in range(max(_SLICES.values()) + 1))))
        if total:
            changed.add(key)
        want = int(model[key][0])
        if at_runtime and 0 < total < want and want % total:
            raise InvalidRequestError(
                f"the LoRA {name} changes {total} of the {want} rows of {'_'.join(key)}: stable-diffusion.cpp applies "
                f"LoRAs at run time here ({at_runtime}) and adds such a change repeated down the rows, which aborts "
                f"(ggml_can_repeat) as {total} does not divide {want}; it pads it only where it applies LoRAs to the "
                "weights as loaded",
                hint="use a model whose weights are not quantized (and --weight-type default or f16), or a LoRA that "
                     "covers the whole weight")
    if not changed:
        sample = sorted(m.key for m in modules.values())[0]
        raise InvalidRequestError(
            f"the LoRA {name} changes nothing in this model: none of its {len(modules)} modules "
            f"(such as {sample[0]}:{sample[1][:80]}) names a weight of the model with tensors it applies",
            hint="the LoRA was made for another model family (or another naming); use one made for this model")
    return LoraMatch(len(changed), applied, len(tensors))
