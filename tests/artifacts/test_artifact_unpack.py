"""Safe extraction: good archives of every format, and hostile ones refused without a trace."""
from __future__ import annotations

import io
import os
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

from accelstack.artifacts import ArchiveFormatError, ArtifactError, UnsafeArchiveError, detect_format, unpack


# -- archive builders ----------------------------------------------------------------------------
def _tar_add(tf: tarfile.TarFile, name: str, data: bytes = b"", *, mode: int = 0o644, type_=tarfile.REGTYPE,
             linkname: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type = type_
    info.mode = mode
    info.linkname = linkname
    info.size = len(data) if type_ == tarfile.REGTYPE else 0
    tf.addfile(info, io.BytesIO(data) if type_ == tarfile.REGTYPE else None)


def make_tar(path: Path, members, compression: str = "") -> Path:
    if compression == "zst":
        import zstandard

        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for m in members:
                _tar_add(tf, *m[:2], **(m[2] if len(m) > 2 else {}))
        path.write_bytes(zstandard.ZstdCompressor().compress(buf.getvalue()))
        return path
    with tarfile.open(path, "w:" + compression if compression else "w") as tf:
        for m in members:
            _tar_add(tf, *m[:2], **(m[2] if len(m) > 2 else {}))
    return path


def make_zip(path: Path, members) -> Path:
    """members: (name, data, unix_mode or None)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data, mode in members:
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED
            if mode is not None:
                info.create_system = 3
                info.external_attr = mode << 16
            zf.writestr(info, data)
    return path


GOOD = [
    ("pkg/", b"", {"type_": tarfile.DIRTYPE, "mode": 0o755}),
    ("pkg/bin/run", b"#!/bin/sh\necho hi\n", {"mode": 0o755}),
    ("pkg/data.txt", b"hello"),
    ("pkg/lib/libx.so.1", b"ELF..."),
    ("pkg/lib/libx.so", b"", {"type_": tarfile.SYMTYPE, "linkname": "libx.so.1"}),
    ("pkg/data-copy.txt", b"", {"type_": tarfile.LNKTYPE, "linkname": "pkg/data.txt"}),
]


def _check_good(root: Path) -> None:
    assert (root / "pkg/data.txt").read_bytes() == b"hello"
    run = root / "pkg/bin/run"
    assert run.read_bytes().startswith(b"#!/bin/sh")
    assert stat.S_IMODE(run.stat().st_mode) == 0o755, "executable bits are kept"
    assert stat.S_IMODE((root / "pkg/data.txt").stat().st_mode) == 0o644
    assert os.readlink(root / "pkg/lib/libx.so") == "libx.so.1"
    assert (root / "pkg/lib/libx.so").read_bytes() == b"ELF..."
    assert (root / "pkg/data-copy.txt").read_bytes() == b"hello"


def _no_leftovers(parent: Path, dest: Path) -> None:
    assert not dest.exists()
    assert [p.name for p in parent.iterdir() if ".staging-" in p.name] == []


# -- good archives -------------------------------------------------------------------------------
@pytest.mark.parametrize("compression,fmt", [("", "tar"), ("gz", "tar.gz"), ("xz", "tar.xz"), ("bz2", "tar.bz2"),
                                             ("zst", "tar.zst")])
def test_tar_formats(tmp_path, compression, fmt):
    archive = make_tar(tmp_path / "a.blob", GOOD, compression)  # no extension, like a cache blob
    assert detect_format(archive) == fmt
    dest = unpack(archive, tmp_path / "out")
    _check_good(dest)
    _no_leftovers(tmp_path, tmp_path / "nothing")


def test_zip(tmp_path):
    archive = make_zip(tmp_path / "a.blob", [
        ("pkg/", b"", 0o40755),
        ("pkg/bin/run", b"#!/bin/sh\necho hi\n", 0o100755),
        ("pkg/data.txt", b"hello", 0o100644),
        ("pkg/plain.txt", b"made on windows", None),
        ("pkg/lib/libx.so.1", b"ELF...", 0o100644),
        ("pkg/lib/libx.so", b"libx.so.1", 0o120777),
    ])
    assert detect_format(archive) == "zip"
    dest = unpack(archive, tmp_path / "out")
    assert stat.S_IMODE((dest / "pkg/bin/run").stat().st_mode) == 0o755
    assert (dest / "pkg/plain.txt").read_bytes() == b"made on windows"
    assert os.readlink(dest / "pkg/lib/libx.so") == "libx.so.1"


def test_refuses_to_extract_over_an_existing_directory(tmp_path):
    archive = make_tar(tmp_path / "a.tar", GOOD)
    live = tmp_path / "live"
    live.mkdir()
    (live / "keep").write_text("x")
    with pytest.raises(ArtifactError, match="already exists"):
        unpack(archive, live)
    assert (live / "keep").read_text() == "x"


def test_replace_swaps_only_when_complete(tmp_path):
    live = tmp_path / "live"
    live.mkdir()
    (live / "old").write_text("x")
    bad = make_tar(tmp_path / "bad.tar", [("ok.txt", b"1"), ("../evil", b"2")])
    with pytest.raises(UnsafeArchiveError):
        unpack(bad, live, replace=True)
    assert (live / "old").read_text() == "x", "a failed extraction leaves the live tree alone"
    good = make_tar(tmp_path / "good.tar", GOOD)
    unpack(good, live, replace=True)
    _check_good(live)
    assert not (live / "old").exists()
    assert [p for p in tmp_path.iterdir() if ".old-" in p.name or ".staging-" in p.name] == []


# -- hostile archives ----------------------------------------------------------------------------
HOSTILE_TAR = {
    "dotdot": [("../evil.txt", b"x")],
    "dotdot-inner": [("a/../../evil.txt", b"x")],
    "absolute": [("/tmp/evil.txt", b"x")],
    "symlink-absolute": [("link", b"", {"type_": tarfile.SYMTYPE, "linkname": "/etc/passwd"})],
    "symlink-escape": [("a/link", b"", {"type_": tarfile.SYMTYPE, "linkname": "../../outside"})],
    "write-through-symlink": [
        ("sub", b"", {"type_": tarfile.SYMTYPE, "linkname": "."}),
        ("dir/", b"", {"type_": tarfile.DIRTYPE}),
        ("dir/link", b"", {"type_": tarfile.SYMTYPE, "linkname": ".."}),
        ("dir/link/x", b"escaped?"),
    ],
    "symlink-chain": [
        ("a/", b"", {"type_": tarfile.DIRTYPE}),
        ("a/up", b"", {"type_": tarfile.SYMTYPE, "linkname": ".."}),
        ("b", b"", {"type_": tarfile.SYMTYPE, "linkname": "a/up/a/up/.."}),
    ],
    "hardlink-outside": [("h", b"", {"type_": tarfile.LNKTYPE, "linkname": "/etc/passwd"})],
    "hardlink-unknown": [("h", b"", {"type_": tarfile.LNKTYPE, "linkname": "never-extracted"})],
    "char-device": [("dev", b"", {"type_": tarfile.CHRTYPE})],
    "block-device": [("blk", b"", {"type_": tarfile.BLKTYPE})],
    "fifo": [("fifo", b"", {"type_": tarfile.FIFOTYPE})],
}


@pytest.mark.parametrize("case", sorted(HOSTILE_TAR))
def test_hostile_tar_is_refused(tmp_path, case):
    archive = make_tar(tmp_path / "evil.tar.gz", [("ok.txt", b"fine")] + HOSTILE_TAR[case], "gz")
    area = tmp_path / "area"
    area.mkdir()
    dest = area / "out"
    with pytest.raises(UnsafeArchiveError):
        unpack(archive, dest)
    _no_leftovers(area, dest)
    assert not (tmp_path / "evil.txt").exists() and not (area / "evil.txt").exists()
    assert not (area / "x").exists()


@pytest.mark.parametrize("name", ["../evil.txt", "/abs/evil.txt", "C:/evil.txt", "a\\..\\..\\evil.txt"])
def test_hostile_zip_names_are_refused(tmp_path, name):
    archive = make_zip(tmp_path / "evil.zip", [("ok.txt", b"x", None), (name, b"x", None)])
    with pytest.raises(UnsafeArchiveError):
        unpack(archive, tmp_path / "out")
    _no_leftovers(tmp_path, tmp_path / "out")


def test_zip_symlink_escape_is_refused(tmp_path):
    archive = make_zip(tmp_path / "evil.zip", [("link", b"../../etc", 0o120777)])
    with pytest.raises(UnsafeArchiveError, match="outside"):
        unpack(archive, tmp_path / "out")
    _no_leftovers(tmp_path, tmp_path / "out")


def test_zip_bomb_total_size_cap(tmp_path):
    archive = make_zip(tmp_path / "bomb.zip", [(f"zeros{i}", b"\0" * 1_000_000, None) for i in range(5)])
    assert archive.stat().st_size < 50_000
    with pytest.raises(UnsafeArchiveError, match="bomb"):
        unpack(archive, tmp_path / "out", max_bytes=3_000_000)
    _no_leftovers(tmp_path, tmp_path / "out")


def test_tar_bomb_total_size_cap_while_streaming(tmp_path):
    archive = make_tar(tmp_path / "bomb.tar.gz", [(f"zeros{i}", b"\0" * 1_000_000) for i in range(5)], "gz")
    with pytest.raises(UnsafeArchiveError, match="bomb"):
        unpack(archive, tmp_path / "out", max_bytes=2_500_000)
    _no_leftovers(tmp_path, tmp_path / "out")


@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_file_count_cap(tmp_path, kind):
    if kind == "tar":
        archive = make_tar(tmp_path / "many.tar", [(f"f{i}", b"") for i in range(50)])
    else:
        archive = make_zip(tmp_path / "many.zip", [(f"f{i}", b"", None) for i in range(50)])
    with pytest.raises(UnsafeArchiveError, match="members"):
        unpack(archive, tmp_path / "out", max_files=20)
    _no_leftovers(tmp_path, tmp_path / "out")


def test_corrupt_and_unknown_archives(tmp_path):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"definitely not an archive" * 40)
    with pytest.raises(ArchiveFormatError):
        unpack(junk, tmp_path / "out")
    good = make_tar(tmp_path / "a.tar.gz", GOOD, "gz").read_bytes()
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(good[: len(good) // 2])
    with pytest.raises(ArchiveFormatError):
        unpack(cut, tmp_path / "out2")
    _no_leftovers(tmp_path, tmp_path / "out2")


def test_zst_without_zstandard_is_a_clear_error(tmp_path, monkeypatch):
    import builtins

    archive = make_tar(tmp_path / "a.tar.zst", GOOD, "zst")
    real_import = builtins.__import__

    def no_zstd(name, *args, **kwargs):
        if name == "zstandard":
            raise ImportError("no zstandard")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_zstd)
    with pytest.raises(ArchiveFormatError, match="install the .zstandard. Python package"):
        unpack(archive, tmp_path / "out")


def test_package_names_are_the_functions_whatever_was_imported_first():
    import importlib

    for module in ("batch", "archive", "download", "partfile", "retry", "extract", "cache", "transport"):
        importlib.import_module(f"accelstack.artifacts.{module}")
    from accelstack.artifacts import fetch as fetch_function
    from accelstack.artifacts import unpack as unpack_function

    assert callable(fetch_function) and callable(unpack_function)
    assert unpack_function is unpack
