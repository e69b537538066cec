"""JSON Schemas of what ``--json`` prints (the contract in docs/json.md).

Two kinds of schema ship as files beside this module:

* ``line.schema.json``: every stdout line of a ``--json`` command — a ``progress`` event, the
  ``ready`` event of ``serve``, and the one final ``result`` or ``error`` line;
* ``result-<command>.schema.json``: the ``result`` object of that command's final line.

Results that are dataclasses get their schema generated from the type annotations (the same
ones :func:`accelstack.serde.to_dict` writes from), so a renamed field changes the schema file in
the same commit; the few dict-shaped results are written out by hand below. Run
``python -m accelstack.schemas`` to rewrite the files after changing a result type; a test checks
that the files are up to date and that every command's real output validates against them.

Objects allow properties they do not list (``additionalProperties`` is left open): apps must
ignore fields they do not know, so adding one does not bump ``format_version``.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import typing
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

# The result type of every command: this module is tooling over all of them (tests and
# ``python -m accelstack.schemas`` import it; no command does), so it imports them all.
from ..core.bundles import BundleSummary
from ..core.results import InstallSummary
from ..domain import EventKind
from ..engine.generation import GenerateReport
from ..engine.memory.dry_run import MemoryDecision
from ..engine.models.inspection import ModelInspection
from ..hardware.report import HardwareReport
from ..installer.maintenance import GcReport, StackStatus
from ..installer.records import Active
from ..installer.repair import RepairReport
from ..manifests.plan import Plan
from ..publisher.build_cache import BuildResult
from ..service.server import Stopped
from ..verdict import VerifyReport

HERE = Path(__file__).resolve().parent
DRAFT = "https://json-schema.org/draft/2020-12/schema"
BASE_ID = "https://accelstack.invalid/schemas/"  # a name, not a location: nothing is fetched
FORMAT_VERSION = 1  # keep equal to accelstack.commands.common.FORMAT_VERSION (checked by a test)

__all__ = ["BASE_ID", "COMMANDS", "DRAFT", "FORMAT_VERSION", "HERE", "JSON", "any_of", "dataclass_schema", "dumps",
           "expected_files", "line_schema", "list_of", "load", "obj", "result_schema", "write"]

JSON = Dict[str, Any]


# -- from dataclasses ---------------------------------------------------------------------------
class _Builder:
    """Schemas of dataclass types, nested dataclasses as ``$defs`` referenced by name."""

    def __init__(self) -> None:
        self.defs: Dict[str, JSON] = {}

    def of(self, tp: Any) -> JSON:
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if tp is Any or tp is object:
            return {}
        if tp is type(None):
            return {"type": "null"}
        if origin is Union:
            options = [self.of(a) for a in args]
            return {"anyOf": options}
        if origin is typing.Literal:
            return {"enum": list(args)}
        if origin in (list, tuple, set, frozenset) or tp in (list, tuple):
            item = args[0] if args else Any
            return {"type": "array", "items": self.of(item)}
        if origin is dict or tp is dict:
            value = args[1] if len(args) == 2 else Any
            return {"type": "object", "additionalProperties": self.of(value)}
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return {"enum": [m.value for m in tp]}
        if tp is bool:
            return {"type": "boolean"}
        if tp is int:
            return {"type": "integer"}
        if tp is float:
            return {"type": "number"}
        if tp is str or (isinstance(tp, type) and issubclass(tp, (str, Path))):
            return {"type": "string"}
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            name = tp.__name__
            if name not in self.defs:
                self.defs[name] = {}  # a placeholder: recursive types end here
                self.defs[name] = self._object(tp)
            return {"$ref": f"#/$defs/{name}"}
        raise TypeError(f"no JSON Schema for the type {tp!r}")

    def _object(self, cls: type) -> JSON:
        hints = typing.get_type_hints(cls)
        props: JSON = {}
        for f in dataclasses.fields(cls):
            props[f.name] = self.of(hints[f.name])
            if f.name.endswith("_at") and props[f.name] == {"type": "string"}:
                props[f.name] = dict(TS_OR_EMPTY)
            if f.metadata.get("doc"):
                props[f.name]["description"] = f.metadata["doc"]
        for name in getattr(cls, "__derived__", ()):  # read-only properties to_dict adds
            ret = typing.get_type_hints(getattr(cls, name).fget).get("return", Any)
            props[name] = self.of(ret)
        doc = (cls.__doc__ or "").strip().split("\n\n")[0]
        out: JSON = {"type": "object", "properties": props, "required": sorted(props)}
        if doc and not doc.startswith(cls.__name__ + "("):
            out["description"] = " ".join(doc.split())
        return out


def _with_defs(builder: _Builder, body: JSON) -> JSON:
    if builder.defs:
        body["$defs"] = dict(sorted(builder.defs.items()))
    return body


def dataclass_schema(cls: type, extra: Optional[JSON] = None, optional: Optional[JSON] = None) -> JSON:
    """The schema of ``to_dict(cls(...))``, with ``extra`` properties merged in (required too)
    and ``optional`` ones (present only sometimes)."""
    b = _Builder()
    ref = b.of(cls)
    top = dict(b.defs.pop(cls.__name__))
    top["properties"] = {**top["properties"], **(extra or {}), **(optional or {})}
    top["required"] = sorted(set(top["required"]) | set(extra or {}))
    assert ref == {"$ref": f"#/$defs/{cls.__name__}"}
    body = _with_defs(b, top)
    return _fix_self_refs(body, cls.__name__)


def _fix_self_refs(node: Any, name: str) -> Any:
    """A type that contains itself refers to the document root."""
    if isinstance(node, dict):
        if node.get("$ref") == f"#/$defs/{name}":
            return {"$ref": "#"}
        return {k: _fix_self_refs(v, name) for k, v in node.items()}
    if isinstance(node, list):
        return [_fix_self_refs(v, name) for v in node]
    return node


def list_of(cls: type) -> JSON:
    b = _Builder()
    return _with_defs(b, {"type": "array", "items": b.of(cls)})


# -- small hand-written pieces --------------------------------------------------------------------
S = {"type": "string"}
I = {"type": "integer"}  # noqa: E741 - the JSON type name
N = {"type": "number"}
B = {"type": "boolean"}
NS = {"type": ["string", "null"]}
# Every time in --json output is ISO 8601 UTC ending in Z (``2026-12-02T01:08:38.123Z``), fraction
# optional; a record's ``..._at`` time is "" until it happens.
ISO_UTC = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z"
TS = {"type": "string", "pattern": f"^{ISO_UTC}$"}
TS_OR_EMPTY = {"type": "string", "pattern": f"^({ISO_UTC})?$"}
# An error line's ``run``: a command to paste, never words (those are in its hint).
RUN = {"type": "string", "pattern": "^accelstack \\S"}
STRS = {"type": "array", "items": S}


def obj(required: Dict[str, JSON], optional: Optional[Dict[str, JSON]] = None, description: str = "") -> JSON:
    out: JSON = {"type": "object", "properties": {**required, **(optional or {})}, "required": sorted(required)}
    if description:
        out["description"] = description
    return out


def any_of(*variants: JSON) -> JSON:
    """One of several result shapes (a command group's subcommands); ``$defs`` are merged."""
    defs: JSON = {}
    options = []
    for v in variants:
        v = dict(v)
        defs.update(v.pop("$defs", {}))
        options.append(v)
    out: JSON = {"anyOf": options}
    if defs:
        out["$defs"] = dict(sorted(defs.items()))
    return out


# -- the registry ---------------------------------------------------------------------------------
def _channel_row() -> JSON:
    return obj({"name": S, "url": S, "mirrors": STRS, "keys": STRS, "trust": S, "origin": S},
               description="a channel: where its manifest is and which key signs it")


def _results() -> Dict[str, Callable[[], JSON]]:
    """command -> a function building the schema of its result."""

    def detect() -> JSON:
        return dataclass_schema(HardwareReport)

    def plan() -> JSON:
        return dataclass_schema(Plan)

    def verify() -> JSON:
        ggml = dataclass_schema(VerifyReport, {"verdict": {"enum": ["PASS", "FAIL"]}})
        torch = obj({"verdict": {"enum": ["PASS", "FAIL"]}, "ok": B, "reason": S, "python": S, "seconds": N},
                    {"torch_version": NS, "device_kind": NS, "device_name": NS, "ops": {"type": "array"},
                     "rejected": {"type": "object"}, "diffusers": {}},
                    description="accelstack verify --backend torch")
        return any_of(ggml, torch)

    def generate() -> JSON:
        report = dataclass_schema(GenerateReport, optional={"probe_model": {
            "type": "boolean", "description": "present and true when the model was the synthesized probe: its images are "
            "noise by design"}})
        decision = dataclass_schema(MemoryDecision, {"dry_run": {"const": True}})  # generate --dry-run (issue 45)
        return any_of(report, decision)

    def install() -> JSON:
        return dataclass_schema(InstallSummary)

    def status() -> JSON:
        stacks = list_of(StackStatus)
        return _with_defs_from(stacks, obj({"home": S, "stacks": {k: v for k, v in stacks.items() if k != "$defs"}}))

    def repair() -> JSON:
        return dataclass_schema(RepairReport)

    def rollback() -> JSON:
        return dataclass_schema(Active)

    def uninstall() -> JSON:
        return obj({"removed": STRS, "bytes_freed": I, "cancelled": B, "kept": {"type": "array"}},
                   description="what uninstall removed, the space it freed, and the caches it kept")

    def gc() -> JSON:
        return dataclass_schema(GcReport)

    def build() -> JSON:
        return dataclass_schema(BuildResult)

    def fetch() -> JSON:
        return obj({"name": S, "sha256": S, "size": {"type": ["integer", "null"]}, "path": S},
                   description="the verified file in the download cache")

    def manifest() -> JSON:
        keygen = obj({"keyid": S, "private_key": S, "public_key": S}, description="manifest keygen")
        sign = obj({"manifest": S, "signature": S, "keyid": S, "source": S, "version": I, "expires": TS},
                   description="manifest sign")
        verify_ = obj({"ok": B, "manifest": S, "source": S, "version": I, "kind": S, "expires": TS, "signed": B,
                       "keyid": NS}, description="manifest verify")
        build_ = obj({"manifest": S, "signed": B, "targets": STRS, "version": I, "changed": STRS, "assets": STRS},
                     description="manifest build")
        return any_of(keygen, sign, verify_, build_)

    def channel() -> JSON:
        return any_of(obj({"channels": {"type": "array", "items": _channel_row()}}, description="channel list"),
                      _channel_row())

    def bundle() -> JSON:
        return dataclass_schema(BundleSummary)

    def serve() -> JSON:
        return dataclass_schema(Stopped)

    def completion() -> JSON:
        return obj({"shell": {"enum": ["bash", "zsh", "fish", "powershell"]}, "script": S})

    def cache() -> JSON:
        entry = obj({"name": S, "path": S, "size": I}, description="one cache")
        listing = obj({"caches": {"type": "array", "items": entry}, "total_size": I}, description="cache list")
        purge = obj({"dry_run": B, "bytes_freed": I, "cancelled": B}, {"caches": {}, "removed": {}, "kept": {}},
                    description="cache purge")
        return any_of(listing, purge)

    def model() -> JSON:
        models = list_of(ModelInspection)
        return _with_defs_from(models, obj({"models": {k: v for k, v in models.items() if k != "$defs"}},
                                           description="model inspect: one entry per path, in order"))

    def doctor() -> JSON:
        return obj({"report": {"type": "object"}, "bundle": NS},
                   description="everything a support request needs (docs/support.md)")

    return {"detect": detect, "plan": plan, "verify": verify, "generate": generate, "install": install,
            "upgrade": install, "status": status, "repair": repair, "rollback": rollback, "uninstall": uninstall,
            "gc": gc, "build": build, "fetch": fetch, "manifest": manifest, "channel": channel, "bundle": bundle,
            "serve": serve, "completion": completion, "cache": cache, "doctor": doctor, "model": model}


def _with_defs_from(source: JSON, body: JSON) -> JSON:
    if "$defs" in source:
        body["$defs"] = source["$defs"]
    return body


COMMANDS: List[str] = sorted(_results())


def result_schema(command: str) -> JSON:
    """The schema of ``command``'s result object, as generated now (the shipped file is its copy)."""
    body = _results()[command]()
    return {"$schema": DRAFT, "$id": f"{BASE_ID}result-{command}.schema.json",
            "title": f"result of accelstack {command} --json", **body}


def line_schema() -> JSON:
    """Every line a ``--json`` command prints on stdout."""
    common: Dict[str, JSON] = {"event": S, "format_version": {"const": FORMAT_VERSION}, "command": S}
    progress = obj({"event": {"const": "progress"}, "ts": TS, "kind": {"enum": list(typing.get_args(EventKind))},
                    "stage": S, "stage_index": I, "task": S, "done": I, "total": {"type": ["integer", "null"]},
                    "ok": {"type": ["boolean", "null"]}, "message": S, "extra": {"type": "object"}},
                   description="a step of long work: start of a task (total null: its size cannot be known, it "
                   "only ticks), advance (done of total so far; also sent unchanged as a sign of life), end (ok "
                   "says how it went) or a message for people; ts is ISO-8601 UTC, stage_index the stage's place "
                   "in the run")
    ready = obj({**common, "event": {"const": "ready"}, "url": S, "token_file": S}, {"page_url": S},
                description="accelstack serve is listening (the result line follows when it stops)")
    result = obj({**common, "event": {"const": "result"}, "ok": B, "result": {"type": "object"}},
                 description="the final line of a command that ran to its end; ok is false when it ran but its "
                 "verdict is negative (a failed verify), and the exit code is then 1")
    error = obj({**common, "event": {"const": "error"}, "ok": {"const": False}, "error": S, "code": S, "message": S,
                 "hint": NS, "action": NS}, {"run": RUN},
                description="the final line of a command that failed: error is the type, code a stable identifier, "
                "action the step that helps, hint what to do in words, and run (only when there is one) the command "
                "that takes that step")
    return {"$schema": DRAFT, "$id": f"{BASE_ID}line.schema.json", "title": "a stdout line of accelstack --json",
            "oneOf": [progress, ready, result, error]}


def expected_files() -> Dict[str, JSON]:
    files = {"line.schema.json": line_schema()}
    for command in COMMANDS:
        files[f"result-{command}.schema.json"] = result_schema(command)
    return files


def dumps(schema: JSON) -> str:
    return json.dumps(schema, indent=1, sort_keys=False) + "\n"


def load(name: str) -> JSON:
    """A shipped schema file: ``line`` or a command name."""
    file = "line.schema.json" if name == "line" else f"result-{name}.schema.json"
    return json.loads((HERE / file).read_text(encoding="utf-8"))


def write(directory: Path = HERE) -> List[Path]:
    """(Re)write every schema file; returns the ones whose text changed."""
    changed = []
    for name, schema in expected_files().items():
        path = directory / name
        text = dumps(schema)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed
