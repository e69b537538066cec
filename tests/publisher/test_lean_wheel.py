"""Lean packaging of a compiled wheel, and the Vulkan headers a vulkan build is pointed at: each
shared library once, no static archive or header, a valid RECORD, the same bytes from the same
input, a cached compile repackaged without compiling, and the cache key unchanged by packaging."""
from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from dataclasses import asdict
from pathlib import Path

import pytest

from accelstack.errors import Action
from accelstack.publisher import build as build_mod
from accelstack.publisher.build import VARIANTS, build_ggml, build_options, vulkan_include_dir
from accelstack.publisher.build_cache import BuildResult, cache_key, sha256_file
from accelstack.publisher.errors import BuildError
from accelstack.publisher.wheel_repack import PACKAGING_VERSION, lean_wheel
from accelstack.settings import Settings

NAME = "stable_diffusion_cpp_python-0.4.7-py3-none-linux_x86_64.whl"
DIST = "stable_diffusion_cpp_python-0.4.7.dist-info"
LIB = b"\x7fELF" + b"library bytes " * 1000  # not a real ELF: strip refuses it and the bytes are kept


def _fat_wheel(path: Path) -> Path:
    """The layout scikit-build-core gives the bindings: CMake's install tree beside the package."""
    files = {
        "stable_diffusion_cpp/__init__.py": b"from .stable_diffusion_cpp import *\n",
        "stable_diffusion_cpp/stable_diffusion_cpp.py": b"LIB = 'lib/libstable-diffusion.so'\n",
        "stable_diffusion_cpp/lib/libstable-diffusion.so": LIB,
        "lib/libstable-diffusion.so": LIB,
        "lib/libggml.a": b"!<arch>\n" + b"x" * 500,
        "lib/libggml-cpu.a": b"!<arch>\n" + b"y" * 500,
        "lib/cmake/ggml/ggml-config.cmake": b"# cmake\n",
        "include/ggml.h": b"/* header */\n",
        f"{DIST}/METADATA": b"Metadata-Version: 2.1\nName: stable_diffusion_cpp_python\nVersion: 0.4.7\n",
        f"{DIST}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: py3-none-linux_x86_64\n",
        f"{DIST}/RECORD": b"stale,,\n",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(zipfile.ZipInfo(name, date_time=(2024, 1, 2, 3, 4, 6)), data)
    return path


def test_a_lean_wheel_ships_each_library_once_with_a_valid_record(tmp_path):
    fat = _fat_wheel(tmp_path / "fat" / NAME)
    lean = tmp_path / "lean" / NAME
    installed = lean_wheel(fat, lean)
    with zipfile.ZipFile(lean) as z:
        names = sorted(z.namelist())
        assert names == sorted([
            "stable_diffusion_cpp/__init__.py", "stable_diffusion_cpp/stable_diffusion_cpp.py",
            "stable_diffusion_cpp/lib/libstable-diffusion.so", f"{DIST}/METADATA", f"{DIST}/WHEEL", f"{DIST}/RECORD"])
        assert z.read("stable_diffusion_cpp/lib/libstable-diffusion.so") == LIB
        rows = [line.split(",") for line in z.read(f"{DIST}/RECORD").decode().splitlines()]
        for name, digest, size in rows:
            if name.endswith("RECORD"):
                assert (digest, size) == ("", "")
                continue
            data = z.read(name)
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert int(size) == len(data)
        assert {r[0] for r in rows} == set(names)
        assert installed == sum(i.file_size for i in z.infolist())
    again = tmp_path / "again" / NAME
    lean_wheel(fat, again)
    assert again.read_bytes() == lean.read_bytes(), "the same compile must package to the same bytes"
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                    "--no-index", "--target", str(target), str(lean)], check=True)
    assert (target / "stable_diffusion_cpp" / "lib" / "libstable-diffusion.so").read_bytes() == LIB
    assert not (target / "lib").exists() and not (target / "include").exists()


def test_a_library_only_in_the_install_tree_is_kept(tmp_path):
    fat = tmp_path / NAME
    with zipfile.ZipFile(fat, "w") as z:
        z.writestr("pkg/__init__.py", b"")
        z.writestr("lib/libextra.so.1", LIB)
        z.writestr(f"{DIST}/RECORD", b"")
    lean_wheel(fat, tmp_path / "out" / NAME)
    with zipfile.ZipFile(tmp_path / "out" / NAME) as z:
        assert "lib/libextra.so.1" in z.namelist()


def _cached_compile(cache: Path, sdist: Path) -> Path:
    """A cache slot as a compile before lean packaging left it (a build.json without ``packaging``)."""
    options, _ = build_options("cpu", cuda_env={})  # the options build_ggml keys a cpu build with here
    key = cache_key(sha256_file(sdist), "cpu", options)
    wheel = _fat_wheel(cache / key / NAME)
    record = asdict(BuildResult(variant="cpu", wheel=str(wheel), sha256=sha256_file(wheel), size=wheel.stat().st_size,
                                cmake_args=options, source_sha256=sha256_file(sdist), key=key))
    for newer in ("installed_size", "packaging", "compiled_wheel"):
        del record[newer]
    (cache / key / "build.json").write_text(json.dumps(record))
    return wheel


def test_a_cached_compile_is_repackaged_not_compiled_and_keeps_its_key(tmp_path):
    sdist = tmp_path / "src" / "stable_diffusion_cpp_python-0.4.7.tar.gz"
    sdist.parent.mkdir()
    sdist.write_bytes(b"source")
    cache = tmp_path / "cache"
    fat = _cached_compile(cache, sdist)
    fat_bytes = fat.read_bytes()
    result = build_ggml("cpu", Settings.resolve(build_cache=cache), sdist=sdist)
    assert result.cache_hit and result.packaging == PACKAGING_VERSION and result.key == fat.parent.name
    assert result.compiled_wheel == str(fat) and fat.read_bytes() == fat_bytes, "the compiled wheel stays as it was"
    assert Path(result.wheel) != fat and result.size == Path(result.wheel).stat().st_size < fat.stat().st_size
    assert result.installed_size < 2 * len(LIB)
    record = json.loads((fat.parent / "build.json").read_text())
    # the record names its wheel relative to the cache root (issue 25: a moved cache is still a cache)
    assert record["packaging"] == PACKAGING_VERSION and str(cache / record["wheel"]) == result.wheel
    again = build_ggml("cpu", Settings.resolve(build_cache=cache), sdist=sdist)
    assert again.wheel == result.wheel and again.sha256 == result.sha256


def _headers(root: Path, version: str, new: bool) -> Path:
    include = root / "vulkan-headers" / version / "usr" / "include"
    (include / "vulkan").mkdir(parents=True)
    (include / "vulkan" / "vulkan_structs.hpp").write_text("struct LayerSettingEXT {};\n" if new else "struct Old {};\n")
    return include


def test_the_newest_usable_vulkan_headers_in_the_cache_are_chosen(tmp_path):
    assert vulkan_include_dir(tmp_path) is None
    _headers(tmp_path, "1.3.239.0-1", new=False)
    good = _headers(tmp_path, "1.4.309.0-1", new=True)
    _headers(tmp_path, "1.10.1-1", new=False)  # newer by number, but without what ggml-vulkan needs
    assert vulkan_include_dir(tmp_path) == good


def test_a_vulkan_build_without_new_enough_headers_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(build_mod, "SYSTEM_INCLUDE", tmp_path / "no-system-headers")
    monkeypatch.setattr(build_mod.sys, "platform", "linux")
    sdist = tmp_path / "s.tar.gz"
    sdist.write_bytes(b"source")
    with pytest.raises(BuildError) as info:
        build_ggml("vulkan", Settings.resolve(build_cache=tmp_path / "cache"), sdist=sdist)
    err = info.value
    assert err.action is Action.INSTALL_TOOLCHAIN and "LayerSettingEXT" in err.message
    assert "setup-vulkan.sh" in err.hint and "--" not in err.hint
    given = ["-DVulkan_INCLUDE_DIR=/opt/vk/include"]  # the caller's own headers are taken as given
    assert build_mod._vulkan_header_args(tmp_path / "cache", VARIANTS["vulkan"] + given) == []
    good = _headers(tmp_path / "cache", "1.4.309.0-1", new=True)
    assert build_mod._vulkan_header_args(tmp_path / "cache", VARIANTS["vulkan"]) == [f"-DVulkan_INCLUDE_DIR={good}"]


def test_a_cached_wheel_that_is_no_wheel_is_built_again_not_a_crash(tmp_path, monkeypatch):
    sdist = tmp_path / "stable_diffusion_cpp_python-0.4.7.tar.gz"
    sdist.write_bytes(b"source")
    cache = tmp_path / "cache"
    fat = _cached_compile(cache, sdist)
    fat.write_bytes(b"not a zip")
    record = json.loads((fat.parent / "build.json").read_text())
    (fat.parent / "build.json").write_text(json.dumps({**record, "sha256": sha256_file(fat)}))
    compiled = []

    def fake_compile(variant, *args, **kwargs):
        compiled.append(variant)
        raise BuildError("compiled again")

    monkeypatch.setattr(build_mod, "_compile", fake_compile)
    monkeypatch.setattr(build_mod, "missing_toolchain", lambda variant: [])
    with pytest.raises(BuildError, match="compiled again"):
        build_ggml("cpu", Settings.resolve(build_cache=cache), sdist=sdist)
    assert compiled == ["cpu"]
