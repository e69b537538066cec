"""Fixtures for the engine tests: the real CPU runtime, the real (cached) probe model, and an
isolated environment (no test reads the user's config; the probe model, 2 GB, is synthesized
once per machine into the user cache like the runtime build, and reused)."""
from __future__ import annotations

from pathlib import Path

import pytest

from accelstack.engine.probe_model import DEFAULT_SEED, ensure_probe_model
from accelstack.engine.runtime import Runtime
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
