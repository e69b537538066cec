"""Issue 29: a link or a FIFO planted at a PNG's temporary name is never written through nor
waited on: the old fixed names (``verify-cpu.png.part``, ``out.png.part``) mean nothing any more,
and the atomic write's own temporary name is created O_CREAT|O_EXCL|O_NOFOLLOW, so even a guessed
one is skipped, never followed."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from accelstack import fsio
from accelstack.engine.png import read_png, write_png

RGB = bytes(range(48))  # 4x4


def _plant(path: Path, kind: str, victim: Path) -> None:
    if kind == "link":
        path.symlink_to(victim)
    else:
        os.mkfifo(path)


def _write_in_child(out: Path) -> subprocess.CompletedProcess:
    """write_png in a process of its own: a FIFO that were opened would hang it, not the test run."""
    code = ("import sys; from accelstack.engine.png import write_png; "
            "write_png(sys.argv[1], 4, 4, bytes(range(48)), {'parameters': 'p'})")
    return subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("kind", ["link", "fifo"])
@pytest.mark.parametrize("name", ["verify-cpu.png", "out.png"])
def test_a_plant_at_the_old_part_name_is_not_written_through(tmp_path, kind, name):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file")
    out = tmp_path / name
    _plant(tmp_path / (name + ".part"), kind, victim)
    proc = _write_in_child(out)
    assert proc.returncode == 0, proc.stderr
    assert victim.read_text() == "the user's file"
    assert read_png(out).rgb() == RGB
    assert not [p.name for p in tmp_path.iterdir() if fsio.TEMP_NAME.match(p.name)]


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_a_plant_at_a_guessed_temporary_name_is_skipped_never_followed(tmp_path, monkeypatch, kind):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file")
    out = tmp_path / "out.png"
    planted = tmp_path / f".out.png.{os.getpid()}.guessed.tmp"  # the attacker guessed the random part
    _plant(planted, kind, victim)
    names = iter(["guessed", "fresh"])
    monkeypatch.setattr(fsio, "_random", lambda: next(names))
    write_png(out, 4, 4, RGB)
    assert victim.read_text() == "the user's file"
    assert read_png(out).rgb() == RGB
    assert os.path.lexists(planted)  # what had a name is never touched
    assert not (tmp_path / f".out.png.{os.getpid()}.fresh.tmp").exists()


def test_no_fixed_temporary_name_is_left_in_the_engine_or_the_core():
    root = Path(__file__).resolve().parents[1] / "accelstack"
    hits = {p.relative_to(root).as_posix() for sub in ("engine", "core") for p in (root / sub).rglob("*.py")
            if any(s in p.read_text(encoding="utf-8") for s in ('".part"', "'.part'", ".png.part"))}
    # the probe's weights, written inside a new private folder of its own; the download cache's listing
    assert hits <= {"engine/probes/model.py", "core/caches.py"}, hits
