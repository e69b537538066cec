"""Fixtures for the artifact tests: the fault-injecting HTTP server (see artifact_helpers.py),
an isolated environment, a temporary cache, fast retries and short timeouts."""
from __future__ import annotations

import pytest

from accelstack.artifacts import Cache, RetryPolicy, Transport

from artifact_helpers import Events, start_server


@pytest.fixture
def server():
    fs, stop = start_server()
    try:
        yield fs
    finally:
        stop()


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path, monkeypatch):
    """No test reads or writes the user's real cache, config or state."""
    monkeypatch.setenv("ACCELSTACK_CACHE", str(tmp_path / "default-cache"))
    monkeypatch.setenv("ACCELSTACK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    monkeypatch.delenv("ACCELSTACK_OFFLINE", raising=False)
    for proxy in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture
def cache(tmp_path) -> Cache:
    return Cache(tmp_path / "cache")


@pytest.fixture
def retry() -> RetryPolicy:
    return RetryPolicy(retries=3, backoff_base=0.001, backoff_max=0.005)


@pytest.fixture
def transport():
    t = Transport(connect_timeout=5.0, read_timeout=2.0)
    yield t
    t.close()


@pytest.fixture
def events() -> Events:
    return Events()
