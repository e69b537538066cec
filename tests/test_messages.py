"""Issue 25, words and units, what the audit found left: plurals through ``serde.plural`` (never
"file(s)"), sizes through ``serde.size_text`` (binary units, never a raw byte count or MB of 1e6),
no internal argument name in a message, and an action's step said once in a hint."""
from __future__ import annotations

import ast
import json
import re
import struct
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

import accelstack
from accelstack.artifacts.errors import OfflineError
from accelstack.commands import common
from accelstack.engine.errors import ModelLoadError
from accelstack.engine.models.check import check_model
from accelstack.errors import AccelstackError
from accelstack.limits import MalformedInput, parse_json, parse_yaml, sizes_apart, too_large
from accelstack.manifests.ggml_manifest import parse_artifact
from accelstack.publisher.sdist import offline_source_error

from cli_helpers import error_of, run_cli

PACKAGE = Path(accelstack.__file__).resolve().parent

# "(s)" plurals allowed per file (none are left; an entry would allow that many, never more).
S_PLURALS_LEFT: Dict[str, int] = {}  # none left
# Internal argument names seen in messages before (a hint said "raise max_files", naming a keyword
# argument no user can set): never again in any message, log line or help text.
LEAKED_BEFORE = ("max_files", "max_bytes", "max_depth", "max_members")
# snake_case words that are parameter names somewhere but, in a message, name what a user sees: a
# manifest's field, a diffusers model's folder, a service job's field (a generate job's "dry_run": true, docs/engine.md).
USER_FACING_NAMES = {"cuda_libs", "text_encoder", "dry_run"}


def _strings(tree: ast.AST) -> Iterator[ast.Constant]:
    """Every string literal of ``tree`` (f-strings' literal parts too) except docstrings."""
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node


def _sources() -> List[Tuple[str, ast.AST]]:
    return [(path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(encoding="utf-8")))
            for path in sorted(PACKAGE.rglob("*.py"))]


def _s_plurals(sources: List[Tuple[str, ast.AST]]) -> Dict[str, List[str]]:
    """Per file, its literals with a "(s)" plural, where there are more than it is allowed."""
    found: Dict[str, List[str]] = {}
    for rel, tree in sources:
        hits = [f"{rel}:{s.lineno}: {s.value[:80]!r}" for s in _strings(tree) if re.search(r"\w\(s\)", s.value)]
        if len(hits) > S_PLURALS_LEFT.get(rel, 0):
            found[rel] = hits
    return found


def _names_shown(sources: List[Tuple[str, ast.AST]]) -> Tuple[List[str], List[str]]:
    """Prose (a literal with a space) that names an argument leaked before, anywhere; and prose
    in what an error is raised with that names any function parameter (snake_case)."""
    params: Set[str] = set()
    for _, tree in sources:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                params |= {a.arg for a in node.args.args + node.args.kwonlyargs if "_" in a.arg.strip("_")}
    word = re.compile(r"(?<![\w.$/-])[a-z][a-z0-9]*(?:_[a-z0-9]+)+(?![\w./(])")  # not a path, a field.path or a call
    leaked, named = [], []
    for rel, tree in sources:
        leaked += [f"{rel}:{s.lineno}: {s.value[:80]!r}" for s in _strings(tree)
                   if " " in s.value and any(re.search(rf"\b{n}\b", s.value) for n in LEAKED_BEFORE)]
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and node.exc is not None:
                for s in _strings(node.exc):
                    shown = (set(word.findall(s.value)) & params) - USER_FACING_NAMES if " " in s.value else set()
                    if shown:
                        named.append(f"{rel}:{s.lineno}: {sorted(shown)} in {s.value[:80]!r}")
    return leaked, named


def test_no_plural_is_written_with_s_in_brackets():
    found = _s_plurals(_sources())
    assert not found, f"say '1 file' / '2 files' with accelstack.serde.plural, not 'file(s)': {found}"


def test_no_internal_argument_name_is_shown_in_a_message():
    leaked, named = _names_shown(_sources())
    assert not leaked, f"internal argument names in messages: {leaked}"
    assert not named, f"parameter names in error messages (say what a user can do instead): {named}"


RAW_BYTES = re.compile(r"(^|\s)bytes(, more than| accepted)|%d bytes")


def _raw_byte_counts(sources: List[Tuple[str, ast.AST]]) -> List[str]:
    """Literals that show a size as a raw count of bytes ("is N bytes, more than the M accepted",
    "%d bytes") instead of through serde.size_text."""
    return [f"{rel}:{s.lineno}: {s.value[:80]!r}" for rel, tree in sources for s in _strings(tree)
            if RAW_BYTES.search(s.value)]


def test_no_size_is_said_as_a_raw_byte_count():
    found = _raw_byte_counts(_sources())
    assert not found, f"say sizes with accelstack.serde.size_text (KiB, MiB, GiB): {found}"


def test_the_scans_find_what_they_look_for():
    """The scans above on a module written to fail them, so one that finds nothing is not blind;
    docstrings are not messages."""
    bad = [("bad.py", ast.parse('"""Docstrings may say file(s) and max_files."""\n'
                                'def f(dest_dir, n):\n'
                                '    """f(s): max_files."""\n'
                                '    log.info("%d file(s) left", n)\n'
                                '    raise ValueError(f"{n} left", "raise max_files, or pick dest_dir again")\n'))]
    assert list(_s_plurals(bad)) == ["bad.py"] and len(_s_plurals(bad)["bad.py"]) == 1
    sizes = [("sizes.py", ast.parse('def g(n, m):\n    raise ValueError(f"it is {n} bytes, more than the {m} accepted")\n'))]
    assert len(_raw_byte_counts(sizes)) == 1
    leaked, named = _names_shown(bad)
    assert len(leaked) == 1 and "max_files" in leaked[0], leaked
    assert len(named) == 1 and "['dest_dir']" in named[0], named


# -- sizes -------------------------------------------------------------------------------------------
def test_a_refused_size_is_said_in_binary_units():
    assert too_large("the manifest", 12 << 20, 8 << 20) == "the manifest is 12.0 MiB, more than the 8.0 MiB accepted"
    assert too_large("x", (8 << 20) + 1, 8 << 20) == "x is more than the 8.0 MiB accepted"  # not "8.0 MiB, more than 8.0 MiB"
    assert sizes_apart(3 << 20, 1 << 20) == ("3.0 MiB", "1.0 MiB")
    assert sizes_apart(1048574, 1048576) == ("1024 KiB (1,048,574 bytes)", "1.0 MiB (1,048,576 bytes)")  # close: exact
    with pytest.raises(MalformedInput) as err:
        parse_json(b"[" + b"1," * 3000 + b"1]", what="manifest", max_bytes=4096)
    assert err.value.message == "manifest is 5.9 KiB, more than the 4.0 KiB accepted"
    with pytest.raises(MalformedInput) as err:
        parse_yaml("a: " + "b" * 300_000, what="config.yaml")
    assert err.value.message == "config.yaml is 293 KiB, more than the 256 KiB accepted"


def _safetensors(path: Path, header: object, data: bytes = b"", length: int = -1) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length < 0 else length) + raw + data)
    return path


def _gguf_with_a_tensor_past_the_end(path: Path) -> Path:
    """A GGUF v3 file, no metadata, one f32 tensor of 1024x1024 (4 MiB) with no data after the header."""
    out = b"GGUF" + struct.pack("<IQQ", 3, 1, 0)
    out += struct.pack("<Q", 1) + b"w" + struct.pack("<I", 2) + struct.pack("<QQ", 1024, 1024) + struct.pack("<IQ", 0, 0)
    path.write_bytes(out + b"\0" * (-len(out) % 32))
    return path


@pytest.mark.parametrize("make, said", [
    (lambda p: _safetensors(p / "m.safetensors", {}, length=2 ** 63),
     "its header length is 8388608 TiB, more than the 100 MiB safetensors allows"),
    (lambda p: _safetensors(p / "m.safetensors", {}, length=5000),
     "its header length is 4.9 KiB, more than the 2 B the file holds after it"),
    (lambda p: _safetensors(p / "m.safetensors", {"w": {"dtype": "F32", "shape": [1024, 1024], "data_offsets": [0, 2 << 20]}},
                            b"\0" * (2 << 20)),
     "tensor 'w' has shape [1024, 1024] of F32, which needs 4.0 MiB of data, but the file gives it 2.0 MiB"),
    (lambda p: _safetensors(p / "m.safetensors", {"w": {"dtype": "F16", "shape": [4], "data_offsets": [0, 4096]}},
                            b"\0" * 16),
     "tensor 'w' lies outside the file (16 B of data)"),
    (lambda p: _gguf_with_a_tensor_past_the_end(p / "m.gguf"),
     "a tensor's data (4.0 MiB) lies outside the file: it ends 4.0 MiB in, and the file is 96 B"),
])
def test_model_checks_say_sizes_in_binary_units(tmp_path, make, said):
    path = make(tmp_path)
    with pytest.raises(ModelLoadError) as err:
        check_model(path)
    assert said in err.value.message, err.value.message
    assert not re.search(r"\d{4,} bytes|\d-byte", err.value.message), err.value.message


def test_a_manifest_artifact_size_past_the_limit_is_said_in_binary_units():
    with pytest.raises(AccelstackError) as err:
        parse_artifact({"name": "a.whl", "sha256": "a" * 64, "size": 2 ** 45, "urls": ["https://h/a.whl"]}, "t.artifacts[0]")
    assert err.value.message == "t.artifacts[0].size: must be a positive number of bytes up to 16.0 TiB, got 35184372088832 (32.0 TiB)"
    with pytest.raises(AccelstackError, match="size: must be a positive number of bytes up to 16.0 TiB, got 0$"):
        parse_artifact({"name": "a.whl", "sha256": "a" * 64, "size": 0, "urls": ["https://h/a.whl"]}, "t.artifacts[0]")


# -- a hint says each step once ----------------------------------------------------------------------
def test_the_offline_source_hint_says_go_online_once(tmp_path):
    err = offline_source_error(tmp_path / "sdist")
    for hint in (common.hint_of(err), json.loads(common.error_line("install", err))["hint"]):
        assert hint.count("without --offline") == 1, hint
        assert "ACCELSTACK_OFFLINE" in hint and "accelstack bundle create" in hint, hint
    # any offline hint that gives the step in its own words gets no second copy; one that does not, gets it
    own = OfflineError("offline mode: the manifest is not cached", "make a bundle, or run once without --offline")
    assert common.hint_of(own) == "make a bundle, or run once without --offline"
    bare = OfflineError("offline mode: 1 file is not in the cache", "the cache has no copy")
    assert common.hint_of(bare) == "the cache has no copy; run without --offline (and unset ACCELSTACK_OFFLINE)"


def test_install_offline_without_the_source_says_run_without_offline_once(tmp_path):
    env = {"ACCELSTACK_HOME": str(tmp_path / "home"), "ACCELSTACK_CACHE": str(tmp_path / "cache"),
           "ACCELSTACK_BUILD_CACHE": str(tmp_path / "builds"), "ACCELSTACK_CONFIG_DIR": str(tmp_path / "config"),
           "ACCELSTACK_CONFIG": str(tmp_path / "config.yaml"), "ACCELSTACK_OFFLINE": "", "ACCELSTACK_BACKEND": "",
           "ACCELSTACK_MANIFESTS": "", "ACCELSTACK_CHANNEL": ""}
    args = ["install", "--offline", "--backend", "cpu"]  # no channel: a local build, and offline no source for it
    rc, out, err = run_cli(args + ["--json"], env)
    e = error_of(out)
    assert rc == 1 and e["code"] == "offline" and "source" in e["message"], e
    assert e["hint"].count("without --offline") == 1, e["hint"]
    rc, out, err = run_cli(args, env)
    assert rc == 1 and err.count("without --offline") == 1, err
