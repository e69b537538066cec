"""Every command builds its Settings one way (`commands.common.settings_from_args`): a flag means
the same on every command that has it, and nothing else in the CLI resolves Settings itself."""
from __future__ import annotations

import ast
from pathlib import Path

from accelstack.cli import build_parser, subparsers_of
from accelstack.commands.common import settings_from_args

REPO = Path(__file__).resolve().parents[1]
REQUIRED = {"manifest sign": ["m.json", "--key", "k"], "manifest verify": ["m.json"], "manifest keygen": ["--out", "k"],
            "manifest build": ["d", "--base-url", "u", "--version", "1"], "channel add": ["n", "u"],
            "channel remove": ["n"], "fetch": ["u", "--sha256", "0" * 64, "--size", "1"], "build": ["ggml"],
            "generate": ["-m", "m", "-p", "p"], "bundle create": ["-o", "b.tar"], "completion": ["bash"]}


def _with_option(option: str):
    """(command path, parser) of every command that takes ``option``."""
    for path, p in subparsers_of(build_parser()):
        if option in p._option_string_actions:
            yield path, p


def _parse(path: str, *extra: str):
    parser = build_parser()
    return parser.parse_args([*path.split(), *REQUIRED.get(path, []), *extra])


def test_home_offline_and_wait_mean_the_same_on_every_command(tmp_path):
    home = tmp_path / "home"
    seen = []
    for path, _ in _with_option("--home"):
        s = settings_from_args(_parse(path, "--home", str(home)))
        assert s.home == home, path
        seen.append(path)
    assert {"install", "status", "cache purge", "channel list", "serve", "manifest verify"} <= set(seen)
    for path, _ in _with_option("--offline"):
        assert settings_from_args(_parse(path, "--offline")).offline is True, path
    for path, _ in _with_option("--wait"):
        assert settings_from_args(_parse(path, "--wait", "7")).timeouts.lock_wait == 7.0, path


def test_a_positional_of_the_same_name_is_not_the_flag(monkeypatch):
    monkeypatch.delenv("ACCELSTACK_MANIFESTS", raising=False)
    assert settings_from_args(_parse("manifest verify")).manifests == []  # MANIFEST is a file to check, not --manifest
    args = _parse("install", "--manifest", "https://a/m.json", "--manifest", "https://b/m.json", "--backend", "vulkan")
    s = settings_from_args(args, backend=args.backend)
    assert s.manifests == ["https://a/m.json", "https://b/m.json"] and s.backend == "vulkan"
    assert settings_from_args(None).manifests == []


def test_no_command_resolves_settings_itself():
    offenders = []
    for path in sorted((REPO / "accelstack" / "commands").glob("*.py")) + [REPO / "accelstack" / "cli.py"]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and node.attr == "resolve" and isinstance(node.value, ast.Name)
                    and node.value.id == "Settings" and path.name != "common.py"):
                offenders.append(f"{path.name}:{node.lineno}")
    assert not offenders, f"Settings.resolve outside commands/common.py: {offenders}"
