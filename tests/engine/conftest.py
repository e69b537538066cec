"""Fixtures for the engine tests: the real CPU runtime, the real (cached) probe model, and an
isolated environment (no test reads the user's config; the probe model, 2 GB, is synthesized
once per machine into the user cache like the runtime build, and reused)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from accelstack.engine.probes.model import DEFAULT_SEED, ensure_probe_model
from accelstack.engine.runtime import Runtime
from accelstack.installer.pip_runner import venv_python
from accelstack.settings import Settings

# Read before any test changes the environment: the persistent probe cache (2 GB, made once):
# ACCELSTACK_PROBE_CACHE, else probe/ in ACCELSTACK_CACHE or the user cache dir.
PROBE_ROOT = Settings.resolve().probe_cache


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELSTACK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ACCELSTACK_CONFIG", str(tmp_path / "no-config.yaml"))
    monkeypatch.setenv("ACCELSTACK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.delenv("ACCELSTACK_DEBUG", raising=False)
    monkeypatch.delenv("ACCELSTACK_PROBE_CACHE", raising=False)


@pytest.fixture(scope="session")
def probe_model():
    """The full-size SD 1.x probe model (synthesized once, then from the cache)."""
    return ensure_probe_model(DEFAULT_SEED, cache_root=PROBE_ROOT, keep=True)  # one kept copy for the suite


@pytest.fixture
def cache_with_probe(tmp_path, probe_model):
    """An ACCELSTACK_CACHE for CLI subprocesses whose probe/ is the persistent probe cache."""
    cache = tmp_path / "cache"
    cache.mkdir(exist_ok=True)
    link = cache / "probe"
    if not link.exists():
        link.symlink_to(Path(probe_model.path).parent, target_is_directory=True)
    return cache


@pytest.fixture(scope="session")
def cpu_runtime(ggml_cpu_runtime) -> Runtime:
    return Runtime(path=Path(ggml_cpu_runtime), backend="cpu")


@pytest.fixture(scope="session", autouse=True)
def _worker_folders_in_a_test_temp_dir(tmp_path_factory):
    """Supervisors make their folders in the temp dir and keep a crashed worker's (its log) for a
    week: in tests, that temp dir is the session's own, so crash tests leave nothing in /tmp."""
    import tempfile

    saved = tempfile.tempdir
    tempfile.tempdir = str(tmp_path_factory.mktemp("tmp"))
    yield
    tempfile.tempdir = saved


TORCH_PIN = "torch==2.13.*"


@pytest.fixture(scope="package")
def torch_venv(tmp_path_factory, torch_cpu_wheels) -> Iterator[Path]:
    """One venv with torch + diffusers for the engine's torch tests (the worker, verify's pipeline step).

    ``torch==2.13.*`` (CPU) plus diffusers, transformers and safetensors from the wheel folder the
    tests fill once (tests/wheelhouse.py; the fixture skips where it cannot). pip's ``--no-compile``
    and one import with bytecode writing on compile only the modules the tests run: compiling every
    module of torch, diffusers and transformers took 50 of the install's 80 s here.
    """
    root = tmp_path_factory.mktemp("torch-runtime")
    venv = root / "venv"
    start = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "venv", str(venv)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot create a venv: {res.stdout[-300:]}")
    py = venv_python(venv)
    env = {**os.environ, **torch_cpu_wheels, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    try:
        res = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-compile", TORCH_PIN, "diffusers",
                              "transformers", "safetensors"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env=env, timeout=600)
    except subprocess.TimeoutExpired:
        pytest.skip("installing torch + diffusers into a venv took over 10 minutes")
    if res.returncode != 0:
        pytest.skip(f"cannot install {TORCH_PIN} + diffusers/transformers/safetensors: {res.stdout[-400:]}")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    res = subprocess.run([str(py), "-c", "import torch, safetensors, transformers; from diffusers import StableDiffusionPipeline"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=600)
    if res.returncode != 0:  # installed but broken: a failure with its reason, not a skip
        pytest.fail(f"torch + diffusers installed but do not import: {res.stdout[-1500:]}")
    sys.stderr.write(f"\n[torch venv installed in {time.perf_counter() - start:.1f} s]\n")
    yield venv
    shutil.rmtree(root, ignore_errors=True)
