"""accelstack.fsio: the one atomic write, its staging folder and its tree removal.

What every caller relies on: a reader sees the old file or the new one, never a mix, whatever
happens to the writer (an exception, SIGKILL); only the writer's own temporary file is removed;
links are replaced or removed, never followed.
"""
from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from accelstack import fsio
from accelstack.core import caches

POSIX = os.name == "posix"


def _temps(folder: Path) -> list:
    return sorted(p.name for p in folder.iterdir() if fsio.TEMP_NAME.match(p.name))


def test_write_bytes_replaces_the_file_whole_and_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "state.json"
    target.write_bytes(b"old content, longer than the new one")
    assert fsio.write_bytes(target, b"new") == target
    assert target.read_bytes() == b"new"
    assert fsio.write_text(target, "text\n") == target and target.read_bytes() == b"text\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]
    if POSIX:
        assert stat.S_IMODE(target.stat().st_mode) == 0o644
        fsio.write_bytes(target, b"secret", mode=0o600)
        assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_make_parents_and_try_write_bytes(tmp_path):
    assert fsio.write_bytes(tmp_path / "a" / "b" / "f", b"x", make_parents=True).read_bytes() == b"x"
    with pytest.raises(FileNotFoundError):
        fsio.write_bytes(tmp_path / "missing" / "f", b"x")
    assert fsio.try_write_bytes(tmp_path / "c" / "f", b"y") is True and (tmp_path / "c" / "f").read_bytes() == b"y"
    (tmp_path / "file").write_bytes(b"")
    assert fsio.try_write_bytes(tmp_path / "file" / "f", b"y") is False  # a file where its folder would be


def test_a_failure_inside_replacing_leaves_the_target_and_removes_only_its_own_temporary_file(tmp_path):
    target = tmp_path / "receipt.json"
    target.write_bytes(b"old")
    other = tmp_path / f".receipt.json.{os.getpid() + 1}.deadbeef.tmp"  # another writer's, still going
    other.write_bytes(b"theirs")
    seen = []
    with pytest.raises(RuntimeError, match="disk on fire"):
        with fsio.replacing(target) as fh:
            fh.write(b"half of the new")
            seen = _temps(tmp_path)
            raise RuntimeError("disk on fire")
    assert target.read_bytes() == b"old" and other.read_bytes() == b"theirs"
    assert len(seen) == 2 and _temps(tmp_path) == [other.name]


def test_temporary_names_are_what_cache_list_recognizes(tmp_path):
    target = tmp_path / "pools-f1-s2-abc.bin"
    with fsio.replacing(target) as fh:
        [name] = _temps(tmp_path)
        if POSIX:
            assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600  # private while it is written
        fh.write(b"x")
    match = fsio.TEMP_NAME.match(name)
    assert match and match["name"] == target.name and match["pid"] == str(os.getpid())
    assert caches._UNFINISHED.match(name)
    assert re.fullmatch(r"[0-9a-f]{8}", name.split(".")[-2]), name  # 8 random hex digits


@pytest.mark.skipif(not POSIX, reason="symlinks need privileges on Windows")
def test_a_link_at_the_target_is_replaced_itself_never_written_through(tmp_path):
    assert fsio._NEW_FILE & os.O_NOFOLLOW and fsio._NEW_FILE & os.O_EXCL  # the temporary file is never a link's
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"not ours")
    target = tmp_path / "active.json"
    target.symlink_to(elsewhere)
    fsio.write_bytes(target, b"ours")
    assert not target.is_symlink() and target.read_bytes() == b"ours"
    assert elsewhere.read_bytes() == b"not ours"


def test_staging_dir_is_removed_on_error_and_keeps_what_was_renamed_out(tmp_path):
    final = tmp_path / "done.txt"
    with pytest.raises(ValueError):
        with fsio.staging_dir(tmp_path, prefix=".stage-") as stage:
            if POSIX:
                assert stat.S_IMODE(stage.stat().st_mode) == 0o700
            assert stage.parent == tmp_path and stage.name.startswith(".stage-")
            (stage / "sub").mkdir()
            (stage / "sub" / "f").write_bytes(b"partial")
            (stage / "kept.txt").write_bytes(b"finished")
            os.replace(stage / "kept.txt", final)
            raise ValueError("build failed")
    assert not stage.exists() and final.read_bytes() == b"finished"
    with fsio.staging_dir(tmp_path / "new" / "parent") as plain:
        (plain / "f").write_bytes(b"x")
    assert not plain.exists()
    with fsio.staging_dir(tmp_path, keep=True) as kept:
        (kept / "f").write_bytes(b"x")
    assert (kept / "f").read_bytes() == b"x"
    with fsio.staging_dir(tmp_path, prefix=".s-") as a, fsio.staging_dir(tmp_path, prefix=".s-") as b:
        assert a != b


@pytest.mark.skipif(not POSIX, reason="symlinks need privileges on Windows")
def test_remove_own_tree_removes_links_never_what_they_point_to(tmp_path):
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "deep" / "precious").write_bytes(b"keep me")
    (outside / "file").write_bytes(b"keep me too")
    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "b" / "f").write_bytes(b"x")
    (tree / "a" / "to-folder").symlink_to(outside)
    (tree / "a" / "b" / "to-file").symlink_to(outside / "file")
    (tree / "dangling").symlink_to(tmp_path / "nowhere")
    os.chmod(tree / "a" / "b" / "f", 0o400)
    fsio.remove_own_tree(tree)
    assert not os.path.lexists(tree)
    assert (outside / "deep" / "precious").read_bytes() == b"keep me" and (outside / "file").read_bytes() == b"keep me too"
    link = tmp_path / "link"
    link.symlink_to(outside)
    fsio.remove_own_tree(link)  # a link in the tree's place goes alone
    assert not os.path.lexists(link) and (outside / "deep" / "precious").exists()
    fsio.remove_own_tree(tmp_path / "never-was")  # nothing there: nothing to do


def test_copy_file_streams_a_large_file_and_keeps_its_mode(tmp_path):
    src = tmp_path / "libcublas.so.12"
    data = os.urandom(5 * 1024 * 1024 + 17)
    src.write_bytes(data)
    os.chmod(src, 0o755)
    dest = tmp_path / "runtime" / "lib" / "libcublas.so.12"
    assert fsio.copy_file(src, dest, make_parents=True) == dest
    assert dest.read_bytes() == data
    if POSIX:
        assert stat.S_IMODE(dest.stat().st_mode) == 0o755
        fsio.copy_file(src, dest, mode=0o644, durable=False)
        assert stat.S_IMODE(dest.stat().st_mode) == 0o644
    assert _temps(dest.parent) == []
    with pytest.raises(FileNotFoundError):
        fsio.copy_file(tmp_path / "missing", dest)
    assert dest.read_bytes() == data


CHILD = """
import sys, time
from accelstack import fsio
with fsio.replacing(sys.argv[1]) as fh:
    fh.write(b"new content " * 100000)
    fh.flush()
    sys.stdout.write("writing\\n")
    sys.stdout.flush()
    time.sleep(120)
"""


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="no SIGKILL on this OS")
def test_sigkill_while_replacing_leaves_the_old_content(tmp_path):
    target = tmp_path / "active.json"
    target.write_bytes(b"old content")
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(target)], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"writing\n"
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
    assert target.read_bytes() == b"old content"
    [left] = _temps(tmp_path)  # what `cache list` reports as unfinished, named by the killed writer
    assert fsio.TEMP_NAME.match(left)["pid"] == str(child.pid)
