"""Issue 25: every output path is checked before any work, as a usage error (exit 2) naming the
path, with one final JSON error line; an OSError writing the image is a typed error, never a traceback."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict

import pytest

from accelstack.engine import png
from accelstack.engine.errors import OutputPathError
from accelstack.engine.generation import check_outputs
from accelstack.errors import AccelstackError

from cli_helpers import error_of, run_cli

NO_PROC = not Path("/proc/self").is_dir()


def _env(tmp_path: Path) -> Dict[str, str]:
    state = tmp_path / "state"
    return {"ACCELSTACK_HOME": str(state / "home"), "ACCELSTACK_CACHE": str(state / "cache"),
            "ACCELSTACK_PROBE_CACHE": str(state / "probe"), "ACCELSTACK_CONFIG": str(state / "config.yaml"),
            "ACCELSTACK_CONFIG_DIR": str(state / "config"), "ACCELSTACK_DEBUG": ""}


def _bad_outputs(tmp_path: Path) -> Dict[str, Path]:
    (tmp_path / "dir.png").mkdir()
    (tmp_path / "file").write_text("x")
    os.mkfifo(tmp_path / "fifo.png")
    (tmp_path / "link.png").symlink_to(tmp_path / "elsewhere.png")
    cases = {"existing folder": tmp_path / "dir.png", "file, not a folder": tmp_path / "file" / "a.png",
             "not a regular file": tmp_path / "fifo.png", "symbolic link": tmp_path / "link.png"}
    if not NO_PROC:  # access() says yes to root there; only a write tells
        cases["/proc/nope does not exist and cannot be made in /proc"] = Path("/proc/nope/v.png")
        cases["the folder /proc cannot be written to"] = Path("/proc/v.png")
    return cases


@pytest.mark.parametrize("runtime", [False, True], ids=["installed", "given"])
def test_verify_refuses_an_output_it_cannot_write_before_any_work(tmp_path, runtime):
    env = _env(tmp_path)
    (tmp_path / "rt").mkdir()
    given = ["--runtime", str(tmp_path / "rt")] if runtime else []
    for words, path in _bad_outputs(tmp_path).items():
        rc, out, err = run_cli(["verify", "-o", path, *given, "--json"], env, timeout=120)
        assert rc == 2, (path, rc, out[-1000:], err[-1000:])
        e = error_of(out)  # one final line, the last one, schema-valid
        assert e["code"] == "output-path" and str(path) in e["message"] and words in e["message"], e
        assert e["hint"], e
        assert "Traceback" not in err
        rc, out, err = run_cli(["verify", "-o", path, *given], env, timeout=120)
        assert rc == 2 and str(path) in err and "what to do:" in err and "Traceback" not in err, err
    assert not (tmp_path / "state" / "probe").exists()  # no probe model was made: no work started


def test_generate_refuses_an_output_it_cannot_write_before_any_work(tmp_path):
    env = _env(tmp_path)
    model = tmp_path / "m.safetensors"
    model.write_bytes(b"\xff" * 64)  # never read: the output is refused first
    for words, path in _bad_outputs(tmp_path).items():
        rc, out, err = run_cli(["generate", "-m", model, "-p", "x", "-o", path, "--json"], env, timeout=120)
        assert rc == 2, (path, rc, out[-1000:], err[-1000:])
        e = error_of(out)
        assert e["code"] == "output-path" and str(path) in e["message"] and words in e["message"], e
        assert "Traceback" not in err


def test_the_write_check_leaves_nothing_behind(tmp_path):
    before = sorted(os.listdir(tmp_path))
    assert check_outputs([tmp_path / "new" / "a.png", tmp_path / "b.png"])
    assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.skipif(NO_PROC, reason="needs /proc")
def test_an_oserror_writing_the_image_is_a_typed_error(tmp_path):
    pixels = bytes(8 * 8 * 3)
    with pytest.raises(AccelstackError) as err:
        png.write_png("/proc/nope/a.png", 8, 8, pixels)
    assert isinstance(err.value, OutputPathError) and err.value.exit_code == 2
    assert "/proc/nope/a.png" in err.value.message and err.value.hint
    (tmp_path / "d.png").mkdir()
    with pytest.raises(OutputPathError):
        png.write_png(tmp_path / "d.png", 8, 8, pixels)
    assert png.read_png(png.write_png(tmp_path / "sub" / "ok.png", 8, 8, pixels)).width == 8
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["ok.png"]  # no temporary left
