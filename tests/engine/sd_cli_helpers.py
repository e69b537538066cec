"""stable-diffusion.cpp's own sd-cli for the pixel-identity tests (issue 44): the one built from the runtime's own
source with its CMake options (bench_engine's key), never another; the test is skipped, with the reason, where
that build is absent (a fresh machine: the 20-minute build stays in benchmarks/bench_engine.py)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def sd_cli(build) -> Path:
    """sd-cli built from the runtime's own source with its CMake options (bench_engine's key), never another."""
    from accelstack.publisher.build_cache import build_cache_dir
    from accelstack.settings import Settings

    spec = importlib.util.spec_from_file_location("bench_engine", Path(__file__).resolve().parents[2] / "benchmarks" / "bench_engine.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cache = build_cache_dir(Settings.resolve())
    sdist = next((cache / "sdist").glob("stable_diffusion_cpp_python-*.tar.gz"), None)
    exe = bench.sd_cli_path(sdist, build.cmake_args, cache) if sdist is not None else None
    if exe is None or not exe.is_file():
        pytest.skip("sd-cli of this source and these CMake options is not built in the build cache "
                    "(python benchmarks/bench_engine.py builds it, about 20 minutes on 2 cores)")
    return exe
