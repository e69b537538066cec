"""How the CPU runtime library calls its own functions, read from the real build's ELF relocations.

On Linux the runtime is one position-independent shared library. Unless the build promises that
nothing interposes on its exported functions, the compiler calls even a function of the same file
through the PLT and never inlines it, and stable-diffusion.cpp widens F8_E5M2 weights one element
at a time through such a function (src/model.cpp ``f8_e5m2_to_f16``): 1.7 s of a 1.2 GB model's
load here, 0.7 s when inlined (benchmarks/bench_engine.py --family qwen-image).
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Set

import pytest

from accelstack.publisher.build import build_options

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF interposition is a Linux matter")
# model.cpp's per-element F8 helpers and their loops, each defined and called in that one file
SAME_FILE_HELPERS = {"f8_e5m2_to_f16", "f8_e4m3_to_f16", "f8_e5m2_to_f16_vec", "f8_e4m3_to_f16_vec"}


def _plt_targets(library: Path) -> Set[str]:
    """The functions ``library`` calls through its PLT (its JUMP_SLOT relocations), by their C or C++ name."""
    readelf = shutil.which("readelf")
    assert readelf, "readelf (binutils) is missing, but the build that made this library needs binutils' linker"
    out = subprocess.run([readelf, "--relocs", "--wide", "--demangle", str(library)], stdout=subprocess.PIPE, text=True,
                         check=True).stdout
    # "<offset> <info> R_X86_64_JUMP_SLOT <value> f8_e5m2_to_f16(unsigned char) + 0": the name before its arguments
    return {line.split(None, 4)[4].split("(")[0].split("@")[0].strip() for line in out.splitlines()
            if "JUMP_SLOT" in line and len(line.split(None, 4)) > 4}


@linux_only
def test_the_runtime_calls_the_helpers_of_its_own_files_directly(ggml_cpu_runtime):
    library = next(Path(ggml_cpu_runtime).rglob("libstable-diffusion.so"))
    through_plt = _plt_targets(library)
    assert "malloc" in through_plt, "libc's malloc is not among the PLT calls read: the check would prove nothing"
    assert not SAME_FILE_HELPERS & through_plt, sorted(SAME_FILE_HELPERS & through_plt)


@linux_only
@pytest.mark.parametrize("variant", ["cpu", "cpu-noavx2", "vulkan", "rocm"])
def test_every_linux_build_promises_no_interposition_to_c_and_cpp(variant):
    args, _ = build_options(variant, cuda_env={})
    assert "-DCMAKE_C_FLAGS=-fno-semantic-interposition" in args
    assert "-DCMAKE_CXX_FLAGS=-fno-semantic-interposition" in args


def test_a_builders_own_flags_come_last_and_win():
    args, _ = build_options("cpu", extra_cmake_args=["-DCMAKE_CXX_FLAGS=-O2"], cuda_env={})
    assert args[-1] == "-DCMAKE_CXX_FLAGS=-O2"
