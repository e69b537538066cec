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
    assert complete(bash_script, "completion", "") == ["bash", "zsh", "fish", "powershell"]
    assert complete(bash_script, "--json", "cache", "") == ["list", "purge"]
    # global flags complete on every command
    for command in ("detect", "channel list", "manifest keygen"):
        offered = complete(bash_script, *command.split(), "-")
        assert {"--json", "-q", "-v", "--debug"} <= set(offered), command


def test_every_command_and_option_is_in_every_script():
    nodes = tree(build_parser())
    paths = {n.path for n in nodes}
    assert {"install", "channel add", "manifest sign", "cache purge"} <= paths
    for shell in ("zsh", "fish", "powershell"):
        text = script(shell, build_parser())
        for command in COMMANDS:
            assert command in text, (shell, command)
        flag = {"zsh": "'--dry-run[]'", "fish": "-l dry-run", "powershell": "'--dry-run'"}[shell]  # how each names an option
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


def _ps_tables(text: str):
    """The hashtables of the PowerShell script: name -> {key: [values]} (its single-quoted strings read back)."""
    import re

    def strings(src: str):
        return [m.replace("''", "'") for m in re.findall(r"'((?:[^']|'')*)'", src)]

    tables, name = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*\$(\w+) = @\{$", line)
        if m:
            name, tables[m.group(1)] = m.group(1), []
        elif name and line.strip() == "}":
            name = None
        elif name:
            key, _, rest = line.partition(" = ")
            tables[name].append((strings(key)[0], strings(rest)))
    return tables


def test_powershell_script_registers_a_native_completer_with_every_command_and_option():
    text = script("powershell", build_parser())
    assert text.count("Register-ArgumentCompleter -Native -CommandName accelstack -ScriptBlock {") == 1
    assert text.count("{") == text.count("}") and text.count("(") == text.count(")")
    assert all(line.count("'") % 2 == 0 for line in text.splitlines()), "an unbalanced quote"
    tables = _ps_tables(text)
    assert set(tables) == {"children", "help", "options", "positionals", "choices"}
    for name, rows in tables.items():  # PowerShell's hashtable keys ignore case: a duplicate is a parse error
        keys = [k.lower() for k, _ in rows]
        assert len(keys) == len(set(keys)), name
    options = dict(tables["options"])
    children = dict(tables["children"])
    nodes = tree(build_parser())
    for n in nodes:  # the same parser data as bash, zsh and fish
        assert options[n.path] == n.options, n.path
        if n.children:
            assert children[n.path] == n.children, n.path
    assert set(children[""]) == set(COMMANDS)
    assert dict(tables["choices"])["install|--stack"] == ["ggml", "torch"]
    assert dict(tables["positionals"])["completion"] == ["bash", "zsh", "fish", "powershell"]
    rc, out, err = run_cli(["completion", "powershell"])
    assert rc == 0 and out == text, err


@pytest.mark.skipif(shutil.which("pwsh") is None, reason="pwsh is not installed")
def test_pwsh_loads_the_script_and_completes(tmp_path):
    path = tmp_path / "accelstack.ps1"
    path.write_text(script("powershell", build_parser()))
    code = (f". '{path}'; (TabExpansion2 -inputScript 'accelstack channel ' -cursorColumn 19).CompletionMatches |"
            " ForEach-Object { $_.CompletionText }")
    res = subprocess.run(["pwsh", "-NoProfile", "-NonInteractive", "-Command", code], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["list", "add", "remove"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_family_completes_the_model_families_not_file_names(bash_script, tmp_path):
    """Issue 42, item 12: `verify --family <TAB>` offered the files of the current folder."""
    from accelstack.core.direct import family_names

    assert complete(bash_script, "verify", "--family", "") == list(family_names())
    assert complete(bash_script, "verify", "--family", "fl") == [f for f in family_names() if f.startswith("fl")]
