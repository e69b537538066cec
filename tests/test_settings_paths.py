"""Directory settings that name a file are refused when settings resolve, before anything is created (issue 10)."""
from __future__ import annotations

from pathlib import Path

import pytest

from accelstack.cli import main
from accelstack.errors import Action, UsageError
from accelstack.installer.errors import StateError
from accelstack.installer.home import Home
from accelstack.settings import Settings


@pytest.fixture
def a_file(tmp_path) -> Path:
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    return f


def tree(root: Path) -> list:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


@pytest.mark.parametrize("under", [False, True])
def test_a_home_that_is_a_file_is_a_usage_error(tmp_path, a_file, under):
    home = a_file / "sub" if under else a_file
    with pytest.raises(UsageError) as info:
        Settings.resolve(home=home)
    assert str(home) in info.value.message and "is a file, not a directory" in info.value.message
    assert info.value.action is Action.CHOOSE_HOME
    assert ("under" in info.value.message) == under


@pytest.mark.parametrize("variable", ["ACCELSTACK_HOME", "ACCELSTACK_CACHE", "ACCELSTACK_BUILD_CACHE",
                                      "ACCELSTACK_PROBE_CACHE", "ACCELSTACK_CONFIG_DIR"])
def test_every_directory_variable_naming_a_file_is_refused(monkeypatch, a_file, variable):
    monkeypatch.setenv(variable, str(a_file))
    with pytest.raises(UsageError, match=variable):
        Settings.resolve()


def test_new_and_existing_directories_and_foreign_platforms_are_fine(tmp_path, a_file):
    assert Settings.resolve(home=tmp_path / "new" / "home").home == tmp_path / "new" / "home"
    assert Settings.resolve(home=tmp_path).home == tmp_path
    (tmp_path / "link").symlink_to(tmp_path / "new-target-dir", target_is_directory=True)
    (tmp_path / "new-target-dir").mkdir()
    assert Settings.resolve(home=tmp_path / "link").home == tmp_path / "link"
    # Another OS's layout is data, not this machine's files: not checked here.
    Settings.resolve(env={"ACCELSTACK_HOME": str(a_file)}, os_name="windows")
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("argv", [
    ["status"], ["install", "ggml", "--dry-run"], ["uninstall"], ["gc"], ["repair"],
    ["manifest", "verify", str(Path(__file__).resolve().parents[1] / "accelstack" / "manifests" / "data" / "ggml-example.json")],
])
def test_cli_home_that_is_a_file_is_one_clear_error_and_nothing_changes(tmp_path, a_file, capsys, argv):
    before = tree(tmp_path)
    assert main([*argv, "--home", str(a_file)]) == 2
    err = capsys.readouterr().err
    assert "is a file, not a directory" in err and "Traceback" not in err
    assert tree(tmp_path) == before and a_file.read_text() == "mine"


def test_home_ensure_on_a_file_is_a_state_error_before_any_mkdir(tmp_path, a_file):
    with pytest.raises(StateError, match="is a file, not a directory"):
        Home(a_file / "deeper").ensure()
    assert tree(tmp_path) == ["notes.txt"]
