"""The model-family knowledge (``data/model_families.json``), loaded into typed records and checked.

Which family a model file belongs to, which parts it holds and which companions it still needs is
data taken from stable-diffusion.cpp's own version detection (each rule names its source), so a
new family is a JSON entry, not code. :mod:`~accelstack.engine.models.inspection` applies it.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from ..errors import EngineError

__all__ = ["Condition", "PrefixRule", "EncoderKind", "VaeKind", "Variant", "FamilyRule", "Knowledge", "knowledge",
           "parse_knowledge", "DATA_FILE"]

DATA_FILE = Path(__file__).resolve().parents[1] / "data" / "model_families.json"
COMPONENTS = ("diffusion_model", "vae", "text_encoder")


@dataclass(frozen=True)
class Condition:
    """All of these must hold: ``any`` (some name contains one), ``all`` (each is in some name),
    ``none`` (no name contains any), ``context_dim`` and ``input_channels`` (the measured value is one of)."""

    any: Tuple[str, ...] = ()
    all: Tuple[str, ...] = ()
    none: Tuple[str, ...] = ()
    context_dim: Tuple[int, ...] = ()
    input_channels: Tuple[int, ...] = ()


@dataclass(frozen=True)
class PrefixRule:
    prefix: str
    component: str  # one of COMPONENTS
    layout: str
    group: str = ""


@dataclass(frozen=True)
class EncoderKind:
    id: str
    name: str
    embedding: Tuple[str, ...]
    width: int
    files: Tuple[str, ...]


@dataclass(frozen=True)
class VaeKind:
    id: str
    name: str
    latent_channels: int
    dims: int
    files: Tuple[str, ...]


@dataclass(frozen=True)
class Variant:
    id: str
    name: str
    when: Condition
    source: str
    text_encoders: Tuple[str, ...] = ()  # what this variant takes where it is one of the family's (FLUX.2 dev, klein)


@dataclass(frozen=True)
class FamilyRule:
    id: str
    name: str
    when: Condition
    source: str
    vaes: Tuple[str, ...]
    text_encoders: Tuple[str, ...]
    files: Tuple[str, ...]
    variants: Tuple[Variant, ...] = ()


@dataclass(frozen=True)
class Knowledge:
    sources: Dict[str, str]
    prefixes: Tuple[PrefixRule, ...]
    encoders: Tuple[EncoderKind, ...]
    vaes: Tuple[VaeKind, ...]
    families: Tuple[FamilyRule, ...]
    input_tensors: Tuple[str, ...]
    latent_tensors: Tuple[str, ...]
    prefix_source: str = ""
    encoder_source: str = ""
    vae_source: str = ""
    files_source: str = ""  # where the usual file names come from
    by_id: Dict[str, FamilyRule] = field(default_factory=dict)

    def source(self, key: str) -> str:
        return f"{self.sources.get(key, key)}"


def _bad(what: str) -> EngineError:
    return EngineError(f"accelstack's model-family data is invalid: {what}",
                       hint=f"this is a bug in accelstack ({DATA_FILE.name}); please report it")


def _strs(node: Dict[str, Any], key: str, where: str) -> Tuple[str, ...]:
    value = node.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _bad(f"{where}.{key} must be a list of non-empty strings")
    return tuple(value)


def _ints(node: Dict[str, Any], key: str, where: str) -> Tuple[int, ...]:
    value = node.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise _bad(f"{where}.{key} must be a list of integers")
    return tuple(value)


def _text(node: Dict[str, Any], key: str, where: str) -> str:
    value = node.get(key)
    if not isinstance(value, str) or not value:
        raise _bad(f"{where}.{key} must be a non-empty string")
    return value


def _condition(node: Any, where: str) -> Condition:
    if not isinstance(node, dict) or set(node) - {"any", "all", "none", "context_dim", "input_channels"}:
        raise _bad(f"{where}.when must be an object of any/all/none/context_dim/input_channels")
    return Condition(_strs(node, "any", where), _strs(node, "all", where), _strs(node, "none", where),
                     _ints(node, "context_dim", where), _ints(node, "input_channels", where))


def _source(node: Dict[str, Any], sources: Dict[str, str], where: str) -> str:
    key = _text(node, "source", where)
    if key not in sources:
        raise _bad(f"{where} cites source {key!r}, which is not in sources")
    return key


def parse_knowledge(doc: Any) -> Knowledge:
    """Check the document and build the records; :func:`_bad` names the first wrong entry."""
    if not isinstance(doc, dict) or not isinstance(doc.get("sources"), dict):
        raise _bad("it must be an object with sources")
    sources = {str(k): str(v) for k, v in doc["sources"].items()}
    sections = {}
    for key in ("prefixes", "text_encoders", "vaes", "families"):
        section = doc.get(key)
        if not isinstance(section, dict) or not isinstance(section.get("rules" if key in ("prefixes", "families")
                                                                         else "kinds"), list):
            raise _bad(f"{key} must be an object with a list of rules or kinds")
        sections[key] = section
    prefixes = []
    for i, node in enumerate(sections["prefixes"]["rules"]):
        where = f"prefixes.rules[{i}]"
        if not isinstance(node, dict) or node.get("component") not in COMPONENTS:
            raise _bad(f"{where}.component must be one of {', '.join(COMPONENTS)}")
        prefixes.append(PrefixRule(_text(node, "prefix", where), node["component"], _text(node, "layout", where),
                                   str(node.get("group", ""))))
    encoders = []
    for i, node in enumerate(sections["text_encoders"]["kinds"]):
        where = f"text_encoders.kinds[{i}]"
        if not isinstance(node, dict) or not isinstance(node.get("width"), int):
            raise _bad(f"{where}.width must be an integer")
        encoders.append(EncoderKind(_text(node, "id", where), _text(node, "name", where),
                                    _strs(node, "embedding", where), node["width"], _strs(node, "files", where)))
    vaes = []
    for i, node in enumerate(sections["vaes"]["kinds"]):
        where = f"vaes.kinds[{i}]"
        if not isinstance(node, dict) or not all(isinstance(node.get(k), int) for k in ("latent_channels", "dims")):
            raise _bad(f"{where} needs integer latent_channels and dims")
        vaes.append(VaeKind(_text(node, "id", where), _text(node, "name", where), node["latent_channels"],
                            node["dims"], _strs(node, "files", where)))
    encoder_ids, vae_ids = {e.id for e in encoders}, {v.id for v in vaes}
    families = []
    for i, node in enumerate(sections["families"]["rules"]):
        where = f"families.rules[{i}]"
        if not isinstance(node, dict) or not isinstance(node.get("needs"), dict):
            raise _bad(f"{where} needs an object 'needs'")
        needs_vae, needs_te = _strs(node["needs"], "vae", where), _strs(node["needs"], "text_encoders", where)
        unknown = (set(needs_vae) - vae_ids) | (set(needs_te) - encoder_ids)
        if unknown:
            raise _bad(f"{where} needs {', '.join(sorted(unknown))}, which are not defined")
        variants = []
        for j, var in enumerate(node.get("variants", [])):
            vw = f"{where}.variants[{j}]"
            if not isinstance(var, dict):
                raise _bad(f"{vw} must be an object")
            own = _strs(var, "text_encoders", vw)
            if set(own) - set(needs_te):
                raise _bad(f"{vw}.text_encoders must be among its family's")
            variants.append(Variant(_text(var, "id", vw), _text(var, "name", vw), _condition(var.get("when"), vw),
                                    _source(var, sources, vw), own))
        families.append(FamilyRule(_text(node, "id", where), _text(node, "name", where),
                                   _condition(node.get("when"), where), _source(node, sources, where), needs_vae,
                                   needs_te, _strs(node, "files", where), tuple(variants)))
    ids = [f.id for f in families]
    if len(set(ids)) != len(ids):
        raise _bad("family ids must be unique")
    found = Knowledge(sources, tuple(prefixes), tuple(encoders), tuple(vaes), tuple(families),
                      _strs(sections["families"], "input_tensors", "families"),
                      _strs(sections["vaes"], "latent_tensors", "vaes"),
                      _source(sections["prefixes"], sources, "prefixes"),
                      _source(sections["text_encoders"], sources, "text_encoders"),
                      _source(sections["vaes"], sources, "vaes"),
                      _files_source(sections, sources))
    found.by_id.update({f.id: f for f in families})
    return found


def _files_source(sections: Dict[str, Any], sources: Dict[str, str]) -> str:
    keys = {_text(sections[s], "files_source", s) for s in ("text_encoders", "vaes", "families")}
    if len(keys) != 1 or not keys <= set(sources):
        raise _bad("text_encoders, vaes and families must cite one files_source from sources")
    return keys.pop()


@functools.lru_cache(maxsize=1)
def knowledge(path: Optional[str] = None) -> Knowledge:
    """The shipped knowledge (read once per process)."""
    try:
        doc = json.loads((Path(path) if path else DATA_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise _bad(f"cannot read it ({exc})") from None
    return parse_knowledge(doc)
