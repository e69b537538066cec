"""Per-family settings (``data/family_settings.json``): the size rule and the reference defaults.

stable-diffusion.cpp aligns every size up to a multiple its family's VAE and diffusion model
need, silently (an SD 1.x model asked for 96x72 makes 128x128): the multiple is data here, so the
request check can refuse a size the family cannot make exactly. Each family also has reference
settings (Flux: cfg 1 with distilled guidance 3.5; SD 3.x: cfg 4.5): those are the defaults a
request takes for what the user did not give. Every entry names its source.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional

from ..errors import EngineError

__all__ = ["FamilySettings", "family_settings", "settings_for", "SETTINGS_FILE", "DEFAULT_MULTIPLE", "DEFAULT_KEYS"]

SETTINGS_FILE = Path(__file__).resolve().parents[1] / "data" / "family_settings.json"
DEFAULT_MULTIPLE = 8  # a family without an entry: the request's own rule (protocol.SIDE_MULTIPLE)
# The request fields a family's defaults may set, with their types.
DEFAULT_KEYS: Dict[str, type] = {"cfg_scale": float, "guidance": float, "sampler": str, "scheduler": str, "steps": int,
                                 "flow_shift": float}


@dataclass(frozen=True)
class FamilySettings:
    """One family's size multiple (and where it comes from) and reference defaults (and their source)."""

    family: str
    size_multiple: int = DEFAULT_MULTIPLE
    size_source: str = ""
    defaults: Dict[str, Any] = field(default_factory=dict)
    source: str = ""
    ref_images: str = ""  # where the family reads reference images (edits), from the source; "": it takes none


def _bad(what: str) -> EngineError:
    return EngineError(f"accelstack's family settings are invalid: {what}",
                       hint=f"this is a bug in accelstack ({SETTINGS_FILE.name}); please report it")


def _parse(doc: Any) -> Dict[str, FamilySettings]:
    if not isinstance(doc, dict) or not isinstance(doc.get("sources"), dict) or not isinstance(doc.get("families"), dict):
        raise _bad("it must be an object with sources and families")
    sources: Dict[str, str] = doc["sources"]
    out: Dict[str, FamilySettings] = {}
    for family, node in doc["families"].items():
        if not isinstance(node, dict):
            raise _bad(f"{family} must be an object")
        multiple = node.get("size_multiple")
        if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1 or multiple % 8 and 8 % multiple:
            raise _bad(f"{family}.size_multiple must be a positive integer")
        defaults = node.get("defaults", {})
        if not isinstance(defaults, dict):
            raise _bad(f"{family}.defaults must be an object")
        for key, value in defaults.items():
            want = DEFAULT_KEYS.get(key)
            if want is None or isinstance(value, bool) or not isinstance(value, (int, float) if want is float else want):
                raise _bad(f"{family}.defaults.{key} is not one of {', '.join(DEFAULT_KEYS)} with a value of its type")
        for key in ("size_source", "source") + (("ref_images",) if "ref_images" in node else ()):
            if node.get(key) not in sources:
                raise _bad(f"{family}.{key} must name one of the sources")
        out[family] = FamilySettings(family, max(multiple, DEFAULT_MULTIPLE), sources[node["size_source"]],
                                     {k: (float(v) if DEFAULT_KEYS[k] is float else v) for k, v in defaults.items()},
                                     sources[node["source"]], sources.get(node.get("ref_images", ""), ""))
    return out


@functools.lru_cache(maxsize=1)
def family_settings(path: Optional[str] = None) -> Dict[str, FamilySettings]:
    """Every family's settings (read once per process)."""
    try:
        doc = json.loads((Path(path) if path else SETTINGS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise _bad(f"cannot read it ({exc})") from None
    return _parse(doc)


def settings_for(family: str) -> FamilySettings:
    """``family``'s settings; a family without an entry (or "unknown"): the request's own rule, no defaults."""
    return family_settings().get(family) or FamilySettings(family)
