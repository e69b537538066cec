"""Engine options: from ``config.yaml`` (the path the caller names: one given by hand, or its ``Settings.config_file``) and overrides.

The file has one section that this module owns::

    engine:
      flash_attention: true    # flash attention in the diffusion model (less memory)
      offload_to_cpu: auto     # keep weights in RAM, move them to VRAM when needed: auto, true or false
      vae_tiling: auto         # decode the image in tiles (less memory, slower): auto, true or false
      vae_tile_size: auto      # tile edge in latent pixels (x8 in image pixels): auto or 4..512
      threads: auto            # CPU threads: auto (physical cores) or 1..512 (ggml's thread limit)
      weight_type: auto        # convert weights on load: auto, default (as stored), f16, q8_0, q4_k, ...
      memory_check: true       # refuse a generation whose memory estimate exceeds the free RAM/VRAM
      keep_clip_on_cpu: auto   # run the text encoders on the CPU (their weights in RAM): auto, true or false
      keep_vae_on_cpu: auto    # decode on the CPU (the VAE's weights and decode in RAM): auto, true or false
      max_vram: auto           # GiB a graph may hold in VRAM with offloaded weights (cut into segments); 0: off
      enable_mmap: false       # read the model files through mmap (stable-diffusion.cpp's --mmap)
      lora_apply_mode: auto    # LoRAs: auto (stable-diffusion.cpp's choice), immediately (merged once), at_runtime

``auto`` (the default of ``offload_to_cpu``, ``vae_tiling``, ``vae_tile_size`` and ``weight_type``) lets the memory
planner (:mod:`accelstack.engine.memory.plan`) choose, per generation, the cheapest setting that
fits the model, the image size and this machine's free memory: weights on the GPU when they fit,
VAE tiling only when the decode would not fit (with the tile size it picks), weight conversion
only as a last resort. A value given (``true``/``false``/a type, here or as a flag) always wins.
The worker never sees ``auto``: :meth:`EngineOptions.concrete` (or the planner) resolves it first.

Invalid keys and values raise :class:`ConfigError` naming the key and the allowed values. The file
is read through :func:`accelstack.limits.parse_yaml` (size cap, no aliases, depth check), only if
it is a regular file, and values are quoted shortened in messages, so a hostile file gives a short
typed error, never a hang, a traceback or a giant message.
"""
from __future__ import annotations

import dataclasses
import math
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Union

from ..errors import AccelstackError, Action
from ..limits import MAX_CONFIG_BYTES, MAX_THREADS, MAX_VAE_TILE, MalformedInput, parse_yaml
from .errors import ConfigError, InvalidRequestError

__all__ = ["EngineOptions", "load_config", "apply_overrides", "options_from_mapping", "shown", "SECTION",
           "KNOWN_SECTIONS", "WEIGHT_TYPES", "LORA_APPLY_MODES", "MIN_TILE", "RUN_ONLY", "config_keys", "AUTO", "AUTO_KEYS", "LEGACY"]

SECTION = "engine"
KNOWN_SECTIONS = (SECTION,)

# The weight types stable-diffusion.cpp converts to on load (its ``--type``); "default" keeps the file's.
WEIGHT_TYPES = ("default", "f32", "f16", "bf16", "q8_0", "q6_k", "q5_k", "q5_1", "q5_0", "q4_k", "q4_1",
                "q4_0", "q3_k", "q2_k")
# stable-diffusion.cpp's lora_apply_mode (the bindings' LORA_APPLY_MODE_MAP): auto picks at_runtime when any
# weight is quantized, else immediately (src/stable-diffusion.cpp); immediately merges each LoRA into the weights
# once (no cost per step, less precise on quantized weights); at_runtime keeps the LoRA's weights and adds them in
# every step's graph (more memory and time per step, exact on quantized weights)
LORA_APPLY_MODES = ("auto", "immediately", "at_runtime")
MIN_TILE = 4
AUTO = "auto"  # the planner chooses (engine.memory.plan)
AUTO_KEYS = ("offload_to_cpu", "vae_tiling", "vae_tile_size", "weight_type", "keep_clip_on_cpu", "keep_vae_on_cpu",
             "max_vram")  # the options that may be auto
# What each auto option meant before the planner existed: what a caller that plans nothing gets
# (EngineOptions.concrete), e.g. verify's 64x64 probe.
LEGACY: Dict[str, Any] = {"offload_to_cpu": True, "vae_tiling": False, "vae_tile_size": 32, "weight_type": "default",
                          "keep_clip_on_cpu": False, "keep_vae_on_cpu": False, "max_vram": 0}
MAX_VRAM_GIB = 1024  # the largest max_vram taken (GiB): more than any GPU has
MIN_VRAM_GIB = 0.125  # the smallest non-zero one: a budget below one tensor cuts nothing
BOOL_KEYS = ("flash_attention", "offload_to_cpu", "vae_tiling", "memory_check", "keep_clip_on_cpu", "keep_vae_on_cpu",
             "enable_mmap")


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters: messages quote what was given, never all of it."""
    if isinstance(value, (str, bytes)) and len(value) > limit:
        value = value[:limit]
    text = repr(value) if isinstance(value, (str, bytes, int, float, bool, type(None))) else f"a {type(value).__name__}"
    return text if len(text) <= limit else text[:limit] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class EngineOptions:
    """How the ggml worker loads a model. ``threads`` 0 means auto (physical cores); ``"auto"`` in
    ``offload_to_cpu``, ``vae_tiling`` and ``weight_type`` means "the memory planner chooses"."""

    flash_attention: bool = True
    offload_to_cpu: Union[bool, str] = AUTO  # True, False or "auto"
    vae_tiling: Union[bool, str] = AUTO  # True, False or "auto"
    vae_tile_size: Union[int, str] = AUTO  # 4..512 or "auto" (the planner picks it when it tiles)
    threads: int = 0
    weight_type: str = AUTO
    memory_check: bool = True  # checked in the caller, before the worker starts (see engine.memory.estimate)
    # The bundled bindings' low-VRAM levers (stable_diffusion_cpp 0.4.7 StableDiffusion(...)): the text
    # encoders or the VAE on the CPU backend, a VRAM budget in GiB for graph-cut segmented execution of
    # offloaded weights (0: off; src/ggml_graph_cut.cpp), and reading the files through mmap.
    keep_clip_on_cpu: Union[bool, str] = AUTO
    keep_vae_on_cpu: Union[bool, str] = AUTO
    max_vram: Union[float, str] = AUTO
    enable_mmap: bool = False
    lora_apply_mode: str = AUTO  # LORA_APPLY_MODES; auto is stable-diffusion.cpp's own choice, never the planner's
    # Not a config key: the embedding files generate checked and staged in its private folder
    # (engine.request.companions), which the worker loads with the model.
    embeddings: List[str] = dataclasses.field(default_factory=list)
    # Not config keys either: component files generate checked (--vae, --clip-l, --control-net...,
    # protocol.COMPONENT_FLAGS), passed to StableDiffusion(...); vae_encode for an img2img run.
    diffusion_model: str = ""
    vae: str = ""
    clip_l: str = ""
    clip_g: str = ""
    t5xxl: str = ""
    llm: str = ""
    taesd: str = ""
    control_net: str = ""
    vae_encode: bool = False
    # Not a config key: the converted-weights cache folder the core hands in (engine.memory.converted;
    # "": none, a weight_type is converted on every load).
    converted_dir: str = ""
    # Chroma's DiT mask is not supported with flash attention (stable-diffusion.cpp warns, and the
    # image is NaN): generate turns the mask off then, as sd.cpp's docs/chroma.md example does.
    chroma_dit_mask: bool = True

    def validate(self, concrete: bool = False) -> EngineOptions:
        """Raise :class:`ConfigError` for a value outside its range (also run by the worker);
        ``concrete``: also for an ``auto`` left unresolved (what the worker loads with)."""
        for f in dataclasses.fields(self):
            if f.name in RUN_ONLY:
                continue
            _coerce(f.name, getattr(self, f.name), "engine options", allow_auto=False)
        left = self.auto_keys()
        if concrete and left:
            raise ConfigError(f"engine options: {', '.join(left)} must be resolved (not auto) before the worker loads",
                              hint="resolve them with accelstack.engine.memory.plan.plan or EngineOptions.concrete()")
        if not isinstance(self.embeddings, list) or not all(isinstance(p, str) and p for p in self.embeddings):
            raise ConfigError("engine options: embeddings must be a list of file paths")
        return self

    def auto_keys(self) -> List[str]:
        """The options still ``auto`` (left for the planner)."""
        return [k for k in AUTO_KEYS if getattr(self, k) == AUTO]

    def concrete(self, choices: Optional[Mapping[str, Any]] = None) -> EngineOptions:
        """A copy with every ``auto`` replaced: by ``choices`` (the planner's) where given, else by
        what it meant before the planner (:data:`LEGACY`). Given values are kept: they always win."""
        picked = dict(choices or {})
        values = {k: picked.get(k, LEGACY[k]) for k in self.auto_keys()}
        return dataclasses.replace(self, **values) if values else self


RUN_ONLY = ("embeddings", "diffusion_model", "vae", "clip_l", "clip_g", "t5xxl", "llm", "taesd", "control_net",
            "vae_encode", "chroma_dit_mask", "converted_dir")  # fields a run sets, never read from config.yaml or flags


def config_keys() -> List[str]:
    """The options config.yaml and the command line may set."""
    return [f.name for f in dataclasses.fields(EngineOptions) if f.name not in RUN_ONLY]


def _coerce(key: str, value: Any, where: str, allow_auto: bool = True) -> Any:
    """One YAML value to its option type, or a ConfigError naming the key and what is allowed."""
    if key in AUTO_KEYS and isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO  # every caller accepts auto here: the worker's check is validate(concrete=True)
    if key in BOOL_KEYS:
        if isinstance(value, bool):
            return value
        if key in AUTO_KEYS:
            raise _bad(where, key, f"must be true or false (or auto), got {shown(value)}")
        raise _bad(where, key, f"must be true or false, got {shown(value)}")
    if key == "max_vram":
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and \
                (value == 0 or MIN_VRAM_GIB <= value <= MAX_VRAM_GIB):
            return float(value)
        raise _bad(where, key, f"must be auto, 0 (off) or GiB from {MIN_VRAM_GIB:g} to {MAX_VRAM_GIB}, got {shown(value)}")
    if key == "vae_tile_size":
        if _is_int(value) and MIN_TILE <= value <= MAX_VAE_TILE:
            return value
        raise _bad(where, key, f"must be auto or an integer from {MIN_TILE} to {MAX_VAE_TILE} "
                   f"(latent pixels), got {shown(value)}")
    if key == "threads":
        if (allow_auto and value == "auto") or (_is_int(value) and 0 <= value <= MAX_THREADS):
            return 0 if value == "auto" else value
        raise _bad(where, key, f"must be auto or an integer from 1 to {MAX_THREADS}, got {shown(value)}",
                   f"{MAX_THREADS} is the most threads ggml runs; auto uses the physical cores")
    if key == "lora_apply_mode":
        if isinstance(value, str) and value.strip().lower() in LORA_APPLY_MODES:
            return value.strip().lower()
        raise _bad(where, key, f"must be one of {', '.join(LORA_APPLY_MODES)}, got {shown(value)}")
    if key == "weight_type":
        text = value.lower() if isinstance(value, str) else value
        if isinstance(text, str) and text in WEIGHT_TYPES:
            return text
        raise _bad(where, key, f"must be auto or one of {', '.join(WEIGHT_TYPES)}, got {shown(value)}")
    raise AssertionError(key)


COMMAND_LINE = "command line"


def _bad(where: str, key: str, text: str, hint: Optional[str] = None) -> AccelstackError:
    """A bad option value: in a config file, a ConfigError naming the file and key (fix the file);
    given by the caller (:func:`apply_overrides`: the CLI's flags), an InvalidRequestError naming
    the flag, as a bad --steps is, never sending a new user to a file they did not write."""
    if where == COMMAND_LINE:
        return InvalidRequestError(f"--{key.replace('_', '-')} {text}", hint=hint or "see the command's --help")
    return ConfigError(f"{where}: {SECTION}.{key} {text}", hint)


def options_from_mapping(data: Any, where: str = "config") -> EngineOptions:
    """Build options from the parsed YAML document (the whole file, with its ``engine`` section)."""
    if data is None:
        return EngineOptions()
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping with an '{SECTION}:' section, got {type(data).__name__}",
                          hint=f"start the file with '{SECTION}:' and indent the options under it")
    unknown = [shown(k, 40).strip("'") for k in data if k not in KNOWN_SECTIONS]
    if unknown:
        raise ConfigError(f"{where}: unknown section {', '.join(unknown[:5])}; known sections: {', '.join(KNOWN_SECTIONS)}")
    section = data.get(SECTION)
    if section is None:
        return EngineOptions()
    if not isinstance(section, Mapping):
        raise ConfigError(f"{where}: '{SECTION}' must be a mapping of options, got {type(section).__name__}")
    names = config_keys()
    values: Dict[str, Any] = {}
    for key, value in section.items():
        if key not in names:
            raise ConfigError(f"{where}: unknown option {SECTION}.{shown(key, 40).strip(chr(39))}; "
                              f"allowed: {', '.join(names)}")
        values[key] = _coerce(key, value, where)
    return EngineOptions(**values)


def load_config(path: Union[str, Path], *, missing_ok: bool = False) -> EngineOptions:
    """Options from ``path``, which must exist unless ``missing_ok`` (the settings' own config
    file: the defaults when it is absent; one named by hand must be there)."""
    target = Path(path)
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        if not missing_ok:
            raise ConfigError(f"config file {target} does not exist", hint="check the path of the config file",
                              action=Action.FIX_INPUT) from None
        return EngineOptions()
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise ConfigError(f"cannot read config file {target}: {getattr(exc, 'strerror', None) or exc}") from None
    if not stat.S_ISREG(mode):  # a FIFO or a device would block or never end; a folder is a mistake
        raise ConfigError(f"config file {target} is not a regular file", hint="name a config.yaml file")
    try:
        with open(target, "rb") as fh:
            data = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {target}: {exc.strerror or exc}") from None
    try:
        parsed = parse_yaml(data, what=f"config file {target}")
    except MalformedInput as exc:  # cut: it may quote the file (an alias name of 200 KB, found by fuzzing)
        message = exc.message if len(exc.message) <= 400 else exc.message[:400] + "..."
        raise ConfigError(message, hint="fix the file, or delete it to use the defaults") from None
    return options_from_mapping(parsed, where=str(target))


def apply_overrides(options: EngineOptions, overrides: Mapping[str, Any], where: str = COMMAND_LINE) -> EngineOptions:
    """Options with CLI flags (or, ``where`` named, a service job's ``engine`` object) applied on top
    (``None`` values mean 'not given')."""
    given = {k: v for k, v in overrides.items() if v is not None}
    names = set(config_keys())
    values = dataclasses.asdict(options)
    for key, value in given.items():
        if key not in names:
            raise ConfigError(f"unknown engine option {shown(key, 40)}; allowed: {', '.join(sorted(names))}")
        values[key] = _coerce(key, value, where)
    return EngineOptions(**values)
