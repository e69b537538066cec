"""Engine options: from ``config.yaml`` (a path the caller names, else ``Settings.config_file``) and overrides.

The file has one section that this module owns::

    engine:
      flash_attention: true    # flash attention in the diffusion model (less memory)
      offload_to_cpu: true     # keep weights in RAM, move them to VRAM when needed
      vae_tiling: false        # decode the image in tiles (less memory, slower)
      vae_tile_size: 32        # tile edge in latent pixels (x8 in image pixels), >= 4
      threads: auto            # CPU threads: auto (physical cores) or a positive integer
      weight_type: default     # convert weights on load: default (as stored), f16, q8_0, ...

Invalid keys and values raise :class:`ConfigError` naming the key and the allowed values.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Union

from ..errors import Action
from ..settings import Settings
from .errors import ConfigError

SECTION = "engine"
KNOWN_SECTIONS = (SECTION,)

# The weight types stable-diffusion.cpp converts to on load (its ``--type``); "default" keeps the file's.
WEIGHT_TYPES = ("default", "f32", "f16", "bf16", "q8_0", "q6_k", "q5_k", "q5_1", "q5_0", "q4_k", "q4_1",
                "q4_0", "q3_k", "q2_k")
MIN_TILE = 4


@dataclass
class EngineOptions:
    """How the ggml worker loads a model. ``threads`` 0 means auto (physical cores)."""

    flash_attention: bool = True
    offload_to_cpu: bool = True
    vae_tiling: bool = False
    vae_tile_size: int = 32
    threads: int = 0
    weight_type: str = "default"

    def validate(self) -> EngineOptions:
        for key in ("flash_attention", "offload_to_cpu", "vae_tiling"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"engine option {key} must be true or false, got {getattr(self, key)!r}")
        if isinstance(self.vae_tile_size, bool) or not isinstance(self.vae_tile_size, int) or self.vae_tile_size < MIN_TILE:
            raise ConfigError(f"engine option vae_tile_size must be an integer >= {MIN_TILE} (latent pixels), "
                              f"got {self.vae_tile_size!r}")
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 0:
            raise ConfigError(f"engine option threads must be auto or a positive integer, got {self.threads!r}")
        if self.weight_type not in WEIGHT_TYPES:
            raise ConfigError(f"engine option weight_type must be one of {', '.join(WEIGHT_TYPES)}, "
                              f"got {self.weight_type!r}")
        return self


def _coerce(key: str, value: Any, where: str) -> Any:
    """One YAML value to its option type, or a ConfigError naming the key and what is allowed."""
    if key in ("flash_attention", "offload_to_cpu", "vae_tiling"):
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: {SECTION}.{key} must be true or false, got {value!r}")
    if key == "vae_tile_size":
        if isinstance(value, int) and not isinstance(value, bool) and value >= MIN_TILE:
            return value
        raise ConfigError(f"{where}: {SECTION}.{key} must be an integer >= {MIN_TILE} (latent pixels), got {value!r}")
    if key == "threads":
        if value in ("auto", 0):
            return 0
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        raise ConfigError(f"{where}: {SECTION}.{key} must be auto or a positive integer, got {value!r}")
    if key == "weight_type":
        text = str(value).lower() if isinstance(value, str) else value
        if text in WEIGHT_TYPES:
            return text
        raise ConfigError(f"{where}: {SECTION}.{key} must be one of {', '.join(WEIGHT_TYPES)}, got {value!r}")
    raise AssertionError(key)


def options_from_mapping(data: Any, where: str = "config") -> EngineOptions:
    """Build options from the parsed YAML document (the whole file, with its ``engine`` section)."""
    if data is None:
        return EngineOptions()
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping with an '{SECTION}:' section, got {type(data).__name__}",
                          hint=f"start the file with '{SECTION}:' and indent the options under it")
    unknown = [str(k) for k in data if k not in KNOWN_SECTIONS]
    if unknown:
        raise ConfigError(f"{where}: unknown section {', '.join(unknown)}; known sections: {', '.join(KNOWN_SECTIONS)}")
    section = data.get(SECTION)
    if section is None:
        return EngineOptions()
    if not isinstance(section, Mapping):
        raise ConfigError(f"{where}: '{SECTION}' must be a mapping of options, got {type(section).__name__}")
    names = [f.name for f in dataclasses.fields(EngineOptions)]
    values: Dict[str, Any] = {}
    for key, value in section.items():
        if key not in names:
            raise ConfigError(f"{where}: unknown option {SECTION}.{key}; allowed: {', '.join(names)}")
        values[key] = _coerce(key, value, where)
    return EngineOptions(**values)


def load_config(path: Optional[Union[str, Path]] = None) -> EngineOptions:
    """Options from ``path`` (must exist), else from ``Settings.resolve().config_file`` (the
    defaults when that file is absent)."""
    explicit = path is not None
    target = Path(path) if path is not None else Settings.resolve().config_file
    try:
        text = target.read_text(encoding="utf-8")
    except FileNotFoundError:
        if explicit:
            raise ConfigError(f"config file {target} does not exist", hint="check the path of the config file",
                              action=Action.FIX_INPUT) from None
        return EngineOptions()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {target}: {exc.strerror or exc}") from None
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"config file {target} is not valid YAML{at}: {getattr(exc, 'problem', None) or exc}",
                          hint="fix the syntax, or delete the file to use the defaults") from None
    return options_from_mapping(data, where=str(target))


def apply_overrides(options: EngineOptions, overrides: Mapping[str, Any]) -> EngineOptions:
    """Options with CLI flags applied on top (``None`` values mean 'not given')."""
    given = {k: v for k, v in overrides.items() if v is not None}
    names = {f.name for f in dataclasses.fields(EngineOptions)}
    values = dataclasses.asdict(options)
    for key, value in given.items():
        if key not in names:
            raise ConfigError(f"unknown engine option {key}; allowed: {', '.join(sorted(names))}")
        values[key] = _coerce(key, value, "command line")
    return EngineOptions(**values)
