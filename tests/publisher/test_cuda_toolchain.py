"""CUDA toolchains of a build, without compiling CUDA: NVIDIA's PyPI packages made into a build-only
virtual environment (real pip and venv, wheels laid out like NVIDIA's, an index on loopback), the
system CUDA 12 toolkit found by what ``nvcc --version`` says (fake nvcc scripts) or a clear typed
error, the build environment that hides every other CUDA, and the CMakeCache check that proves it."""
from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import shutil
import stat
import subprocess
import threading
import zipfile
from pathlib import Path
from typing import Dict, Iterator

import pytest

from accelstack.errors import Action
from accelstack.publisher.build import build_ggml
from accelstack.publisher.cuda_isolation import CudaToolchain, check_cuda_compiler, cuda_build_env
from accelstack.publisher.cuda_toolchain import cuda13_toolchain, driver_stub, require_cuda_toolkit
from accelstack.publisher.errors import BuildError, CudaToolkitMissing
from accelstack.publisher.pypi_index import published_url
from accelstack.publisher.variants import CudaToolkit, find_cuda_toolkit, nvcc_version
from accelstack.settings import Settings, cuda_env
from tests.cli_helpers import error_of, run_cli

CC = shutil.which("cc") or shutil.which("c++")


def _nvcc(folder: Path, version: str = "", name: str = "nvcc") -> Path:
    """An executable nvcc that prints what a real one does for ``--version``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    said = f"Cuda compilation tools, release {version}, V{version}.1" if version else "nvcc: something else"
    path.write_text(f"#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\necho '{said}'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _toolkit(root: Path, version: str) -> Path:
    _nvcc(root / "bin", version)
    (root / "include").mkdir(parents=True, exist_ok=True)
    (root / "include" / "cuda_runtime.h").write_text("/* */\n")
    return root


def test_nvcc_version_reads_the_release_line(tmp_path):
    assert nvcc_version(str(_nvcc(tmp_path / "a", "12.8"))) == "12.8"
    assert nvcc_version(str(_nvcc(tmp_path / "b", ""))) is None
    assert nvcc_version(str(tmp_path / "missing")) is None


def test_the_newest_cuda12_toolkit_is_found_by_what_nvcc_says(tmp_path):
    roots = tmp_path / "usr-local"
    _toolkit(roots / "cuda-13.0", "13.0")
    _toolkit(roots / "cuda-12.4", "12.4")
    home = _toolkit(tmp_path / "opt" / "toolkit-12.8", "12.8")  # named nothing like a version
    wrapper = _nvcc(tmp_path / "bin", "12.6")
    env = {"PATH": f"{wrapper.parent}:/usr/bin:/bin", "CUDA_HOME": str(home)}
    kit, others = find_cuda_toolkit(12, env, roots=[roots])
    assert kit is not None and kit.version == "12.8" and kit.source == "CUDA_HOME"
    assert kit.nvcc == str(home / "bin" / "nvcc") and kit.root == str(home.resolve())
    assert any("CUDA 13.0" in line for line in others)
    # a wrapper on PATH outside a toolkit folder is still a toolkit, without a root to point CMake at
    kit, _ = find_cuda_toolkit(12, {"PATH": str(wrapper.parent)}, roots=[])
    assert kit is not None and kit.version == "12.6" and kit.source == "PATH" and kit.root == ""


def test_no_cuda12_toolkit_is_a_typed_error_saying_what_was_found_and_where_to_get_one(tmp_path):
    roots = tmp_path / "usr-local"
    _toolkit(roots / "cuda-13.0", "13.0")
    broken = _nvcc(tmp_path / "bin", "")
    with pytest.raises(CudaToolkitMissing) as caught:
        require_cuda_toolkit(12, {"PATH": str(broken.parent)}, roots=[roots])
    exc = caught.value
    assert isinstance(exc, BuildError) and exc.action is Action.INSTALL_TOOLCHAIN
    assert "needs a CUDA 12 toolkit (nvcc 12.x)" in exc.message
    assert "CUDA 13.0 at" in exc.message and "does not report a version" in exc.message
    assert "developer.nvidia.com" in exc.hint and "CUDA_HOME" in exc.hint and "PyPI has no CUDA 12 nvcc" in exc.hint
    with pytest.raises(CudaToolkitMissing, match="no nvcc in CUDA_HOME, CUDA_PATH, PATH"):
        require_cuda_toolkit(12, {"PATH": str(tmp_path / "empty")}, roots=[])


@pytest.mark.skipif(find_cuda_toolkit(12, cuda_env())[0] is not None, reason="this machine has a CUDA 12 toolkit")
def test_build_cuda12_without_a_cuda12_toolkit_says_so_before_anything_else(tmp_path):
    sdist = tmp_path / "stable_diffusion_cpp_python-0.4.7.tar.gz"
    sdist.write_bytes(b"not read: the toolkit is checked first")
    with pytest.raises(CudaToolkitMissing):  # before the source download: nothing fetched, nothing made
        build_ggml("cuda12", Settings.resolve(build_cache=tmp_path / "cache"))
    assert not (tmp_path / "cache").exists()
    fake13 = _nvcc(tmp_path / "bin13", "13.0")
    rc, out, _err = run_cli(["build", "ggml", "--backend", "cuda12", "--sdist", str(sdist), "--json"],
                            env={"PATH": f"{fake13.parent}:{os.environ['PATH']}", "CUDA_HOME": "", "CUDA_PATH": ""})
    error = error_of(out)
    assert rc == 1 and error["code"] == "cuda-toolkit-missing"
    assert "CUDA 12 toolkit" in error["message"] and "CUDA 13.0" in error["message"]


def _toolchain(own: Path, hidden) -> CudaToolchain:
    kit = CudaToolkit(nvcc=str(_nvcc(own / "bin", "13.0")), root=str(own), version="13.0", source="test")
    return CudaToolchain(kit=kit, cmake_args=[], runtime=[], hidden=[str(h) for h in hidden])


def test_the_build_environment_sees_only_the_toolchains_cuda(tmp_path):
    system = _toolkit(tmp_path / "usr-local" / "cuda-13.0", "13.0")
    wrappers = tmp_path / "usr-local-bin"  # like /usr/local/bin: an nvcc wrapper beside other tools
    _nvcc(wrappers, "13.0")
    cmake = wrappers / "cmake"
    cmake.write_text("#!/bin/sh\necho cmake 3.30\n")
    cmake.chmod(0o755)
    toolchain = _toolchain(tmp_path / "venv" / "nvidia" / "cu13", [system])
    base = {"PATH": f"{wrappers}:{system / 'bin'}:/usr/bin:/bin", "LD_LIBRARY_PATH": f"{system / 'lib64'}:/opt/other",
            "CUDA_HOME": str(system), "CUDA_PATH": str(system), "CUDACXX": str(system / "bin" / "nvcc"),
            "CUDA_PATH_V13_0": str(system), "HOME": "/root"}
    env = cuda_build_env(base, toolchain)
    assert env["CUDACXX"] == toolchain.kit.nvcc and env["CUDA_HOME"] == toolchain.kit.root
    assert "CUDA_PATH" not in env and "CUDA_PATH_V13_0" not in env
    assert env["LD_LIBRARY_PATH"] == "/opt/other" and env["HOME"] == "/root"
    assert str(wrappers) not in env["PATH"].split(os.pathsep) and str(system / "bin") not in env["PATH"]
    seen = subprocess.run(["sh", "-c", "command -v nvcc; command -v cmake; cmake"], env=env, capture_output=True,
                          text=True, check=True).stdout.split()
    assert seen[0] == toolchain.kit.nvcc
    assert Path(seen[1]).resolve() == cmake.resolve() and seen[2:] == ["cmake", "3.30"]  # kept through a link


def _cmake_cache(path: Path, values: Dict[str, str]) -> Path:
    path.write_text("# This is the CMakeCache file.\n" + "".join(f"{k}:FILEPATH={v}\n" for k, v in values.items()))
    return path


def test_the_cmake_cache_proves_which_cuda_compiled_the_build(tmp_path):
    system = _toolkit(tmp_path / "usr-local" / "cuda-13.0", "13.0")
    own = tmp_path / "venv" / "nvidia" / "cu13"
    toolchain = _toolchain(own, [system])
    good = {"CMAKE_CUDA_COMPILER": toolchain.kit.nvcc, "CUDA_cudart_LIBRARY": f"{own}/lib/libcudart.so",
            "CUDA_cublas_LIBRARY": f"{own}/lib/libcublas.so", "CUDA_nvml_LIBRARY": "CUDA_nvml_LIBRARY-NOTFOUND",
            "CMAKE_IGNORE_PREFIX_PATH": str(system)}
    used = check_cuda_compiler(_cmake_cache(tmp_path / "good.txt", good), toolchain)
    assert used["cmake_cuda_compiler"] == toolchain.kit.nvcc
    assert set(used["cmake_cuda_libraries"]) == {"CUDA_cudart_LIBRARY", "CUDA_cublas_LIBRARY"}
    wrong = {**good, "CMAKE_CUDA_COMPILER": str(system / "bin" / "nvcc")}
    with pytest.raises(BuildError, match="not with"):
        check_cuda_compiler(_cmake_cache(tmp_path / "wrong.txt", wrong), toolchain)
    stray = {**good, "CUDA_cublas_LIBRARY": f"{system}/lib64/libcublas.so"}
    with pytest.raises(BuildError, match="reached another toolkit"):
        check_cuda_compiler(_cmake_cache(tmp_path / "stray.txt", stray), toolchain)
    # the command lines too: a flag into the other toolkit in build.ninja is caught
    (tmp_path / "build.ninja").write_text(f"build a.o: CUDA_COMPILER a.cu\n  FLAGS = -I{own}/include\n")
    check_cuda_compiler(_cmake_cache(tmp_path / "CMakeCache.txt", good), toolchain)
    (tmp_path / "build.ninja").write_text(f"build a.o: CUDA_COMPILER a.cu\n  FLAGS = -I{system}/include\n")
    with pytest.raises(BuildError, match="build.ninja names"):
        check_cuda_compiler(tmp_path / "CMakeCache.txt", toolchain)
    with pytest.raises(BuildError, match="no CMake cache"):
        check_cuda_compiler(tmp_path / "none.txt", toolchain)


CUDA_H = b"""#ifndef FAKE_CUDA_H
#define FAKE_CUDA_H
#define CUDAAPI
typedef int CUresult;
typedef int CUdevice;
#define cuMemAlloc cuMemAlloc_v2
#define cuCtxCreate cuCtxCreate_v4
CUresult CUDAAPI cuInit(unsigned int Flags);
CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal);
CUresult CUDAAPI cuMemAlloc(unsigned long long *dptr, unsigned long bytesize);
CUresult CUDAAPI cuCtxCreate(void *ctx, void *params, unsigned int flags, CUdevice dev);
#endif
"""


@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_the_driver_stub_exports_the_headers_functions_under_their_real_names(tmp_path):
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "cuda.h").write_bytes(CUDA_H)
    names = driver_stub(tmp_path / "include" / "cuda.h", tmp_path / "lib" / "stubs" / "libcuda.so")
    assert names == ["cuCtxCreate_v4", "cuDeviceGet", "cuInit", "cuMemAlloc_v2"]
    exported = subprocess.run(["nm", "-D", "--defined-only", str(tmp_path / "lib" / "stubs" / "libcuda.so")],
                              capture_output=True, text=True, check=True).stdout
    assert all(f" T {n}" in exported for n in names)
    soname = subprocess.run(["readelf", "-d", str(tmp_path / "lib" / "stubs" / "libcuda.so")], capture_output=True,
                            text=True, check=True).stdout
    assert "[libcuda.so.1]" in soname


# -- a package index on loopback ---------------------------------------------------------------------

class _Index(http.server.BaseHTTPRequestHandler):
    pages: Dict[str, bytes] = {}
    kinds: Dict[str, str] = {}

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = self.pages.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Type", self.kinds.get(self.path, "text/html"))
        self.end_headers()
        self.wfile.write(body or b"not found")

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def index() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Index.pages, _Index.kinds = {}, {}
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()


def _publish_json(package: str, files: Dict[str, str]) -> None:
    doc = {"meta": {"api-version": "1.1"}, "name": package,
           "files": [{"filename": n, "url": f"https://files.example.org/packages/ab/{n}", "hashes": {"sha256": sha}}
                     for n, sha in files.items()]}
    _Index.pages[f"/simple/{package}/"] = json.dumps(doc).encode()
    _Index.kinds[f"/simple/{package}/"] = "application/vnd.pypi.simple.v1+json"


def test_the_published_url_is_the_indexs_own_for_that_very_file(index):
    sha = "a" * 64
    _publish_json("nvidia-cublas", {"nvidia_cublas-13.0.2.14-py3-none-any.whl": sha, "other.whl": "b" * 64})
    assert published_url("nvidia_cublas", "nvidia_cublas-13.0.2.14-py3-none-any.whl", sha, index) == \
        "https://files.example.org/packages/ab/nvidia_cublas-13.0.2.14-py3-none-any.whl"
    with pytest.raises(BuildError, match="another file than the index|but the file pip downloaded has"):
        published_url("nvidia-cublas", "nvidia_cublas-13.0.2.14-py3-none-any.whl", "c" * 64, index)
    with pytest.raises(BuildError, match="does not list"):
        published_url("nvidia-cublas", "nvidia_cublas-9.whl", sha, index)
    with pytest.raises(BuildError, match="cannot read"):
        published_url("nvidia-missing", "x.whl", sha, index)
    # a PEP 503 HTML page: relative links with the digest in the fragment
    _Index.pages["/simple/nvidia-cuda-runtime/"] = (
        f'<a href="../../files/nvidia_cuda_runtime-13.0.96-py3-none-any.whl#sha256={sha}">x</a>').encode()
    assert published_url("nvidia-cuda-runtime", "nvidia_cuda_runtime-13.0.96-py3-none-any.whl", sha, index) == \
        index.rsplit("/simple", 1)[0] + "/files/nvidia_cuda_runtime-13.0.96-py3-none-any.whl"


# -- the PyPI toolchain, end to end with wheels laid out like NVIDIA's ------------------------------

def _wheel(folder: Path, dist: str, version: str, files: Dict[str, bytes], executables=()) -> Path:
    """A wheel as NVIDIA lays theirs out (``nvidia/cu13/...``), installable by pip."""
    folder.mkdir(parents=True, exist_ok=True)
    info = f"{dist}-{version}.dist-info"
    meta = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: {version}\n".encode(),
            f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
            f"{info}/top_level.txt": b"nvidia\n"}
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    rows = []
    with zipfile.ZipFile(path, "w") as z:
        for name, data in {**files, **meta}.items():
            entry = zipfile.ZipInfo(name, date_time=(2025, 1, 1, 0, 0, 0))
            entry.external_attr = (stat.S_IFREG | (0o755 if name in executables else 0o644)) << 16
            z.writestr(entry, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{name},sha256={digest},{len(data)}")
        z.writestr(f"{info}/RECORD", "\n".join(rows + [f"{info}/RECORD,,"]) + "\n")
    return path


PINS = {"nvidia-cuda-nvcc": "13.0.88", "nvidia-cuda-runtime": "13.0.96", "nvidia-cublas": "13.0.2.14"}


@pytest.mark.skipif(CC is None, reason="no C compiler (the driver stub is compiled)")
def test_the_pypi_toolchain_becomes_a_toolkit_in_a_build_only_venv(tmp_path, index, monkeypatch):
    wheels = tmp_path / "find-links"
    nvcc = b"#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n"
    made = [
        _wheel(wheels, "nvidia_cuda_nvcc", "13.0.88", {"nvidia/cu13/bin/nvcc": nvcc, "nvidia/cu13/bin/ptxas": nvcc},
               executables=("nvidia/cu13/bin/nvcc", "nvidia/cu13/bin/ptxas")),
        _wheel(wheels, "nvidia_cuda_runtime", "13.0.96", {"nvidia/cu13/include/cuda.h": CUDA_H,
                                                           "nvidia/cu13/lib/libcudart.so.13": b"cudart"}),
        _wheel(wheels, "nvidia_cublas", "13.0.2.14", {"nvidia/cu13/lib/libcublas.so.13": b"cublas",
                                                      "nvidia/cu13/lib/libcublasLt.so.13": b"cublasLt"}),
    ]
    for w in made:  # the index publishes exactly these files
        _publish_json(w.name.split("-")[0].replace("_", "-"), {w.name: hashlib.sha256(w.read_bytes()).hexdigest()})
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    cache = tmp_path / "cache"
    toolchain = cuda13_toolchain(Settings.resolve(build_cache=cache, index_url=index), packages=PINS)

    root = Path(toolchain.kit.root)
    venv = next(p for p in root.parents if p.name == "venv")
    assert venv.parent.parent == cache / "toolchains" and venv.parent.name.startswith("cuda-13.0-")
    assert (venv / "pyvenv.cfg").is_file()  # a virtual environment of its own, not this interpreter's
    assert toolchain.kit.nvcc == str(root / "bin" / "nvcc") and toolchain.kit.version == "13.0"
    assert (root / "lib64").resolve() == (root / "lib").resolve()  # where nvcc.profile links from
    assert os.readlink(root / "lib" / "libcudart.so") == "libcudart.so.13"
    assert os.readlink(root / "lib" / "libcublasLt.so") == "libcublasLt.so.13"
    exported = subprocess.run(["nm", "-D", "--defined-only", str(root / "lib" / "stubs" / "libcuda.so")],
                              capture_output=True, text=True, check=True).stdout
    assert " T cuMemAlloc_v2" in exported
    assert f"-DCMAKE_CUDA_COMPILER={toolchain.kit.nvcc}" in toolchain.cmake_args
    assert f"-DCUDAToolkit_ROOT={root}" in toolchain.cmake_args
    # the runtime wheels: the downloaded files' own digests and sizes, the index's URLs for them
    by_name = {w.name: w for w in made}
    assert [r["name"].split("-")[0] for r in toolchain.runtime] == ["nvidia_cuda_runtime", "nvidia_cublas"]
    for record in toolchain.runtime:
        wheel = by_name[record["name"]]
        assert record["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
        assert record["size"] == wheel.stat().st_size
        assert record["url"] == f"https://files.example.org/packages/ab/{wheel.name}"
    assert toolchain.describe()["packages"] == PINS

    # made once: a second call needs neither pip nor the index
    shutil.rmtree(wheels)
    _Index.pages.clear()
    again = cuda13_toolchain(Settings.resolve(build_cache=cache, index_url=index), packages=PINS)
    assert again.kit == toolchain.kit and again.runtime == toolchain.runtime
