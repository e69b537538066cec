"""Fixtures for the engine tests: the real CPU runtime, the real (cached) probe model, and an
isolated environment (no test reads the user's config; the probe model, 2 GB, is synthesized
once per machine into the user cache like the runtime build, and reused)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from accelstack.engine.probe_model import DEFAULT_SEED, ensure_probe_model
from accelstack.engine.runtime import Runtime
from accelstack.engine.supervisor import SupervisorPolicy

# Set before any test changes the environment: the persistent probe cache.
PROBE_CACHE_ENV = "ACCELSTACK_TEST_PROBE_CACHE"


def _persistent_probe_root() -> Path:
    env = os.environ.get(PROBE_CACHE_ENV)
    if env:
        return Path(env)
    from accelstack.engine.probe_model import probe_cache_root

    return probe_cache_root()


PROBE_ROOT = _persistent_probe_root()


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELSTACK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ACCELSTACK_CONFIG", str(tmp_path / "no-config.yaml"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.delenv("ACCELSTACK_DEBUG", raising=False)


@pytest.fixture(scope="session")
def probe_model():
    """The full-size SD 1.x probe model (synthesized once, then from the cache)."""
    return ensure_probe_model(DEFAULT_SEED, cache_root=PROBE_ROOT)


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


@pytest.fixture
def fast_policy() -> SupervisorPolicy:
    """Short deadlines and backoff so failure paths run in seconds (never asserted as timings)."""
    return SupervisorPolicy(startup_timeout=60, load_timeout=300, poll_interval=0.1, ping_timeout=1.0,
                            stall_timeout=60, backoff_initial=0.1, backoff_max=1.0, shutdown_grace=2.0)
