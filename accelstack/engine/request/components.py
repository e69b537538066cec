"""Component files, img2img and ControlNet: checked in the parent, before any process starts.

A request may name a model's parts as files of their own (``--diffusion-model``, ``--vae``,
``--clip-l``, ``--clip-g``, ``--t5xxl``, ``--llm``, ``--taesd``), a ControlNet (``--control-net``
with ``--control-image``) and an init image (``--init-image``). stable-diffusion.cpp loads each
file it is given under a fixed prefix (src/stable-diffusion.cpp ``new_sd_ctx``: ``vae.``,
``text_encoders.clip_l.transformer.``...) and fails on a file of the wrong kind late, or not at all
(a T5-XXL next to an SD 1.x UNet is read and never used), so each is checked here: the file itself
like the model (:func:`~accelstack.engine.models.check.check_model`: missing, a folder, a pipe, a
damaged header), then what its headers say it is (:func:`~accelstack.engine.models.inspection.inspect_model`)
against the family of the model, and the whole: a part given as ``--model`` and a family without
the parts stable-diffusion.cpp cannot run it without (a crash, or a load failure blamed on the model)
are refused. Paths go on absolute: the worker runs in a folder of its own. Images are read with a
bounded PNG reader (:func:`~accelstack.engine.png.read_input_png`) and must have the request's size:
nothing is resized, so the pixels the worker gets are the ones the user gave.
"""
from __future__ import annotations

import dataclasses
import os
import stat
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from ..errors import InvalidRequestError, ModelLoadError
from ..loras.names import LORA_PARTS
from ..models.check import ModelFile, check_model, tensor_index
from ..models.families import knowledge
from ..models.family_reports import NEEDED_ENCODERS, controlnet_faults
from ..models.inspection import ModelInspection, ModelPart, inspect_model
from ..models.reader import TensorInfo
from ..png import PngError, read_input_png
from ..worker.protocol import COMPONENT_FLAGS, GenerateRequest, flag_of, read_pixels

__all__ = ["CheckedComponents", "check_components", "TEXT_ENCODER_KINDS", "CONTROLNET_FAMILIES", "CONTROLNET_ABORTS", "CONTROLNET_LINEAR", "UNET_FAMILIES"]

# The text-encoder kinds (data/model_families.json "text_encoders") each flag takes.
TEXT_ENCODER_KINDS: Dict[str, Tuple[str, ...]] = {
    "clip_l": ("clip-l", "openclip-h"),  # SD 2.x's OpenCLIP-H goes where SD 1.x's CLIP-L does (cond_stage_model.)
    "clip_g": ("clip-g",),
    "t5xxl": ("t5xxl",),
    "llm": ("qwen3-4b", "qwen2.5-vl-7b", "mistral-small-3.2"),
}
# src/control.hpp ControlNetBlock: an SD 1.x layout, with SD 2.x's and SDXL's context widths and depths
# (its other branch is SVD, a video model); new_sd_ctx builds it with the model's own version, so a
# ControlNet serves UNet models of its own family only. Keyed by the width attn2.to_k takes.
CONTROLNET_FAMILIES: Dict[int, str] = {768: "sd1", 1024: "sd2", 2048: "sdxl"}
# ControlNet families the bundled runtime cannot run, and why: the process aborts on the first step.
CONTROLNET_ABORTS: Dict[str, str] = {
    "sdxl": "stable-diffusion.cpp 0.4.7 aborts on an SDXL ControlNet: its ControlNet graph is sized for SD 1.x "
            "(src/control.hpp CONTROL_NET_GRAPH_SIZE 1536) and SDXL's transformer depths 2 and 10 overflow it on the "
            "first step (GGML_ASSERT n_nodes < size, measured here; fixed upstream after this runtime, "
            "leejet/stable-diffusion.cpp pull 1752)",
}
# src/control.hpp ControlNet hands SpatialTransformer::init_params the *model's* tensor map, where the
# ControlNet file's proj_out is never found: it always builds 1x1 convolution projections, and a file with
# linear ones (SD 2.x and SDXL ControlNets as trained) fails its load and the worker dies (SIGSEGV, measured).
CONTROLNET_LINEAR = ("stable-diffusion.cpp 0.4.7 cannot load a ControlNet with linear transformer projections "
                     "(proj_in/proj_out of 2 dimensions, as SD 2.x ControlNets are trained): its ControlNet always "
                     "builds them as 1x1 convolutions (src/control.hpp looks for the file's proj_out among the "
                     "model's tensor names), the load fails and the runtime crashes (SIGSEGV, measured)")
UNET_FAMILIES = ("sd1", "sd2", "sdxl", "sdxl-refiner")
HINT_BLOCK = "input_hint_block."  # the control image's encoder: what makes a file a ControlNet


@dataclass
class CheckedComponents:
    """What :func:`check_components` found: the model file, its family, the component files by
    request field (checked paths), and the images as RGB pixels."""

    model: ModelFile
    family: str
    paths: Dict[str, str] = field(default_factory=dict)
    init_rgb: bytes = b""
    control_rgb: bytes = b""
    mask_rgb: bytes = b""  # --mask and --ref-image: engine.request.images
    ref_rgb: List[bytes] = field(default_factory=list)

    def names(self) -> Dict[str, str]:
        """Field -> the file's name (never its path: results and PNGs name files only)."""
        return {name: os.path.basename(path) for name, path in self.paths.items()}


def _component_error(name: str, path: str, reason: str, hint: str = "") -> InvalidRequestError:
    return InvalidRequestError(f"{flag_of(name)} {path}: {reason}", hint=hint or None)


def _check_file(name: str, path: str) -> ModelFile:
    """``path`` as a model-format file (never a folder), or an InvalidRequestError naming the flag."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise _component_error(name, path, "the file does not exist", "check the path") from None
    except (OSError, ValueError) as exc:  # ELOOP (a symlink loop), EACCES, a NUL
        raise _component_error(name, path, f"cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise _component_error(name, path, "it is a folder", "name the component's file (.safetensors or .gguf)")
    try:
        return check_model(path)
    except ModelLoadError as exc:
        reason = exc.message.split(": ", 1)[-1] if exc.message.startswith("cannot load model") else exc.message
        raise _component_error(name, path, reason, exc.hint or "") from None


def _inspect(name: str, path: str) -> ModelInspection:
    try:
        return inspect_model(path)
    except ModelLoadError as exc:
        raise _component_error(name, path, exc.message, exc.hint or "") from None


def _kinds(insp: ModelInspection, component: str) -> List[str]:
    return [p.kind for p in insp.parts if p.component == component]


def _family_needs(family: str) -> Optional[Tuple[Tuple[str, ...], Tuple[str, ...]]]:
    """(VAE kinds, text-encoder kinds) the family takes (data/model_families.json), or None."""
    for rule in knowledge().families:
        if rule.id == family:
            return tuple(rule.vaes), tuple(rule.text_encoders)
    return None


def _check_model_file(request: GenerateRequest, model: Optional[str]) -> Tuple[ModelFile, Optional[ModelInspection]]:
    """The model (--model) or the diffusion model (--diffusion-model): exactly one, and what it holds
    (None: its headers do not tell, a legacy pickle)."""
    if model and request.diffusion_model:
        raise InvalidRequestError("both --model and --diffusion-model are given",
                                  hint="give a whole checkpoint with --model, or its diffusion model alone with "
                                  "--diffusion-model (and its VAE and text encoders with --vae, --clip-l...)")
    if not model and not request.diffusion_model:
        raise InvalidRequestError("no model is given", hint="give --model PATH (a checkpoint) or --diffusion-model PATH")
    if model:
        info = check_model(model)  # ModelLoadError / ModelNotFoundError, as before
        try:
            found = inspect_model(model)
        except ModelLoadError:
            return info, None
        _check_whole(model, info, found)
        return info, found
    path = request.diffusion_model
    info = _check_file("diffusion_model", path)
    insp = _inspect("diffusion_model", path)
    parts = [p for p in insp.parts if p.component == "diffusion_model"]
    if not parts or insp.family in ("none", "unknown"):
        raise _component_error("diffusion_model", path, f"it holds no diffusion model of a family stable-diffusion.cpp "
                               f"tells (the file is a {insp.role.replace('_', ' ')})",
                               "name the diffusion model (UNet or transformer) file, or a whole checkpoint with --model")
    if insp.family in UNET_FAMILIES:
        raise _component_error(
            "diffusion_model", path, f"a {insp.family_name} UNet cannot be loaded as a diffusion model alone by "
            "stable-diffusion.cpp 0.4.7: it tells SD 1.x/2.x from the CLIP token embedding under "
            "cond_stage_model. and SDXL from a second text encoder (src/model.cpp get_sd_version), but gives a "
            "separate --clip-l the UNet prefix only when the diffusion model alone was told a UNet "
            "(src/stable-diffusion.cpp new_sd_ctx), so the version is never found (tried: 'get sd version from "
            "file failed')", "give the whole checkpoint with --model (and --vae or --clip-l to replace its parts)")
    return info, insp


def _check_whole(path: str, info: ModelFile, insp: ModelInspection) -> None:
    """--model takes a whole model: stable-diffusion.cpp tells its version from a checkpoint's names
    (src/model.cpp get_sd_version: model.diffusion_model.double_blocks., input_blocks....), so a part alone
    failed in the worker ("get sd version from file failed", blamed on the model): say what it is instead."""
    if insp.role == "checkpoint":
        return
    names = [t.name for t in tensor_index(info) or []]
    dm = [p for p in insp.parts if p.component == "diffusion_model"]
    what, hint = "", ""
    if any(HINT_BLOCK in n for n in names):
        what, hint = "a ControlNet", "give it as --control-net (with --control-image) next to the model it was made for"
    elif names and 2 * sum(1 for n in names if LORA_PARTS.search(n)) >= len(names):
        what, hint = "a LoRA", "put it in a folder given as --lora-dir and apply it from the prompt: <lora:NAME:1>"
    elif insp.role == "vae" and any(n.startswith("decoder.layers.") for n in names):
        what, hint = "a tiny autoencoder (TAESD)", "give it as --taesd next to the model"
    elif insp.role in ("vae", "text_encoder", "components"):
        given = [(p.name, _flag_of_part(p.component, p.kind)) for p in insp.parts if p.component != "other"]
        what = " and ".join(f"a {name}{'' if flag == '--vae' or 'text encoder' in name else ' text encoder'}"
                            for name, flag in given) + (" alone" if len(given) == 1 else ", no diffusion model")
        hint = f"give it as {' and '.join(sorted({flag for _n, flag in given}))} next to the model (--model) or its diffusion model (--diffusion-model)"
    elif dm and all(not p.prefix for p in dm) and insp.family in UNET_FAMILIES:
        what = (f"a {insp.family_name} UNet alone; stable-diffusion.cpp 0.4.7 runs UNet models only from a whole "
                "checkpoint (src/model.cpp get_sd_version reads the version from its text encoder)")
        files = _rule_files(insp.family)
        hint = f"give the whole checkpoint{' (such as ' + files[0] + ')' if files else ''}"
    elif dm and all(not p.prefix for p in dm) and insp.family not in ("none", "unknown"):
        what = f"a {insp.family_name} diffusion model alone (its names lack the checkpoint's model.diffusion_model.)"
        hint = f"give it as --diffusion-model {path} with {_first_choices(_missing(insp.family, [], set()))}"
    if what:
        raise _component_error("model", path, f"it is {what}, not a whole model: stable-diffusion.cpp cannot load it "
                               "as one", hint.strip())


def _flag_of_part(component: str, kind: str) -> str:
    if component == "vae":
        return "--vae"
    return next((flag_of(name) for name, kinds in TEXT_ENCODER_KINDS.items() if kind in kinds), "--clip-l")


def _rule_files(family: str) -> Tuple[str, ...]:
    return next((rule.files for rule in knowledge().families if rule.id == family), ())


def _missing(family: str, parts: Sequence[ModelPart], given: Set[str]) -> List[Tuple[str, str]]:
    """What ``family`` cannot run without and neither the model's file (``parts``) nor the request's
    files (``given`` fields) hold: (the flags with the usual file names, why), from stable-diffusion.cpp."""
    k, needs = knowledge(), _family_needs(family)
    out: List[Tuple[str, str]] = []
    if needs and needs[0] and not any(p.component == "vae" for p in parts) and not {"vae", "taesd"} & given:
        files = next((v.files for v in k.vaes if v.id == needs[0][0]), ())
        out.append((f"--vae {files[0] if files else 'VAE.safetensors'} or --taesd", "a VAE or a tiny autoencoder to "
                    "decode with: without either the load fails on the decoder's tensors, src/stable-diffusion.cpp new_sd_ctx"))
    wanted = NEEDED_ENCODERS.get(family, ())
    have = {p.kind for p in parts if p.component == "text_encoder"} | {x for n in given for x in TEXT_ENCODER_KINDS.get(n, ())}
    if wanted and not set(wanted) & have:
        flags = [f"{_flag_of_part('text_encoder', kind)} {next((e.files[0] for e in k.encoders if e.id == kind and e.files), kind)}"
                 for kind in wanted]
        why = ("its LLM, which src/conditioner.hpp LLMEmbedder always builds: without it the load fails" if len(wanted) == 1
               else "a text encoder: src/conditioner.hpp runs with any one of these, zeros for the others and a warning, "
               "but with none it has no prompt condition and the worker crashes, SIGSEGV")
        out.append((" or ".join(flags), why))
    return out


def _check_complete(name: str, path: str, insp: Optional[ModelInspection], given: Set[str]) -> None:
    """The parts the model's family cannot run without (:func:`_missing`), before any worker starts."""
    missing = _missing(insp.family, insp.parts, given) if insp is not None else []
    if missing and insp is not None:
        role = "diffusion model" if insp.role == "diffusion_model" else "model"
        raise _component_error(name, path, f"this {insp.family_name} {role} lacks parts stable-diffusion.cpp cannot run "
                               "it without, and the request does not give them: "
                               + "; ".join(f"{flags} ({why})" for flags, why in missing), f"add {_first_choices(missing)}")


def _first_choices(missing: List[Tuple[str, str]]) -> str:
    return " ".join(flags.split(" or ")[0] for flags, _why in missing)


def _check_component(name: str, path: str, family: str) -> None:
    """A component file that exists, reads, and is of a kind the model's family takes."""
    info = _check_file(name, path)
    if name == "taesd":
        _check_taesd(path, tensor_index(info), family)
        return
    insp = _inspect(name, path)
    needs = _family_needs(family)
    if name == "vae":
        kinds = _kinds(insp, "vae")
        if not kinds:
            raise _component_error(name, path, f"it holds no VAE (the file is a {insp.role.replace('_', ' ')})",
                                   "name a VAE file (such as vae-ft-mse-840000-ema-pruned.safetensors or ae.safetensors)")
        if needs and needs[0] and not set(kinds) & set(needs[0]):
            raise _component_error(name, path, f"its VAE ({', '.join(sorted(set(kinds)))}) is not the one the "
                                   f"model's family, {family}, decodes with ({', '.join(needs[0])})",
                                   "use a VAE made for the model's family")
        return
    wanted = TEXT_ENCODER_KINDS[name]
    if needs is not None and not set(wanted) & set(needs[1]):
        raise _component_error(name, path, f"the model's family, {family}, has no {flag_of(name)[2:]} text encoder (it takes "
                               f"{', '.join(needs[1]) or 'none given separately'}; data/model_families.json, "
                               "from src/conditioner.hpp)", f"leave out {flag_of(name)}")
    kinds = _kinds(insp, "text_encoder")
    if not kinds:
        raise _component_error(name, path, f"it holds no text encoder (the file is a {insp.role.replace('_', ' ')})",
                               f"name a {'/'.join(wanted)} text encoder file")
    if not set(kinds) & set(wanted):
        raise _component_error(name, path, f"it is a {', '.join(sorted(set(kinds)))} text encoder, not "
                               f"{' or '.join(wanted)}", "give each text encoder with its own flag")
    if needs and needs[1] and not set(kinds) & set(needs[1]):  # a flag's kinds serve several families (--llm)
        raise _component_error(name, path, f"it is a {', '.join(sorted(set(kinds)))} text encoder; the model's family, "
                               f"{family}, takes {', '.join(k for k in needs[1] if k in wanted)} there "
                               "(data/model_families.json, from src/conditioner.hpp)",
                               "use the text encoder made for the model's family")


def _check_taesd(path: str, tensors: Optional[List[TensorInfo]], family: str) -> None:
    """A tiny autoencoder whose decoder takes the family's latents: src/tae.hpp ``TinyDecoder`` (under
    ``decoder.layers.``) starts with a conv of 4 channels in, 16 for the DiTs; a mismatch fails the load."""
    first = next((t for t in tensors or [] if t.name.endswith("decoder.layers.0.weight") and len(t.shape) == 4), None)
    if first is None:
        video = any(t.name.startswith("decoder.") for t in tensors or [])  # Wan's video TAE: another layout
        if video and _latents(family) is None:
            return
        raise _component_error("taesd", path, "it is not a tiny autoencoder (TAESD): it has no decoder.layers.0 "
                               "(the first layer of src/tae.hpp TinyDecoder, in diffusers' AutoencoderTiny names)",
                               "name a taesd file such as taesd/diffusion_pytorch_model.safetensors (taef1 for Flux)")
    want, have = _latents(family), int(first.shape[1])
    if want is not None and have != want:
        raise _component_error("taesd", path, f"it decodes {have}-channel latents; this {family} model makes "
                               f"{want}-channel ones (src/tae.hpp TAESD: 4 for SD 1.x/2.x/XL, 16 for the DiTs)",
                               "use the tiny autoencoder made for the model's family (taesd, taesdxl, taesd3, taef1)")


def _latents(family: str) -> Optional[int]:
    """The latent channels of the family's image VAE (None: unknown, or a video VAE such as Wan's)."""
    needs = _family_needs(family)
    kinds = {v.id: v for v in knowledge().vaes}
    found = {kinds[k].latent_channels for k in (needs[0] if needs else ()) if k in kinds and kinds[k].dims == 4}
    return found.pop() if len(found) == 1 else None


def _check_controlnet(path: str, family: str) -> None:
    """An SD-family ControlNet whose cross-attention width is the model's (src/control.hpp)."""
    info = _check_file("control_net", path)
    tensors = tensor_index(info)
    if tensors is None:
        raise _component_error("control_net", path, "a legacy torch pickle whose tensors are not read without "
                               "unpickling it", "convert the ControlNet to safetensors")
    if not any(HINT_BLOCK in t.name for t in tensors):
        raise _component_error("control_net", path, "it is not a ControlNet (it has no input_hint_block., the "
                               "control image's encoder of src/control.hpp)",
                               "name a ControlNet in the original layout (control_v11p_sd15_canny.pth converted "
                               "to safetensors, or such)")
    if family not in CONTROLNET_FAMILIES.values():
        raise InvalidRequestError(
            f"the model's family, {family}, takes no ControlNet: stable-diffusion.cpp 0.4.7 runs ControlNets only with "
            "SD 1.x, SD 2.x and SDXL UNets (src/control.hpp ControlNetBlock)",
            hint="leave out --control-net and --control-image")
    widths = {int(t.shape[1]) for t in tensors if t.name.endswith("attn2.to_k.weight") and len(t.shape) == 2}
    own = sorted({CONTROLNET_FAMILIES.get(w, f"context width {w}") for w in widths})
    if own and family not in own:
        raise _component_error("control_net", path, f"it is a ControlNet for {', '.join(own)}, not for this "
                               f"{family} model (its cross-attention takes {', '.join(map(str, sorted(widths)))}-wide "
                               "text vectors)", f"use a ControlNet made for {family}")
    if family in CONTROLNET_ABORTS:
        raise InvalidRequestError(CONTROLNET_ABORTS[family],
                                  hint="leave out --control-net and --control-image, or use an SD 1.x or SD 2.x model "
                                       "with a ControlNet made for it")
    linear = sorted(t.name for t in tensors if t.name.endswith(("proj_in.weight", "proj_out.weight")) and len(t.shape) == 2)
    if linear:
        raise _component_error("control_net", path, f"{CONTROLNET_LINEAR}; it has {len(linear)} ({linear[0]}, ...)",
                               "use a ControlNet whose proj_in/proj_out weights are 1x1 convolutions ([c, c, 1, 1]: "
                               "the same values), or leave out --control-net")
    faults = controlnet_faults({t.name: t.shape for t in tensors}, next(w for w, f in CONTROLNET_FAMILIES.items() if f == family))
    if faults:
        raise _component_error("control_net", path, f"it is not a whole {family} ControlNet: {faults}",
                               "the file may be damaged or cut; use a ControlNet in the original layout made for the model")


def _read_image(name: str, path: str, request: GenerateRequest) -> bytes:  # (engine.request.images too)
    try:
        img = read_input_png(path)
    except FileNotFoundError:
        raise _component_error(name, path, "the file does not exist", "check the path") from None
    except (OSError, ValueError) as exc:  # PngError is a ValueError; OSError: ELOOP, EACCES, EISDIR
        reason = str(exc) if isinstance(exc, PngError) else (getattr(exc, "strerror", None) or str(exc))
        raise _component_error(name, path, reason, "give a PNG image (any PNG variant: gray, palette, RGB or "
                               "RGBA, 8 or 16 bits, interlaced or not)") from None
    if (img.width, img.height) != (request.width, request.height):
        raise _component_error(name, path, f"it is {img.width}x{img.height}, the request {request.width}x"
                               f"{request.height}; images are not resized",
                               f"generate at --width {img.width} --height {img.height}, or resize the image")
    return img.pixels


def _absolute(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path)) if isinstance(path, str) and path else path


def check_components(request: GenerateRequest, model: Optional[str], *, components_supported: bool = True,
                     library: str = "stable-diffusion.cpp") -> CheckedComponents:
    """Check the model, every component file and image of ``request``; InvalidRequestError (or the
    model's ModelLoadError) with the flag and file named, before any process starts."""
    given = [name for name in COMPONENT_FLAGS if getattr(request, name)]
    images = [name for name in ("init_image", "control_image") if getattr(request, name)]
    if (given or images or request.init_pixels or request.control_pixels) and not components_supported:
        flags = ", ".join(flag_of(n) for n in given + images) or "--init-image"
        raise InvalidRequestError(f"{flags}: not supported on the {library} stack",
                                  hint="generate with a stable-diffusion.cpp runtime, or leave them out")
    # The worker runs in a folder of its own (engine.supervision.process): a relative path would name another file there, or
    # none (stable-diffusion.cpp then leaves out a VAE with a warning): every file goes on as an absolute path.
    absolute: Dict[str, Any] = {name: _absolute(getattr(request, name)) for name in given}
    request = dataclasses.replace(request, **absolute)
    for name, path in (("model", model or ""), *absolute.items()):  # the bindings load os.path.normpath(path.strip())
        if path != path.strip():
            raise _component_error(name, path, "its name begins or ends with white space, which the bindings strip: "
                                   "another file, or none, would be loaded", "rename the file")
    info, insp = _check_model_file(request, model)
    family = insp.family if insp is not None else "unknown"
    out = CheckedComponents(model=info, family=family)
    if request.diffusion_model:
        out.paths["diffusion_model"] = info.path
    for name in given:
        if name in ("diffusion_model", "control_net"):
            continue
        _check_component(name, getattr(request, name), family)
        out.paths[name] = getattr(request, name)
    if request.control_net:
        _check_controlnet(request.control_net, family)
        out.paths["control_net"] = request.control_net
    main = "diffusion_model" if request.diffusion_model else "model"  # each file given is checked first, then the whole
    _check_complete(main, info.path if request.diffusion_model else str(model), insp, set(given))
    if request.init_image:
        out.init_rgb = _read_image("init_image", request.init_image, request)
    elif request.init_pixels:  # a caller that wrote the pixels itself
        out.init_rgb = read_pixels(request.init_pixels, request)
    if request.control_image:
        out.control_rgb = _read_image("control_image", request.control_image, request)
    elif request.control_pixels:
        out.control_rgb = read_pixels(request.control_pixels, request)
    return out
