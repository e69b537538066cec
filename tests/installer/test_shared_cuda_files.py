"""Issue 29: the shared CUDA libraries (``<home>/shared/cuda/<sha256>/``) are the runtime's files too.

A CUDA runtime is installed through the real transaction with real ELF libraries served from
127.0.0.1 (the fixtures of test_cuda_libs); then libcudart is deleted, or cuBLAS corrupted in
place with its size and mtime kept. ``status`` must see the first, ``status --deep`` the second,
and ``repair`` must unpack both again (from the download cache) so the worker loads them.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_cuda_libs import CUBLAS, CUDART, Fetcher, install_cuda_runtime, load_in_worker, nvidia_wheels  # noqa: F401

from accelstack.artifacts import Cache, fetch
from accelstack.engine.runtime import Runtime
from accelstack.installer import cuda_libs
from accelstack.installer.home import Home
from accelstack.installer.maintenance import local_status
from accelstack.installer.repair import repair_ggml
from accelstack.verdict import VerifyReport

pytestmark = pytest.mark.usefixtures("nvidia_wheels")


def _ggml(home: Home, deep: bool = False):
    return next(st for st in local_status(home, None, deep=deep) if st.stack == "ggml")


def _lib(home: Home, sha: str, name: str) -> Path:
    hits = list((cuda_libs.shared_root(home) / sha).rglob(name))
    assert len(hits) == 1, hits
    return hits[0]


def _repair(home: Home, rid: str, cache: Path):
    def verifier(staged, progress):
        got = load_in_worker(Runtime(path=staged.path, backend="cuda"))
        ok = got["cublas"] == 101 and got["cudart"] == 13000
        return VerifyReport(ok=ok, reason="" if ok else str(got), runtime=str(staged.path), backend="cuda", check="import")

    with home.lock("repair"):
        return repair_ggml(home, rid, lambda ref: fetch([ref], cache=Cache(cache), offline=False)[ref.sha256], verifier)


def test_a_deleted_libcudart_is_found_by_status_and_restored_by_repair(nvidia_wheels, tmp_path):  # noqa: F811 (the fixture imported above)
    _, refs = nvidia_wheels
    home = Home(tmp_path / "home")
    home.ensure()
    rt, _ = install_cuda_runtime(home, tmp_path, "ggml-cuda-1", list(refs.values()), Fetcher(tmp_path / "cache"))
    before = _ggml(home)
    assert before.active == "ggml-cuda-1" and before.healthy, before.problems

    cudart = _lib(home, refs[CUDART].sha256, "libcudart.so.13")
    cudart.unlink()
    st = _ggml(home)
    assert not st.healthy and st.missing_files == 1
    assert any("libcudart.so.13" in p.message and "shared CUDA" in p.message for p in st.problems), st.problems

    report = _repair(home, "ggml-cuda-1", tmp_path / "cache")
    assert any(p.endswith("libcudart.so.13") for p in report.missing) and not report.unrepairable
    assert any(p.endswith("libcudart.so.13") for p in report.fixed), report
    assert report.verification is not None and report.verification.ok, report.verification
    assert cudart.is_file()
    assert _ggml(home).healthy and _ggml(home, deep=True).healthy
    got = load_in_worker(Runtime(path=rt, backend="cuda"))
    assert got["cudart"] == 13000


def test_a_same_size_corruption_with_its_mtime_kept_is_found_by_deep_status_and_repaired(nvidia_wheels, tmp_path):  # noqa: F811 (the fixture imported above)
    _, refs = nvidia_wheels
    home = Home(tmp_path / "home")
    home.ensure()
    install_cuda_runtime(home, tmp_path, "ggml-cuda-1", list(refs.values()), Fetcher(tmp_path / "cache"))
    cublas = _lib(home, refs[CUBLAS].sha256, "libcublas.so.13")
    original = cublas.read_bytes()
    st0 = os.stat(cublas)
    with open(cublas, "r+b") as f:  # in place: the same inode, the same size
        f.seek(len(original) // 2)
        f.write(bytes(b ^ 0xFF for b in original[len(original) // 2: len(original) // 2 + 64]))
    os.utime(cublas, ns=(st0.st_atime_ns, st0.st_mtime_ns))
    assert os.stat(cublas).st_size == st0.st_size and os.stat(cublas).st_ino == st0.st_ino

    deep = _ggml(home, deep=True)
    assert deep.checked == "hashes" and deep.corrupt_files == 1 and not deep.healthy
    assert any("libcublas.so.13" in p.message for p in deep.problems), deep.problems

    report = _repair(home, "ggml-cuda-1", tmp_path / "cache")
    assert any(p.endswith("libcublas.so.13") for p in report.corrupt) and not report.unrepairable
    assert report.verification is not None and report.verification.ok
    assert cublas.read_bytes() == original
    assert _ggml(home).healthy and _ggml(home, deep=True).healthy


def test_a_shared_folder_deleted_whole_is_missing_and_comes_back(nvidia_wheels, tmp_path):  # noqa: F811 (the fixture imported above)
    _, refs = nvidia_wheels
    home = Home(tmp_path / "home")
    home.ensure()
    install_cuda_runtime(home, tmp_path, "ggml-cuda-1", list(refs.values()), Fetcher(tmp_path / "cache"))
    folder = cuda_libs.shared_root(home) / refs[CUDART].sha256
    home.remove_owned(folder)
    st = _ggml(home)
    assert not st.healthy and st.missing_files == 1, st
    report = _repair(home, "ggml-cuda-1", tmp_path / "cache")
    assert not report.unrepairable and report.verification is not None and report.verification.ok
    assert (folder / cuda_libs.CONTENTS).is_file() and _ggml(home, deep=True).healthy
