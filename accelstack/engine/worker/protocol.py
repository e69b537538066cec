"""What the supervisor and the worker say to each other: typed requests, status and results.

This module is imported by the worker, which runs inside the runtime's interpreter, so it uses
only the standard library (and :mod:`accelstack.serde`). Requests are validated here, in the
parent, so bad input fails before any process starts.
"""
from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ...limits import (
    MAX_CFG_SCALE,
    MAX_CLIP_SKIP,
    MAX_PROMPT_CHARS,
    MAX_PROMPT_CHUNKS,
    MAX_PROMPT_TOKENS,
    MAX_SEED,
    MIN_CLIP_SKIP,
    MIN_SEED,
    PROMPT_CHUNK_TOKENS,
)
from ...verdict import DeviceInfo
from ..errors import InvalidRequestError
from ..loras.tags import check_lora_tag_syntax
from .values import DEFAULT_CFG_SCALE, DEFAULT_STEPS, IMAGE_FLAGS, check_edit_images, check_guidance, read_pixels

__all__ = ["LIB_DIRS_ENV", "PRELOAD_ENV", "GenerateRequest", "GenerateResult", "GeneratedImage", "WorkerStatus", "DeviceInfo", "check_prompt", "prompt_tokens",
           "lora_tags", "check_companion_name", "MAX_LORA_WEIGHT", "MAX_LORAS", "SAMPLERS", "COMPONENT_FLAGS",
           "IMAGE_FIELDS", "PATH_FIELDS", "flag_of", "DEFAULT_STRENGTH", "DEFAULT_CONTROL_STRENGTH",
           "MAX_CONTROL_STRENGTH", "read_pixels",
           "SCHEDULERS", "PHASES", "MIN_SIDE", "MAX_SIDE", "SIDE_MULTIPLE", "MAX_STEPS", "MAX_BATCH", "TOKEN_FILE",
           "MAX_TOKEN_BYTES", "EXIT_OK", "EXIT_LOAD_FAILED", "EXIT_ORPHANED", "EXIT_CANCELLED"]

# Names stable-diffusion.cpp 0.4.x accepts ("default" lets it choose for the model).
SAMPLERS = ("default", "euler", "euler_a", "heun", "dpm2", "dpm++2s_a", "dpm++2m", "dpm++2mv2", "ipndm",
            "ipndm_v", "lcm", "ddim_trailing", "tcd", "res_multistep", "res_2s", "er_sde")
SCHEDULERS = ("default", "discrete", "karras", "exponential", "ays", "gits", "sgm_uniform", "simple",
              "smoothstep", "kl_optimal", "lcm", "bong_tangent")
MIN_SIDE, MAX_SIDE, SIDE_MULTIPLE = 64, 4096, 8
MAX_STEPS, MAX_BATCH = 1000, 64

# stable-diffusion.cpp reads "(text:1.2)" weights with C's std::stof, which throws (and the uncaught
# exception aborts the worker) for a weight it cannot convert ("(cat:.)") or one out of float range.
_WEIGHT = re.compile(r":([+-]?[.\d]+)\)")
_C_FLOAT_PREFIX = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)")
_FLT_MAX, _FLT_MIN = 3.4028234e38, 1.1754944e-38
# The bindings load "<lora:path:weight>" tags of a prompt as LoRA files from any path (an absolute
# one too, and "name" + .pt/.safetensors/.gguf: stable_diffusion.py ``_extract_and_build_loras``).
# So a tag is taken only when its name is a plain file name, resolved by the parent inside the
# request's lora_dir (:mod:`accelstack.engine.request.companions`); any other tag is refused.
_LORA_TAG = re.compile(r"<lora:([^:>]+):([^>]+)>", re.IGNORECASE)
_LORA_START = re.compile(r"<lora:", re.IGNORECASE)  # a tag, or the start of one the bindings would not read
# A plain name: word characters, dots, dashes and inner spaces; no separator, no leading dot, no "..".
_PLAIN_NAME = re.compile(r"\w[\w.\- ]{0,199}")
_LORA_WEIGHT = re.compile(r"[+-]?(?:\d{1,6}(?:\.\d{0,8})?|\.\d{1,8})")
MAX_LORA_WEIGHT = 10.0  # |weight|: LoRAs are trained for about 1; 10 is far past any useful strength
MAX_LORAS = 16  # distinct LoRAs in one prompt

# img2img and ControlNet defaults: the bindings' own (stable_diffusion.py generate_image: strength
# 0.75, control_strength 0.9). Strength is a fraction of the schedule ([0, 1], checked there too);
# the ControlNet's strength scales its residuals (src/unet.hpp), 2 is already far past useful.
DEFAULT_STRENGTH = 0.75
DEFAULT_CONTROL_STRENGTH = 0.9
MAX_CONTROL_STRENGTH = 2.0
# Components a request may name as files of their own, by field, with the command-line flag and the
# StableDiffusion(...) argument of the bindings (stable_diffusion.py __init__) each is passed as.
COMPONENT_FLAGS: Dict[str, Tuple[str, str]] = {
    "diffusion_model": ("--diffusion-model", "diffusion_model_path"),
    "vae": ("--vae", "vae_path"),
    "clip_l": ("--clip-l", "clip_l_path"),
    "clip_g": ("--clip-g", "clip_g_path"),
    "t5xxl": ("--t5xxl", "t5xxl_path"),
    "llm": ("--llm", "llm_path"),
    "taesd": ("--taesd", "taesd_path"),
    "control_net": ("--control-net", "control_net_path"),
}
IMAGE_FIELDS = ("init_image", "control_image", "mask_image")  # PNG paths the parent reads (and ref_images, a list)
PATH_FIELDS = tuple(COMPONENT_FLAGS) + IMAGE_FIELDS  # every field that names a file of the caller's


def flag_of(name: str) -> str:
    """The command-line flag of a request field ("--clip-g" for clip_g)."""
    if name in COMPONENT_FLAGS or name in IMAGE_FLAGS:
        return {**IMAGE_FLAGS, **{k: v[0] for k, v in COMPONENT_FLAGS.items()}}[name]
    return "--" + name.replace("_", "-")


def check_companion_name(name: str, what: str = "LoRA") -> str:
    """``name`` if it is a plain file name (no separator, no leading dot, no ".."), else
    :class:`InvalidRequestError`: such names are resolved only inside the folder given."""
    if not _PLAIN_NAME.fullmatch(name) or ".." in name or name.endswith((" ", ".")):
        raise InvalidRequestError(
            f"the {what} name {_shown(name)} is not a plain file name",
            hint=f"name a file of the {what} folder by its name alone (letters, digits, _ - . and inner spaces; "
            "no path separators, no leading dot, no '..')")
    return name


def lora_tags(text: str) -> List[Tuple[str, float]]:
    """The ``<lora:NAME:WEIGHT>`` tags of ``text`` as (name, weight), weights of a name repeated summed
    (as the bindings do); :class:`InvalidRequestError` for a tag that is not lower case, a name that is
    not plain, or a weight that is not a number within +-:data:`MAX_LORA_WEIGHT`."""
    check_lora_tag_syntax(text)  # <lora:NAME> (no weight): the bindings would leave it in the prompt as text
    found: Dict[str, float] = {}
    for match in _LORA_TAG.finditer(text):
        name, raw = match.group(1), match.group(2)
        if not match.group(0).startswith("<lora:"):
            raise InvalidRequestError(f"the tag {_shown(match.group(0))} must be written <lora:NAME:WEIGHT> in lower case",
                                      hint="stable-diffusion.cpp reads only the lower-case tag")
        check_companion_name(name)
        weight = float(raw) if _LORA_WEIGHT.fullmatch(raw) else None
        if weight is None or abs(weight) > MAX_LORA_WEIGHT:
            raise InvalidRequestError(f"the LoRA weight {_shown(raw)} of {_shown(name)} is not a number from "
                                      f"{-MAX_LORA_WEIGHT:g} to {MAX_LORA_WEIGHT:g}",
                                      hint=f"write the tag as <lora:{name}:0.8>")
        found[name] = found.get(name, 0.0) + weight
        if abs(found[name]) > MAX_LORA_WEIGHT:  # repeated tags add up (the bindings sum them)
            raise InvalidRequestError(f"the LoRA {_shown(name)} is named more than once, with weights that add up to "
                                      f"{found[name]:g}, past {MAX_LORA_WEIGHT:g}", hint="name each LoRA once")
        if len(found) > MAX_LORAS:
            raise InvalidRequestError(f"the prompt names more than {MAX_LORAS} LoRAs", hint="apply fewer LoRAs")
    return list(found.items())


def prompt_tokens(text: str) -> int:
    """Tokens ``text`` counts toward :data:`~accelstack.limits.MAX_PROMPT_TOKENS`: its ASCII characters
    at 4 a token, and one token per UTF-8 byte of every other character (the CLIP tokenizer is
    byte-level: a CJK character is up to 3 tokens, an emoji up to 4)."""
    ascii_chars = sum(1 for c in text if c < "\x80")
    return -(-ascii_chars // 4) + len(text.encode("utf-8", "surrogatepass")) - ascii_chars


def check_prompt(text: Any, name: str = "prompt") -> str:
    """``text`` if stable-diffusion.cpp can take it, else :class:`InvalidRequestError` saying why."""
    if not isinstance(text, str):
        raise InvalidRequestError(f"{name} must be text, got {type(text).__name__}")
    if len(text) > MAX_PROMPT_CHARS:
        raise InvalidRequestError(
            f"{name} is {len(text)} characters long; at most {MAX_PROMPT_CHARS} are accepted",
            hint=f"the text encoder reads {PROMPT_CHUNK_TOKENS}-token chunks and this engine takes up to "
            f"{MAX_PROMPT_CHUNKS} of them (about {MAX_PROMPT_CHARS} characters); shorten the {name}")
    tokens = prompt_tokens(text)
    if tokens > MAX_PROMPT_TOKENS:
        other = sum(1 for c in text if c >= "\x80")
        raise InvalidRequestError(
            f"{name} counts {tokens} tokens; at most {MAX_PROMPT_TOKENS} are accepted (counted as the text "
            f"encoder's tokenizer splits text: 4 ASCII characters a token, and one token per UTF-8 byte of the "
            f"{other} other character{'s' if other != 1 else ''}, 3 for a CJK character, 4 for an emoji)",
            hint=f"the text encoder reads {PROMPT_CHUNK_TOKENS}-token chunks and this engine takes about "
            f"{MAX_PROMPT_CHUNKS} of them; shorten the {name}")
    if "\x00" in text:
        raise InvalidRequestError(f"{name} contains a NUL character", hint=f"remove it from the {name}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequestError(f"{name} is not valid Unicode text (it holds a lone surrogate)",
                              hint=f"retype the {name}") from None
    if name == "prompt":
        lora_tags(text)  # a tag's name and weight (that a folder is given: GenerateRequest.validate)
    elif _LORA_START.search(text):
        raise InvalidRequestError(f"{name} holds a <lora:...> tag; LoRAs apply from the prompt only",
                              hint=f"remove the <lora:...> tag from the {name}")
    for match in _WEIGHT.finditer(text):
        number = _C_FLOAT_PREFIX.match(match.group(1))
        value = float(number.group(0)) if number else None
        if value is None or (value != 0 and not _FLT_MIN <= abs(value) <= _FLT_MAX):
            raise InvalidRequestError(f"{name} has an attention weight '{match.group(0)[:40]}' that is not a number "
                                  "in the range of a 32-bit float",
                                  hint="write weights as (word:1.2); escape a literal parenthesis as \\(")
    return text

# The per-launch token reaches the worker in a file the supervisor names (never on its command line).
# Set by Runtime.worker_env from the runtime's library note (accelstack.engine.runtime), for a child
# that starts the runtime without the worker's options (the core's import check): the directories of
# the shared CUDA libraries, and the files to load from them first, in order. The worker itself gets
# them as options (``--lib-dir``, ``--preload``). Here, not in .backend, so the parent that starts a
# worker imports no ctypes for them (issue 46: every import before the worker's start is paid per image).
LIB_DIRS_ENV = "ACCELSTACK_LIB_DIRS"
PRELOAD_ENV = "ACCELSTACK_PRELOAD_LIBS"
TOKEN_FILE = "token-{number}"  # in the supervisor's private folder, removed by the worker once read
MAX_TOKEN_BYTES = 256
LISTEN_BACKLOG = 128  # the worker's listening queue: a burst of connections waits there, not refused

# Worker phases, in the order a healthy worker goes through them.
PHASES = ("starting", "loading", "ready", "generating", "error", "stopping")

# Exit codes the worker uses on purpose (anything else is a crash).
EXIT_OK = 0
EXIT_LOAD_FAILED = 3
EXIT_ORPHANED = 4
EXIT_CANCELLED = 75


@dataclass
class GenerateRequest:
    """One generation job (text-to-image, or img2img with an init image). ``seed`` < 0 picks a
    random seed (reported back)."""

    prompt: str
    negative_prompt: str = ""
    width: int = 512
    height: int = 512
    steps: int = DEFAULT_STEPS  # not given: the family's reference steps (engine.models.settings), else 20
    cfg_scale: float = DEFAULT_CFG_SCALE  # not given: the family's (Flux 1), else 7
    sampler: str = "default"
    scheduler: str = "default"
    seed: int = 42
    batch_count: int = 1
    clip_skip: int = -1
    guidance: Optional[float] = None  # distilled guidance (Flux); None: the family's, else the runtime's 3.5
    flow_shift: Optional[float] = None  # flow models' timestep shift; None: the family's, else the runtime's own
    lora_dir: str = ""  # the folder <lora:NAME:WEIGHT> names are resolved in (the parent stages them)
    embeddings_dir: str = ""  # a folder of textual-inversion embeddings, each triggered by its file name
    # Components given as files of their own (parent side: checked, then sent to the worker as load
    # options, never in the request it gets). See COMPONENT_FLAGS.
    diffusion_model: str = ""
    vae: str = ""
    clip_l: str = ""
    clip_g: str = ""
    t5xxl: str = ""
    llm: str = ""
    taesd: str = ""
    control_net: str = ""
    # img2img and ControlNet: PNG paths the parent reads (bounded), sent as pixels (``*_pixels``).
    init_image: str = ""
    strength: float = DEFAULT_STRENGTH
    control_image: str = ""
    control_strength: float = DEFAULT_CONTROL_STRENGTH
    # The wire form of the images: a file of width x height x 3 RGB bytes the parent wrote in the run's
    # private folder (a worker reads at most WORKER_MAX_BODY_BYTES of a request, 256 KiB; a 512x512
    # image is 1 MiB in base64).
    init_pixels: str = ""
    control_pixels: str = ""
    # Inpainting and edits: a mask (white: redrawn) of the init image's size; reference images for the edit
    # families (FLUX.1 Kontext, Qwen-Image-Edit, FLUX.2), each of the request's size (engine.request.images).
    mask_image: str = ""
    ref_images: List[str] = field(default_factory=list)
    mask_pixels: str = ""
    ref_pixels: List[str] = field(default_factory=list)

    def validate(self) -> GenerateRequest:
        """Raise :class:`InvalidRequestError` naming the bad field and what is allowed."""
        check_prompt(self.prompt, "prompt")
        check_prompt(self.negative_prompt, "negative prompt")
        for name in ("lora_dir", "embeddings_dir"):
            value = getattr(self, name)
            if not isinstance(value, str) or "\x00" in value or len(value) > 4096:
                raise InvalidRequestError(f"{name.replace('_', ' ')} must be a folder path, got {_shown(value)}")
        if lora_tags(self.prompt) and not self.lora_dir:
            raise InvalidRequestError("the prompt holds a <lora:NAME:WEIGHT> tag but no LoRA folder is given",
                                      hint="name the folder holding the LoRA files (--lora-dir), or remove the tag")
        for name in PATH_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, str) or "\x00" in value or len(value) > 4096:
                raise InvalidRequestError(f"{flag_of(name)} must be a file path, got {_shown(value)}")
        for name in ("width", "height"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v % SIDE_MULTIPLE or not MIN_SIDE <= v <= MAX_SIDE:
                raise InvalidRequestError(
                    f"{name} {_shown(v)} is not allowed: it must be a multiple of {SIDE_MULTIPLE} between {MIN_SIDE} and {MAX_SIDE}",
                    hint=f"try {name} {_round8(max(MIN_SIDE, min(MAX_SIDE, v)))}" if isinstance(v, int) else None)
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or not 1 <= self.steps <= MAX_STEPS:
            raise InvalidRequestError(f"steps must be an integer between 1 and {MAX_STEPS}, got {_shown(self.steps)}")
        if isinstance(self.batch_count, bool) or not isinstance(self.batch_count, int) or not 1 <= self.batch_count <= MAX_BATCH:
            raise InvalidRequestError(f"batch count must be an integer between 1 and {MAX_BATCH}, "
                                  f"got {_shown(self.batch_count)}")
        if (isinstance(self.cfg_scale, bool) or not isinstance(self.cfg_scale, (int, float))
                or not 0.0 <= self.cfg_scale <= MAX_CFG_SCALE):
            raise InvalidRequestError(f"cfg scale must be a number between 0 and {MAX_CFG_SCALE:g}, got {_shown(self.cfg_scale)}")
        if not isinstance(self.sampler, str) or self.sampler not in SAMPLERS:
            raise InvalidRequestError(f"unknown sampler {_shown(self.sampler)}", hint=f"choose one of: {', '.join(SAMPLERS)}")
        if not isinstance(self.scheduler, str) or self.scheduler not in SCHEDULERS:
            raise InvalidRequestError(f"unknown scheduler {_shown(self.scheduler)}",
                                  hint=f"choose one of: {', '.join(SCHEDULERS)}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not MIN_SEED <= self.seed <= MAX_SEED - MAX_BATCH:
            raise InvalidRequestError(f"seed must be an integer from {MIN_SEED} to {MAX_SEED - MAX_BATCH} (negative: random), "
                                  f"got {_shown(self.seed)}")
        if (isinstance(self.clip_skip, bool) or not isinstance(self.clip_skip, int)
                or not MIN_CLIP_SKIP <= self.clip_skip <= MAX_CLIP_SKIP):
            raise InvalidRequestError(f"clip skip must be an integer from {MIN_CLIP_SKIP} to {MAX_CLIP_SKIP} "
                                  f"(-1 or 0: the model's default), got {_shown(self.clip_skip)}")
        check_guidance(self)
        check_edit_images(self)
        self._validate_images()
        return self

    def _validate_images(self) -> None:
        """img2img and ControlNet fields: strengths in range, pixel files named by a plain path, and a
        ControlNet only with its control image (and the other way round)."""
        for name, top in (("strength", 1.0), ("control_strength", MAX_CONTROL_STRENGTH)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= top:
                raise InvalidRequestError(f"{flag_of(name)} must be a number from 0 to {top:g}, got {_shown(v)}")
        for name in ("init_pixels", "control_pixels"):
            v = getattr(self, name)
            if not isinstance(v, str) or "\x00" in v or len(v) > 4096:
                raise InvalidRequestError(f"{name.replace('_', ' ')} must be the path of a file of {self.width}x"
                                          f"{self.height} RGB pixels, got {_shown(v)}")
        has_control_image = bool(self.control_image or self.control_pixels)
        if self.control_net and not has_control_image:
            raise InvalidRequestError("a ControlNet is given (--control-net) without the image that guides it",
                                      hint="add --control-image PNG (an edge map, a pose, a depth map...)")
        if has_control_image and not self.control_net:
            raise InvalidRequestError("a control image is given (--control-image) without a ControlNet",
                                      hint="add --control-net PATH (a ControlNet made for the model's family), "
                                      "or leave out the control image")
        if self.init_image and self.init_pixels:
            raise InvalidRequestError("give the init image as a path or as pixels, not both")


def _shown(value: Any, limit: int = 40) -> str:
    """A short quote of a bad value (a hostile one may be huge)."""
    if isinstance(value, (str, bytes)):
        value = value[:limit]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10 ** 30:
        return "an integer of more than 30 digits"
    text = repr(value) if isinstance(value, (str, bytes, int, float, bool, type(None))) else f"a {type(value).__name__}"
    return text[:limit]


def _round8(v: int) -> int:
    return int(round(v / SIDE_MULTIPLE)) * SIDE_MULTIPLE


@dataclass
class WorkerStatus:
    """The worker's answer to ``status``. ``ticks`` counts every progress callback (any activity);
    ``step``/``steps`` are the sampling progress of the image being made, after ``images_done``
    images of the job; ``heartbeat`` is the worker's clock at the last beat of its heartbeat
    thread (``now`` is its clock at the answer)."""

    phase: str
    pid: int
    version: int = 0
    job: str = ""
    step: int = 0
    steps: int = 0
    images_done: int = 0
    ticks: int = 0
    heartbeat: float = 0.0
    now: float = 0.0
    load_seconds: Optional[float] = None
    device: Optional[DeviceInfo] = None
    rss_bytes: Optional[int] = None
    error: str = ""
    error_kind: str = ""
    runtime_version: str = ""
    system_info: str = ""


@dataclass
class GeneratedImage:
    """Raw 8-bit RGB pixels, row-major (``pixels`` is base64 on the wire)."""

    width: int
    height: int
    seed: int
    pixels_b64: str = ""

    @property
    def pixels(self) -> bytes:
        return base64.b64decode(self.pixels_b64)


@dataclass
class GenerateResult:
    """What one job produced, with the worker's timings (seconds)."""

    job: str
    images: List[GeneratedImage] = field(default_factory=list)
    seconds: float = 0.0  # the whole generate call in the worker
    sampling_seconds: float = 0.0  # first to last sampling step
    steps: int = 0
    seed: int = 0
    sampler: str = ""
    scheduler: str = ""
    device: Optional[DeviceInfo] = None
    load_seconds: Optional[float] = None
    library_seconds: Optional[float] = None  # stable-diffusion.cpp's own generate_image time
    restarts: int = 0  # set by the supervisor: worker restarts during this job
    extra: Dict[str, str] = field(default_factory=dict)

    @property
    def step_seconds(self) -> float:
        return self.sampling_seconds / self.steps if self.steps else 0.0

    @property
    def its_per_second(self) -> float:
        return self.steps / self.sampling_seconds if self.sampling_seconds > 0 else 0.0
