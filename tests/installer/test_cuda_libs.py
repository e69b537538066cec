"""CUDA runtime libraries shared by every CUDA runtime of a home (accelstack.installer.cuda_libs).

A CUDA build of ggml needs libcudart and cuBLAS; its manifest names NVIDIA's wheels for them
instead of bundling copies. These tests build real shared libraries with the C compiler, pack
them into wheels laid out like NVIDIA's (libraries, headers, a static archive, RECORD), serve
them from 127.0.0.1, install a runtime through the real transaction, and load the libraries in
a real worker-like process. No NVIDIA hardware is needed: the loading is the dynamic loader's.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from accelstack.artifacts import Cache, fetch
from accelstack.engine.errors import RuntimeNotFoundError
from accelstack.engine.runtime import Runtime, runtime_libraries
from accelstack.engine.worker.backend import LIB_DIRS_ENV, PRELOAD_ENV
from accelstack.installer import cuda_libs, transaction
from accelstack.installer.errors import InstallError, StateError
from accelstack.installer.ggml import FetchedWheel, GgmlDirectory
from accelstack.installer.home import Home
from accelstack.installer.maintenance import uninstall
from accelstack.manifests.plan import Plan
from accelstack.refs import ArtifactRef
from accelstack.verdict import VerifyReport

from installer_helpers import Server, write_wheel

pytestmark = pytest.mark.skipif(sys.platform != "linux" or shutil.which("cc") is None,
                                reason="builds ELF shared libraries with the system C compiler")

CUDART = "nvidia_cuda_runtime-13.0.96-py3-none-manylinux_2_27_x86_64.whl"
CUBLAS = "nvidia_cublas-13.1.0.3-py3-none-manylinux_2_27_x86_64.whl"



def make_wheel(dest: Path, name: str, files: Dict[str, bytes]) -> Path:
    """A wheel with ``files`` plus its dist-info (METADATA, WHEEL, a correct RECORD)."""
    dist, version = name.split("-")[:2]
    info = f"{dist}-{version}.dist-info"
    files = {**files, f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    return write_wheel(dest / name, files, zipfile.ZIP_DEFLATED)


def build_library(tmp: Path, soname: str, symbol: str, value: int, needs: List[str] = ()) -> bytes:
    """A real ELF shared library exporting ``int symbol(void)``; ``needs``: libraries it links by name."""
    src = tmp / f"{symbol}.c"
    decls = "".join(f"int {n}(void);\n" for n in needs)
    body = " + ".join([str(value)] + [f"{n}()" for n in needs])
    src.write_text(f"{decls}int {symbol}(void) {{ return {body}; }}\n")
    out = tmp / soname
    libs = [f"-l:{dep}" for dep in {f"lib{n.split('_')[0]}.so.13" for n in needs}]
    subprocess.run(["cc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(out), str(src), f"-L{tmp}", *libs],
                   check=True, capture_output=True)
    return out.read_bytes()


@pytest.fixture(scope="module")
def nvidia_wheels(tmp_path_factory) -> Tuple[Path, Dict[str, ArtifactRef]]:
    """cudart and cuBLAS wheels as NVIDIA lays them out, served from a loopback HTTP server."""
    tmp = tmp_path_factory.mktemp("nvidia")
    lib = tmp / "lib"
    lib.mkdir()
    cudart = build_library(lib, "libcudart.so.13", "cudart_version", 13000)
    lt = build_library(lib, "libcublasLt.so.13", "cublasLt_version", 1)
    cublas = build_library(lib, "libcublas.so.13", "cublas_version", 100, needs=["cublasLt_version"])
    site = tmp / "site"
    site.mkdir()
    make_wheel(site, CUDART, {"nvidia/__init__.py": b"", "nvidia/cuda_runtime/lib/libcudart.so.13": cudart,
                              "nvidia/cuda_runtime/include/cuda_runtime_api.h": b"/* header */\n" * 1000})
    make_wheel(site, CUBLAS, {"nvidia/cublas/lib/libcublas.so.13": cublas, "nvidia/cublas/lib/libcublasLt.so.13": lt,
                              "nvidia/cublas/lib/libcublas_static.a": b"\0" * 300_000})
    server = Server(site)
    refs = {}
    for name in (CUDART, CUBLAS):
        data = (site / name).read_bytes()
        refs[name] = ArtifactRef(name=name, sha256=hashlib.sha256(data).hexdigest(), size=len(data),
                                 urls=[f"{server.url}/{name}"])
    yield site, refs
    server.close()


def runtime_wheel(dest: Path) -> Path:
    """A stand-in ggml runtime wheel: the stable_diffusion_cpp package the engine looks for."""
    dest.mkdir(parents=True, exist_ok=True)
    return make_wheel(dest, "stable_diffusion_cpp_python-0.4.7-py3-none-any.whl",
                      {"stable_diffusion_cpp/__init__.py": b"VERSION = 'test'\n",
                       # like the real bindings: the native library needs cuBLAS by name at import
                       "stable_diffusion_cpp/stable_diffusion_cpp.py":
                           b"import ctypes\n_lib = ctypes.CDLL('libcublas.so.13')\n"
                           b"def sd_get_system_info():\n    return b'cuBLAS stub %d' % _lib.cublas_version()\n"})


class Fetcher:
    """The artifact cache's fetch, counting what it was asked for."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache
        self.asked: List[str] = []

    def __call__(self, refs):
        self.asked += [r.name for r in refs]
        return fetch(list(refs), cache=Cache(self.cache), offline=False)


LOAD = """
import ctypes, json, os, sys
from accelstack.engine.worker.backend import libraries_in, load_runtime_libraries
loaded = load_runtime_libraries(*libraries_in(os.environ))
cublas = ctypes.CDLL("libcublas.so.13")   # found by name: already loaded, or on the library path
cudart = ctypes.CDLL("libcudart.so.13")
print(json.dumps({"loaded": loaded, "cublas": cublas.cublas_version(), "cudart": cudart.cudart_version()}))
"""


def load_in_worker(runtime: Runtime) -> dict:
    env = runtime.worker_env()
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(Path(__file__).resolve().parents[2])])
    res = subprocess.run([sys.executable, "-c", LOAD], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def install_cuda_runtime(home: Home, tmp_path: Path, rid: str, refs: List[ArtifactRef], fetcher: Fetcher,
                         torch_sites=()) -> Tuple[Path, transaction.InstallOutcome]:
    wheel = runtime_wheel(tmp_path / f"wheel-{rid}")
    plan = Plan(stack="ggml", summary="test", backend="cuda", variant="cuda-linux-x86_64")
    dest = GgmlDirectory(home, rid, cuda_libs=refs, fetch=fetcher, torch_sites=list(torch_sites))
    seen: List[dict] = []

    def verifier(staged, progress):  # the staged runtime already finds and loads its libraries
        seen.append(load_in_worker(Runtime(path=staged.path, backend="cuda")))
        return VerifyReport(ok=True, reason="", runtime=str(staged.path), backend="cuda", check="import")

    with home.lock("install"):
        outcome = transaction.install(plan, FetchedWheel(wheel, wheel.name), dest, verifier, home=home, runtime_id=rid)
    assert seen and seen[0]["cublas"] == 101 and seen[0]["cudart"] == 13000
    return home.runtimes("ggml") / rid, outcome


def test_installed_runtime_loads_shared_libraries_fetched_once(nvidia_wheels, tmp_path):
    site, refs = nvidia_wheels
    home = Home(tmp_path / "home")
    home.ensure()
    fetcher = Fetcher(tmp_path / "cache")
    rt1, _ = install_cuda_runtime(home, tmp_path, "ggml-cuda-1", list(refs.values()), fetcher)
    assert sorted(fetcher.asked) == sorted(refs)

    shared = cuda_libs.shared_root(home)
    kept = sorted(str(p.relative_to(shared)) for p in shared.rglob("*") if p.is_file())
    assert not any(k.endswith((".h", ".a")) for k in kept), kept  # headers and static archives stay out
    assert any(k.endswith("libcublasLt.so.13") for k in kept)

    # the worker, started on the active runtime: cudart first, then cuBLASLt before cuBLAS
    got = load_in_worker(Runtime(path=rt1, backend="cuda"))
    assert [Path(p).name for p in got["loaded"]] == ["libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13"]
    env = Runtime(path=rt1, backend="cuda").worker_env({})
    assert env[LIB_DIRS_ENV].split(os.pathsep)[0] in env["LD_LIBRARY_PATH"] and env[PRELOAD_ENV]

    # a second runtime (an upgrade) reuses the shared copy: nothing fetched, nothing unpacked
    before = {p: p.stat().st_mtime_ns for p in shared.rglob("*") if p.is_file()}
    rt2, _ = install_cuda_runtime(home, tmp_path, "ggml-cuda-2", list(refs.values()), fetcher)
    assert sorted(fetcher.asked) == sorted(refs)
    assert {p: p.stat().st_mtime_ns for p in shared.rglob("*") if p.is_file()} == before

    # the receipts name the shared wheels: gc's reference count
    receipt = json.loads((home.receipts / "ggml-cuda-2.json").read_text())
    assert {a["name"] for a in receipt["artifacts"]} >= set(refs)


def test_the_install_time_import_check_finds_the_libraries(nvidia_wheels, tmp_path):
    """The cheap check install can run instead of a generation loads cudart/cuBLAS as the worker does."""
    from accelstack.core.verifiers import import_verifier

    _, refs = nvidia_wheels
    home = Home(tmp_path / "home")
    home.ensure()
    wheel = runtime_wheel(tmp_path / "wheel")
    plan = Plan(stack="ggml", summary="test", backend="cuda", variant="cuda-linux-x86_64")
    dest = GgmlDirectory(home, "ggml-cuda-1", cuda_libs=list(refs.values()), fetch=Fetcher(tmp_path / "cache"))
    with home.lock("install"):
        outcome = transaction.install(plan, FetchedWheel(wheel, wheel.name), dest, import_verifier(), home=home,
                                      runtime_id="ggml-cuda-1")
    assert outcome.receipt.verification.ok, outcome.receipt.verification.reason


def test_a_moved_home_keeps_its_libraries(nvidia_wheels, tmp_path):
    _, refs = nvidia_wheels
    home = Home(tmp_path / "home")
    home.ensure()
    install_cuda_runtime(home, tmp_path, "ggml-cuda-1", list(refs.values()), Fetcher(tmp_path / "cache"))
    moved = tmp_path / "elsewhere"
    os.rename(home.root, moved)
    got = load_in_worker(Runtime(path=Home(moved).runtimes("ggml") / "ggml-cuda-1", backend="cuda"))
    assert all(str(moved) in p for p in got["loaded"])


def test_torch_environment_copy_is_reused(nvidia_wheels, tmp_path):
    site, refs = nvidia_wheels
    torch_site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    torch_site.mkdir(parents=True)
    with zipfile.ZipFile(site / CUDART) as zf:  # pip's layout of the same wheel, a newer patch release
        zf.extractall(torch_site)
    info = torch_site / "nvidia_cuda_runtime-13.0.96.dist-info"
    info.rename(torch_site / "nvidia_cuda_runtime-13.0.99.dist-info")
    home = Home(tmp_path / "home")
    home.ensure()
    fetcher = Fetcher(tmp_path / "cache")
    rt, _ = install_cuda_runtime(home, tmp_path, "ggml-cuda-1", list(refs.values()), fetcher, torch_sites=[torch_site])
    assert fetcher.asked == [CUBLAS]  # cudart came from the torch environment
    got = load_in_worker(Runtime(path=rt, backend="cuda"))
    assert got["loaded"][0].startswith(str(torch_site.resolve()))

    # an older minor than the build needs is not good enough
    (torch_site / "nvidia_cuda_runtime-13.0.99.dist-info").rename(torch_site / "nvidia_cuda_runtime-13.0.10.dist-info")
    assert cuda_libs.find_in_site(torch_site, cuda_libs.parse_wheel_name(CUDART), ["libcudart.so.13"]) is None


def test_unreferenced_shared_libraries_go_with_their_last_runtime(nvidia_wheels, tmp_path):
    _, refs = nvidia_wheels
    home = Home(tmp_path / "home")
    home.ensure()
    fetcher = Fetcher(tmp_path / "cache")
    install_cuda_runtime(home, tmp_path, "ggml-cuda-1", list(refs.values()), fetcher)
    shared = cuda_libs.shared_root(home)
    foreign = shared / "not-ours"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("someone else's")
    assert len(home.owned_children(shared)) == 2

    (home.receipts / "broken.json").write_text("{not json")  # an unreadable receipt might name any of them
    assert cuda_libs.remove_unreferenced(home) == []
    (home.receipts / "broken.json").unlink()

    with home.lock("uninstall"):
        uninstall(home, "ggml")
    assert home.owned_children(shared) == []
    assert (foreign / "keep.txt").read_text() == "someone else's"


def test_shared_folder_through_a_link_is_refused(nvidia_wheels, tmp_path):
    _, refs = nvidia_wheels
    home = Home(tmp_path / "home")
    home.ensure()
    outside = tmp_path / "outside"
    outside.mkdir()
    (home.root / "shared").symlink_to(outside, target_is_directory=True)
    with pytest.raises(StateError, match="not a plain directory"):
        install_cuda_runtime(home, tmp_path, "ggml-cuda-1", list(refs.values()), Fetcher(tmp_path / "cache"))
    assert list(outside.iterdir()) == []
    assert cuda_libs.remove_unreferenced(home) == []


def test_hostile_library_wheels_are_refused(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    evil = make_wheel(bad, CUDART, {"../../evil.so": b"x"})
    with pytest.raises(InstallError, match="not a valid wheel"):
        cuda_libs.extract_wheel_files(evil, tmp_path / "out", CUDART, cuda_libs._wanted)
    assert not (tmp_path / "evil.so").exists()
    lying = tmp_path / "lying"
    lying.mkdir()
    good = make_wheel(lying, CUBLAS, {"nvidia/cublas/lib/libcublas.so.13": b"real"})
    with zipfile.ZipFile(good, "a") as zf:  # a member RECORD does not vouch for
        zf.writestr("nvidia/cublas/lib/libcublasLt.so.13", b"smuggled")
    with pytest.raises(InstallError):
        cuda_libs.extract_wheel_files(good, tmp_path / "out2", CUBLAS, cuda_libs._wanted)
    with pytest.raises(InstallError, match="not a wheel file name"):
        cuda_libs.parse_wheel_name("libcudart.so.13")


def test_a_damaged_library_note_says_reinstall(tmp_path):
    rt = tmp_path / "rt"
    (rt / "stable_diffusion_cpp").mkdir(parents=True)
    (rt / "stable_diffusion_cpp" / "__init__.py").write_text("")
    note = rt / cuda_libs.LINK_FILE
    cases = ["{not json", json.dumps({"format": 9, "libraries": []}),
             json.dumps({"format": 1, "libraries": [{"dir": "../../etc", "base": "home", "files": []}]}),
             json.dumps({"format": 1, "libraries": [{"dir": "shared/cuda/x", "base": "home", "files": []}]}),
             json.dumps({"format": 1, "libraries": [{"dir": str(tmp_path), "base": "absolute", "files": ["../x.so"]}]})]
    for text in cases:
        note.write_text(text)
        with pytest.raises(RuntimeNotFoundError) as err:
            runtime_libraries(rt)
        assert "install the runtime again" in err.value.hint
        with pytest.raises(RuntimeNotFoundError):
            Runtime(path=rt, backend="cuda").check()
    note.unlink()
    assert runtime_libraries(rt).dirs == []  # no note: no outside libraries (every non-CUDA runtime)


def _manifest(cuda_libs, backend: str = "cuda") -> dict:
    lib = "cd" * 32
    return {
        "format": "accelstack-manifest", "format_version": 1, "source": "test", "version": 3,
        "expires": "2099-01-01T00:00:00Z", "kind": "ggml", "package": "stable-diffusion.cpp",
        "targets": [{"id": "cu", "os": "linux", "arch": "x86_64", "backend": backend, "requires": {"cuda": "13.0"},
                     "artifacts": [{"name": "rt.whl", "sha256": "ab" * 32, "size": 1, "url": "https://a/rt.whl"}],
                     "cuda_libs": [{"name": n, "sha256": lib if i == 0 else ("ef" * 32 if s is None else s), "size": 5,
                                    "url": f"https://a/{n}"} for i, (n, s) in enumerate(cuda_libs)]}],
    }


def test_manifest_cuda_libs_are_checked():
    from accelstack.manifests import load_manifest
    from accelstack.manifests.errors import ManifestFormatError

    def load(doc):
        return load_manifest(json.dumps(doc).encode())

    m = load(_manifest([(CUDART, None), (CUBLAS, None)]))
    assert [r.name for r in m.targets[0].cuda_libs] == [CUDART, CUBLAS]
    assert load(_manifest([])).targets[0].cuda_libs == []
    with pytest.raises(ManifestFormatError, match="only a cuda target"):
        load(_manifest([(CUDART, None)], backend="vulkan"))
    with pytest.raises(ManifestFormatError, match="listed twice"):
        load(_manifest([(CUDART, None), (CUBLAS, "cd" * 32)]))
    with pytest.raises(ManifestFormatError, match="not a wheel"):
        load(_manifest([("libcudart.so.13", None)]))
    with pytest.raises(ManifestFormatError, match="at most"):
        load(_manifest([(f"nvidia_x{i}-1.0-py3-none-any.whl", f"{i:064x}") for i in range(20)]))


@pytest.fixture
def cuda_channel(nvidia_wheels, signing_key, tmp_path):
    """Settings reading a signed manifest with one CUDA target (for sm 9.0 and 12.0, driver CUDA
    13.0) whose cudart/cuBLAS are shared library wheels."""
    from datetime import datetime, timedelta, timezone

    from accelstack.publisher.publish import write_signed_manifest
    from accelstack.settings import Settings

    site, refs = nvidia_wheels
    private_pem, public_b64 = signing_key
    wheel = runtime_wheel(site / "rt")
    data = wheel.read_bytes()
    base = refs[CUDART].urls[0].rsplit("/", 1)[0]
    expires = (datetime.now(timezone.utc) + timedelta(days=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    doc = {"format": "accelstack-manifest", "format_version": 1, "source": "cuda-test", "version": 1, "expires": expires,
           "kind": "ggml", "package": "stable-diffusion.cpp",
           "targets": [{"id": "linux-x86_64-cuda", "os": "linux", "arch": "x86_64", "backend": "cuda",
                        "requires": {"cuda": "13.0", "sm": ["9.0", "12.0"]},
                        "artifacts": [{"name": wheel.name, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                                       "url": f"{base}/rt/{wheel.name}"}],
                        "cuda_libs": [{"name": r.name, "sha256": r.sha256, "size": r.size, "url": r.urls[0]}
                                      for r in refs.values()]}]}
    (site / "cuda").mkdir(exist_ok=True)
    write_signed_manifest(site / "cuda", doc, private_pem)
    return Settings.resolve(home=tmp_path / "home", cache=tmp_path / "cache",
                            manifests=[f"{base}/cuda/ggml-manifest.json"], trusted_keys=[public_b64])


def test_the_plan_of_a_cuda_machine_names_the_shared_library_wheels(nvidia_wheels, cuda_channel):
    """The plan install follows carries the target's cudart/cuBLAS wheels (no second lookup in the manifests)."""
    import accelstack
    from accelstack.core.detection import detect
    from accelstack.hardware.system import ReplaySystem

    _, refs = nvidia_wheels
    report = detect(ReplaySystem(Path(__file__).resolve().parents[1] / "fixtures" / "captures" /
                                 "linux-nvidia-rtx5090-rtx4090-580"), settings=cuda_channel)
    plan = accelstack.plan(report, "ggml", settings=cuda_channel)
    assert plan.backend == "cuda" and plan.variant == "linux-x86_64-cuda", plan.summary
    assert sorted(r.sha256 for r in plan.cuda_libs) == sorted(r.sha256 for r in refs.values())
    from accelstack.core.installing import install

    summary = install(None, stack="ggml", report=report, settings=cuda_channel, dry_run=True)
    assert any("nvidia_cuda_runtime, nvidia_cublas" in w for w in summary.would), summary.would
    assert not cuda_channel.home.exists()  # a dry run writes nothing


def test_an_offline_bundle_of_a_cuda_target_carries_its_library_wheels(nvidia_wheels, cuda_channel, tmp_path):
    import tarfile

    from accelstack.core.bundles import create_bundle

    _, refs = nvidia_wheels
    summary = create_bundle(tmp_path / "cuda.tar", settings=cuda_channel, targets=["linux-x86_64-cuda"])
    with tarfile.open(summary.path) as tar:
        names = set(tar.getnames())
    assert {f"artifacts/{r.sha256}" for r in refs.values()} <= names
