"""Run the real `accelstack` command in a subprocess and read its JSON Lines (docs/json.md).

Every reader checks the whole contract on the way: each stdout line is one JSON object, valid
against the shipped line schema, the last one is the only ``result``/``error`` line, and a
result validates against its command's result schema (accelstack/schemas) — so any test that
parses output tests the documented contract too.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from jsonschema import Draft202012Validator

from accelstack import schemas

REPO = Path(__file__).resolve().parents[1]
FINAL_EVENTS = ("result", "error")


def run_cli(args: Sequence[Union[str, os.PathLike]], env: Optional[Mapping[str, str]] = None,
            cwd: Optional[Union[str, os.PathLike]] = None, timeout: float = 600,
            input: Optional[str] = None) -> Tuple[int, str, str]:
    """``python -m accelstack ARGS`` -> (exit code, stdout, stderr). ``env`` adds to (and
    overrides) this process's environment; the checkout is first on PYTHONPATH."""
    full = dict(os.environ)
    full.update(env or {})
    full["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([full["PYTHONPATH"]] if full.get("PYTHONPATH") else []))
    proc = subprocess.run([sys.executable, "-m", "accelstack", *map(str, args)], capture_output=True, text=True,
                          env=full, cwd=cwd, timeout=timeout, input=input,
                          stdin=None if input is not None else subprocess.DEVNULL)
    return proc.returncode, proc.stdout, proc.stderr


def json_lines(stdout: str) -> List[Dict]:
    """Every line of ``stdout`` as JSON, checked: objects only, exactly one final line, last."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert lines, "no output on stdout (a --json command must end with a result or error line)"
    docs: List[Dict] = []
    for n, line in enumerate(lines, 1):
        try:
            doc = json.loads(line)
        except ValueError as exc:
            raise AssertionError(f"stdout line {n} is not JSON ({exc}): {line[:300]!r}") from None
        assert isinstance(doc, dict), f"stdout line {n} is not a JSON object: {line[:300]!r}"
        assert "event" in doc, f"stdout line {n} has no 'event': {line[:300]!r}"
        docs.append(doc)
    for n, doc in enumerate(docs, 1):
        check_schema("line", doc, f"stdout line {n}")
    finals = [d for d in docs if d["event"] in FINAL_EVENTS]
    assert len(finals) == 1, f"{len(finals)} result/error lines, want exactly 1: {[d['event'] for d in docs]}"
    assert docs[-1] is finals[0], "the result/error line must be the last line"
    final = docs[-1]
    if final["event"] == "result":
        assert final["command"] in schemas.COMMANDS, f"no result schema for the command {final['command']!r}"
        check_schema(final["command"], final["result"], f"the result of {final['command']}")
    return docs


@cache
def validator(name: str) -> Draft202012Validator:
    """The shipped schema ``name`` (``line`` or a command), checked itself first."""
    schema = schemas.load(name)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def check_schema(name: str, doc: Any, what: str) -> None:
    errors = sorted(validator(name).iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        shown = "; ".join(f"at {'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message[:200]}" for e in errors[:5])
        raise AssertionError(f"{what} does not match the {name} schema: {shown}")


def final_of(stdout: str) -> Dict:
    """The final (result or error) line, whole."""
    return json_lines(stdout)[-1]


def result_of(stdout: str) -> Dict:
    """The ``result`` object of the final line, which must be a result line."""
    last = final_of(stdout)
    assert last["event"] == "result", f"expected a result line, got: {last}"
    return last["result"]


def error_of(stdout: str) -> Dict:
    """The final line, which must be an error line (code, message, hint, action, run...)."""
    last = final_of(stdout)
    assert last["event"] == "error", f"expected an error line, got: {last}"
    return last


def events_of(stdout: str) -> List[Dict]:
    """The event lines before the final one (progress and the like)."""
    return json_lines(stdout)[:-1]


def finish_pty(pid: int, fd: int) -> Tuple[int, bytes]:
    """Read a command's terminal (the parent side ``fd`` of its pty) to the end, reap it and close
    the terminal: (its exit status as os.waitpid gives it, what it printed). A closed pty reads as
    an error on Linux and as b"" elsewhere: both end it."""
    seen = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return status, seen
