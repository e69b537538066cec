"""Shell completion generated from the parser, completed by a real bash; --help teaches.

zsh and fish are checked by their own syntax checkers when they are installed (``zsh -n``,
``fish --no-execute``); the bash script is run the way bash runs it on a Tab press.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys

import pytest

from accelstack.cli import COMMAND_TABLE, COMMANDS, build_parser, subparsers_of
from accelstack.commands.completion import script, tree

from cli_helpers import run_cli


@pytest.fixture(scope="module")
def bash_script(tmp_path_factory):
    path = tmp_path_factory.mktemp("completion") / "accelstack.bash"
    rc, out, err = run_cli(["completion", "bash"])
    assert rc == 0, err
    path.write_text(out)
    return path


def complete(bash_script, *words: str):
    """What bash offers for ``accelstack WORDS...`` (the last word is the one being typed)."""
    line = " ".join(["accelstack", *words])
    array = " ".join(f"'{w}'" for w in ["accelstack", *words])
    code = (f"source '{bash_script}'; COMP_WORDS=({array}); COMP_CWORD={len(words)}; COMP_LINE='{line}'; "
            "_accelstack; printf '%s\\n' \"${COMPREPLY[@]}\"")
    res = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=30, check=True)
    return [w for w in res.stdout.splitlines() if w]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_completes_commands_subcommands_options_and_choices(bash_script):
    assert set(complete(bash_script, "")) >= set(COMMANDS)
    assert complete(bash_script, "ver") == ["verify"]
    assert complete(bash_script, "channel", "") == ["list", "add", "remove"]
    assert complete(bash_script, "install", "--stack", "") == ["ggml", "torch"]
    assert "--dry-run" in complete(bash_script, "install", "--d")
    assert complete(bash_script, "completion", "") == ["bash", "zsh", "fish"]
    assert complete(bash_script, "--json", "cache", "") == ["list", "purge"]
    # global flags complete on every command
    for command in ("detect", "channel list", "manifest keygen"):
        offered = complete(bash_script, *command.split(), "-")
        assert {"--json", "-q", "-v", "--debug"} <= set(offered), command


def test_every_command_and_option_is_in_every_script():
    nodes = tree(build_parser())
    paths = {n.path for n in nodes}
    assert {"install", "channel add", "manifest sign", "cache purge"} <= paths
    for shell in ("zsh", "fish"):
        text = script(shell, build_parser())
        for command in COMMANDS:
            assert command in text, (shell, command)
        flag = "'--dry-run[]'" if shell == "zsh" else "-l dry-run"  # how each shell's script names an option
        assert flag in text, (shell, flag)


@pytest.mark.parametrize("shell, check", [("zsh", ["zsh", "-n"]), ("fish", ["fish", "--no-execute"])])
def test_zsh_and_fish_scripts_parse(shell, check, tmp_path):
    if shutil.which(check[0]) is None:
        pytest.skip(f"{check[0]} is not installed")
    path = tmp_path / f"accelstack.{shell}"
    path.write_text(script(shell, build_parser()))
    res = subprocess.run([*check, str(path)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr


def test_every_command_has_a_description_and_examples():
    parser = build_parser()
    for path, sub in subparsers_of(parser):
        assert sub.description and len(sub.description) > 40, f"`accelstack {path}` has no description"
        assert sub.epilog and "examples:" in sub.epilog and "accelstack " in sub.epilog, \
            f"`accelstack {path} --help` shows no examples"
        assert any(a.option_strings and "--json" in a.option_strings for a in sub._actions), path


def test_the_static_table_says_what_each_command_module_registers():
    """`accelstack --help` is built from cli.COMMAND_TABLE without importing the commands: each
    line must be the help its module registers, under the module the table names."""
    registered = {}
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            registered = {a.dest: a.help for a in action._choices_actions}
    assert [name for name, _, _ in COMMAND_TABLE] == list(registered), "the table lists the commands in another order"
    for name, module, help_line in COMMAND_TABLE:
        assert registered[name] == help_line, f"`{name}`: the table says {help_line!r}, its module {registered[name]!r}"
        only = build_parser(name)  # the command's own module registers it
        assert name in dict(subparsers_of(only)), (name, module)


def test_top_level_help_lists_every_command_without_importing_one():
    code = ("import sys\n"
            "from accelstack.cli import main\n"
            "try:\n"
            "    main(['--help'])\n"
            "except SystemExit as exc:\n"
            "    assert exc.code == 0, exc.code\n"
            "loaded = [m for m in sys.modules if m.startswith('accelstack.commands.')]\n"
            "assert not loaded, loaded\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for name, _, help_line in COMMAND_TABLE:
        assert f"    {name} " in out.stdout, name
        assert help_line.split()[0] in out.stdout, name
    rc, stdout, _ = run_cli(["--help"])
    assert rc == 0 and stdout == out.stdout
