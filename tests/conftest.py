"""Session fixtures shared by every test directory.

The ggml CPU runtime is the real stable-diffusion.cpp build: compiled once from the bindings'
source distribution by ``accelstack.publisher.build`` and cached by its inputs (source hash +
options) in the build cache, so only the first run on a machine pays the few minutes.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _share_probe_cache() -> None:
    """Every test (and every CLI it starts) shares one 2 GB probe model, made once per machine.

    Tests point ACCELSTACK_CACHE at temp dirs; without this, each installer test that verifies a
    runtime would synthesize its own probe there.
    """
    from accelstack.engine.probe_model import PROBE_CACHE_ENV, probe_cache_root

    os.environ.setdefault(PROBE_CACHE_ENV, str(probe_cache_root()))


_share_probe_cache()
FIXTURES = REPO / "tests" / "fixtures"


@pytest.fixture(scope="session")
def ggml_cpu_build():
    """BuildResult of the CPU variant (built or reused from the cache)."""
    from accelstack.publisher.build import build_ggml

    return build_ggml("cpu")


@pytest.fixture(scope="session")
def ggml_cpu_wheel(ggml_cpu_build) -> Path:
    return Path(ggml_cpu_build.wheel)


@pytest.fixture(scope="session")
def ggml_cpu_runtime(ggml_cpu_wheel, tmp_path_factory) -> Path:
    """A directory with the CPU wheel installed (``pip install --target``); put it on PYTHONPATH."""
    target = tmp_path_factory.mktemp("ggml-cpu-runtime")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "--no-index",
         "--target", str(target), str(ggml_cpu_wheel)],
        check=True,
    )
    return target
