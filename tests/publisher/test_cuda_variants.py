"""CUDA variants: what the CMake options compile is what the manifest promises (SASS as ``sm``, PTX
as ``ptx``, the toolkit's version as ``requires.cuda``), a build record's NVIDIA runtime wheels
become the target's ``cuda_libs``, and a CUDA wheel never carries cudart or cuBLAS."""
from __future__ import annotations

import base64
import hashlib
import json
import zipfile
from dataclasses import asdict
from pathlib import Path

import pytest

from accelstack.manifests.ggml_manifest import GgmlTarget
from accelstack.manifests.machine import cuda_kernels_for
from accelstack.manifests.schema import parse_manifest
from accelstack.publisher.build_cache import BuildResult
from accelstack.publisher.errors import PublishError
from accelstack.publisher.publish import build_manifest, target_for
from accelstack.publisher.variants import (
    CUDA12_SM,
    CUDA13_SM,
    CUDA_ARCHS_ENV,
    VARIANTS,
    compiled_cuda_archs,
    configured_cuda_archs,
    cuda_architectures,
    cuda_cmake_args,
    properties_for,
)
from accelstack.publisher.wheel_repack import is_nvidia_runtime, lean_wheel
from accelstack.settings import Settings
from tests.cli_helpers import result_of, run_cli

NAME = "stable_diffusion_cpp_python-0.4.7-py3-none-linux_x86_64.whl"
DIST = "stable_diffusion_cpp_python-0.4.7.dist-info"


def _arch_value(args):
    return next(a.split("=", 1)[1] for a in args if a.startswith("-DCMAKE_CUDA_ARCHITECTURES="))


@pytest.mark.parametrize("variant, sms, version", [("cuda", CUDA13_SM, "13.0"), ("cuda12", CUDA12_SM, "12.8")])
def test_the_properties_are_exactly_what_the_cmake_options_compile(variant, sms, version):
    args = VARIANTS[variant]
    props = properties_for(variant, args, version)
    entries = _arch_value(args).split(";")
    # every architecture is compiled as SASS: none is PTX only (the old 6.1/7.0/7.5 "-virtual" entries
    # were advertised as native)
    assert not [e for e in entries if e.endswith("-virtual")]
    assert [e.split("-")[0] for e in entries] == sms
    # ggml turns 12X into the arch-specific 12Xa; the promise says so too
    expected_sm = [f"{s[:-1]}.{s[-1]}" + ("a" if s.startswith("12") and len(s) == 3 else "") for s in sms]
    assert props["sm"] == expected_sm
    # PTX of the newest portable architecture only, compiled in the same pass as its SASS
    portable = [s for s in sms if not (s.startswith("12") and len(s) == 3)]
    assert props["ptx"] == [f"{portable[-1][:-1]}.{portable[-1][-1]}"]
    assert [e for e in entries if "-" not in e] == [portable[-1]]
    assert props["cuda"] == version and props["backend"] == "cuda"


def test_cuda13_is_turing_and_newer_and_cuda12_reaches_back_to_pascal():
    sm13, ptx13 = compiled_cuda_archs(VARIANTS["cuda"])
    sm12, ptx12 = compiled_cuda_archs(VARIANTS["cuda12"])
    assert sm13[0] == "7.5" and "12.0a" in sm13 and ptx13 == ["10.0"]
    assert sm12[0] == "6.1" and "7.0" in sm12 and ptx12 == ["9.0"]
    # the resolver's reading of the promise: a Pascal card has no kernels in the CUDA 13 build,
    # native ones in the CUDA 12 build; Blackwell 12.1 JIT-compiles the CUDA 13 build's PTX
    assert cuda_kernels_for("6.1", sm13, ptx13) is None
    assert cuda_kernels_for("6.1", sm12, ptx12) == "sm_61"
    assert cuda_kernels_for("7.5", sm13, ptx13) == "sm_75"
    assert cuda_kernels_for("12.0", sm13, ptx13) == "sm_120a"
    assert cuda_kernels_for("12.1", sm13, ptx13).startswith("compute_100")


def test_cmake_architecture_syntax_is_read_as_cmake_and_ggml_read_it():
    assert compiled_cuda_archs(["-DCMAKE_CUDA_ARCHITECTURES=61-virtual;86-real;90"]) == (["8.6", "9.0"], ["6.1", "9.0"])
    assert compiled_cuda_archs(["-DCMAKE_CUDA_ARCHITECTURES:STRING=120;121a-real"]) == (["12.0a", "12.1a"], ["12.0a"])
    # the last one given wins, as in CMake
    assert compiled_cuda_archs(["-DCMAKE_CUDA_ARCHITECTURES=75", "-DCMAKE_CUDA_ARCHITECTURES=90-real"]) == (["9.0"], [])
    assert compiled_cuda_archs(["-DGGML_NATIVE=OFF"]) == ([], [])
    assert cuda_architectures(["90"]) == "90"
    assert cuda_architectures(["120"]) == "120-real"  # an arch-specific PTX would help no newer GPU
    assert cuda_architectures(["90", "86", "120"]) == "86-real;90;120-real"


def test_a_single_architecture_build_promises_only_that_architecture(monkeypatch):
    monkeypatch.setenv(CUDA_ARCHS_ENV, "sm_90")
    args = cuda_cmake_args("cuda", configured_cuda_archs(Settings.resolve().cuda_archs))
    assert _arch_value(args) == "90"
    assert properties_for("cuda", args, "13.0") == {"backend": "cuda", "sm": ["9.0"], "ptx": ["9.0"], "cuda": "13.0"}
    monkeypatch.setenv(CUDA_ARCHS_ENV, "8.6, 90")
    assert configured_cuda_archs(Settings.resolve().cuda_archs) == ["86", "90"]
    monkeypatch.setenv(CUDA_ARCHS_ENV, "hopper")
    with pytest.raises(ValueError):
        configured_cuda_archs(Settings.resolve().cuda_archs)
    monkeypatch.delenv(CUDA_ARCHS_ENV)
    assert configured_cuda_archs(Settings.resolve().cuda_archs) is None


RUNTIME = [
    {"name": "nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", "version": "13.0.96",
     "sha256": "7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548", "size": 2243632,
     "url": "https://files.pythonhosted.org/packages/2e/24/d1/nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"},
    {"name": "nvidia_cublas-13.0.2.14-py3-none-manylinux_2_27_x86_64.whl", "version": "13.0.2.14",
     "sha256": "0cf238ffdbe46c00cb9aa98e7bca745c223a5ca5a53e686ac8b3e5a08fe80d6c", "size": 420882912,
     "url": "https://files.pythonhosted.org/packages/28/d4/30/nvidia_cublas-13.0.2.14-py3-none-manylinux_2_27_x86_64.whl"},
]


def _record(wheel: Path, variant: str = "cuda", **extra) -> BuildResult:
    args = cuda_cmake_args(variant, ["90"])
    data = wheel.read_bytes()
    result = BuildResult(variant=variant, wheel=str(wheel), sha256=hashlib.sha256(data).hexdigest(), size=len(data),
                         cmake_args=args, source_sha256="0" * 64, key="k", properties=properties_for(variant, args, "13.0"),
                         platform_tag="linux_x86_64", cuda_libs=[dict(x) for x in RUNTIME], **extra)
    wheel.with_name(wheel.name + ".build.json").write_text(json.dumps(asdict(result)))
    return result


def test_the_build_record_becomes_the_targets_requirements_and_cuda_libs(tmp_path):
    wheel = tmp_path / "site" / "cuda13" / NAME
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"a cuda wheel")
    _record(wheel)
    doc = build_manifest(tmp_path / "site", "https://example.org/rt", source="release", version=3)
    target = doc["targets"][0]
    assert target["id"].endswith("-cuda13") and target["backend"] == "cuda"
    assert target["requires"]["cuda"] == "13.0"
    assert target["requires"]["sm"] == ["9.0"] and target["requires"]["ptx"] == ["9.0"]
    assert target["cuda_libs"] == [{k: lib[k] for k in ("name", "sha256", "size", "url")} for lib in RUNTIME]
    parsed = parse_manifest(doc)
    t: GgmlTarget = parsed.targets[0]
    assert [ref.name for ref in t.cuda_libs] == [lib["name"] for lib in RUNTIME]
    assert t.cuda_libs[1].urls == [RUNTIME[1]["url"]] and t.cuda_libs[1].size == RUNTIME[1]["size"]
    assert t.requires.sm == ["9.0"] and t.requires.ptx == ["9.0"] and t.requires.cuda == "13.0"


def test_manifest_build_writes_cuda_libs_from_the_command_line(tmp_path):
    wheel = tmp_path / "site" / "cuda" / NAME
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"another cuda wheel")
    _record(wheel)
    rc, out, err = run_cli(["manifest", "build", str(tmp_path / "site"), "--base-url", "https://example.org/rt",
                            "--version", "4", "--json"])
    assert rc == 0, err
    assert result_of(out)["targets"] == ["linux-x86_64-cuda"]
    written = json.loads((tmp_path / "site" / "ggml-manifest.json").read_text())
    assert [lib["name"] for lib in written["targets"][0]["cuda_libs"]] == [lib["name"] for lib in RUNTIME]


def test_a_cpu_build_has_no_cuda_libs_and_a_broken_cuda_lib_record_is_refused(tmp_path):
    wheel = tmp_path / NAME
    wheel.write_bytes(b"w")
    cpu = BuildResult(variant="cpu", wheel=str(wheel), sha256="1" * 64, size=1, cmake_args=VARIANTS["cpu"],
                      source_sha256="0" * 64, key="k", properties=properties_for("cpu", VARIANTS["cpu"]),
                      platform_tag="linux_x86_64")
    target = target_for(cpu, "https://x/w.whl")
    assert "cuda_libs" not in target and "cuda" not in target["requires"]
    broken = _record(wheel)
    broken.cuda_libs = [{"name": RUNTIME[0]["name"]}]
    with pytest.raises(PublishError, match="without name, sha256, size and url"):
        target_for(broken, "https://x/w.whl")


def _wheel_with(path: Path, files: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    files = {**files, f"{DIST}/METADATA": b"Metadata-Version: 2.1\nName: stable_diffusion_cpp_python\nVersion: 0.4.7\n",
             f"{DIST}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: py3-none-linux_x86_64\n",
             f"{DIST}/RECORD": b""}
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(zipfile.ZipInfo(name, date_time=(2024, 1, 2, 3, 4, 6)), data)
    return path


def test_a_cuda_wheel_keeps_only_its_own_libraries(tmp_path):
    own = b"not an ELF: kept byte for byte"
    fat = _wheel_with(tmp_path / "fat" / NAME, {
        "stable_diffusion_cpp/__init__.py": b"\n",
        "stable_diffusion_cpp/lib/libstable-diffusion.so": own,
        "stable_diffusion_cpp/lib/libggml-cuda.so": own,
        "stable_diffusion_cpp/lib/libcudart.so.13": b"cudart",
        "stable_diffusion_cpp/lib/libcublas.so.13": b"cublas",
        "stable_diffusion_cpp/lib/libcublasLt.so.13": b"cublasLt",
        "lib/libcudart.so.13": b"cudart",
        "bin/cublas64_13.dll": b"cublas",
    })
    lean = tmp_path / "lean" / NAME
    installed = lean_wheel(fat, lean)
    with zipfile.ZipFile(lean) as z:
        names = sorted(n for n in z.namelist() if not n.startswith(DIST))
        record = z.read(f"{DIST}/RECORD").decode()
        assert names == ["stable_diffusion_cpp/__init__.py", "stable_diffusion_cpp/lib/libggml-cuda.so",
                         "stable_diffusion_cpp/lib/libstable-diffusion.so"]
        for name in names:
            data = z.read(name)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert f"{name},sha256={digest},{len(data)}" in record
    assert "cudart" not in record and "cublas" not in record
    assert installed == sum(i.file_size for i in zipfile.ZipFile(lean).infolist())


@pytest.mark.parametrize("name, nvidia", [
    ("a/lib/libcudart.so.13", True), ("libcublasLt.so.12", True), ("cudart64_12.dll", True), ("libcuda.so.1", True),
    ("cublas64_13.dll", True), ("libcudart_static.a", True),
    ("a/lib/libggml-cuda.so", False), ("libstable-diffusion.so", False), ("libcudaplugin.so", False),
])
def test_which_files_are_nvidias_runtime(name, nvidia):
    assert is_nvidia_runtime(name) is nvidia


def test_a_cuda_compile_gets_four_hours_for_each_architecture_it_compiles(monkeypatch):
    """One architecture took 5656 s here (docs/builds.md): the 1 h default would stop it, so the
    limit that build ggml, install and scripts/build-cuda.sh share grows with the architectures."""
    from accelstack.publisher.build import COMPILE_TIMEOUT, CUDA_COMPILE_TIMEOUT_PER_ARCH, compile_timeout_for
    from accelstack.publisher.variants import CUDA12_SM, CUDA13_SM

    monkeypatch.delenv("ACCELSTACK_CUDA_ARCHS", raising=False)
    assert compile_timeout_for("cpu") == compile_timeout_for("vulkan") == COMPILE_TIMEOUT == 3600
    assert compile_timeout_for("cuda", ["90"]) == CUDA_COMPILE_TIMEOUT_PER_ARCH == 4 * 3600
    assert compile_timeout_for("cuda") == len(CUDA13_SM) * 4 * 3600
    assert compile_timeout_for("cuda12", ["61", "70"]) == 2 * 4 * 3600
    assert compile_timeout_for("cuda12") == len(CUDA12_SM) * 4 * 3600
    monkeypatch.setenv("ACCELSTACK_CUDA_ARCHS", "86,89")
    assert compile_timeout_for("cuda", configured=Settings.resolve().cuda_archs) == 2 * 4 * 3600
