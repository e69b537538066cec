"""A job's options as the API receives them (JSON), read one by one: each name the job kind
takes, with its type and size checked, and nothing else (an unknown option is a 400, never
ignored)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Set

from ..domain import BACKENDS, STACKS
from .errors import BadRequest

__all__ = ["MAX_TEXT", "MAX_SHORT", "MAX_ITEMS", "Options"]

MAX_TEXT = 4_000  # a prompt
MAX_SHORT = 256  # names, backends, requirements
MAX_ITEMS = 32  # requirements


class Options:
    """Read a job's options one by one; unknown names and wrong types are a 400, never ignored."""

    def __init__(self, kind: str, data: Dict[str, Any]) -> None:
        self.kind, self.data = kind, data
        self.seen: Set[str] = set()

    def _get(self, name: str) -> Any:
        self.seen.add(name)
        return self.data.get(name)

    def _bad(self, name: str, want: str) -> BadRequest:
        return BadRequest(f"option {name!r} of a {self.kind} job must be {want}, got {self.data.get(name)!r}"[:400],
                          code="bad-request")

    def stack(self) -> str:
        v = self._get("stack")
        if v is None:
            return "ggml"
        if v not in STACKS:
            raise self._bad("stack", f"one of {', '.join(STACKS)}")
        return str(v)

    def backend(self) -> Optional[str]:
        v = self._get("backend")
        if v is None or v == "":
            return None
        if v not in BACKENDS:
            raise self._bad("backend", f"one of {', '.join(BACKENDS)}")
        return str(v)

    def flag(self, name: str) -> bool:
        v = self._get(name)
        if v is None:
            return False
        if not isinstance(v, bool):
            raise self._bad(name, "true or false")
        return v

    def text(self, name: str, limit: int, *, required: bool = False) -> str:
        v = self._get(name)
        if v is None and not required:
            return ""
        if not isinstance(v, str) or len(v) > limit or (required and not v):
            raise self._bad(name, f"a text of 1 to {limit} characters" if required else f"a text of at most {limit} characters")
        return v

    def strings(self, name: str) -> List[str]:
        v = self._get(name)
        if v is None:
            return []
        if not isinstance(v, list) or len(v) > MAX_ITEMS or not all(isinstance(x, str) and 0 < len(x) <= MAX_SHORT for x in v):
            raise self._bad(name, f"a list of at most {MAX_ITEMS} texts")
        return list(v)

    def typed(self, name: str, tp: type) -> Any:
        v = self._get(name)
        if tp is float and isinstance(v, int) and not isinstance(v, bool):
            if abs(v) > 2 ** 53:  # beyond any option's range; float() would fail past ~1.8e308
                raise self._bad(name, "a number of a sensible size")
            return float(v)
        if isinstance(v, bool) or not isinstance(v, tp) or (isinstance(v, str) and len(v) > MAX_TEXT):
            raise self._bad(name, {int: "an integer", float: "a number", str: "a text"}.get(tp, tp.__name__))
        return v

    def mapping(self, name: str) -> Dict[str, Any]:
        """A JSON object option (e.g. a generate job's ``engine``: config.yaml's engine keys); {} when absent."""
        v = self._get(name)
        if v is None:
            return {}
        if not isinstance(v, dict) or len(v) > MAX_ITEMS or not all(isinstance(k, str) for k in v):
            raise self._bad(name, f"an object of at most {MAX_ITEMS} options")
        return dict(v)

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.seen)
        if unknown:
            raise BadRequest(f"a {self.kind} job has no option {unknown[0]!r}", hint="see the API description for "
                             "each kind's options", code="bad-request")
