"""Fixtures for the service tests: real services on 127.0.0.1, each with its own home, sharing the
cached CPU ggml build and the cached probe model with the rest of the suite."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, List

import pytest

from accelstack.settings import Settings

from service_helpers import Service


@pytest.fixture(scope="session")
def probe_model():
    """The probe model every verify loads (made once per machine, then from the cache)."""
    from accelstack.engine.probes.model import DEFAULT_SEED, ensure_probe_model

    return ensure_probe_model(DEFAULT_SEED, cache_root=Settings.resolve().probe_cache, keep=True)


@pytest.fixture
def start_service(tmp_path) -> Callable[..., Service]:
    """Start services (``start_service(home=..., *args)``); every one is stopped after the test."""
    started: List[Service] = []

    def start(*args: str, home: Path = None, cache: Path = None, env: Dict[str, str] = None) -> Service:  # type: ignore[assignment]
        svc = Service(home or tmp_path / "home", cache or tmp_path / "cache", *args, env=env)
        started.append(svc)
        return svc

    yield start
    for svc in started:
        svc.stop()


@pytest.fixture(scope="module")
def installed_home(tmp_path_factory, ggml_cpu_build, probe_model) -> Path:
    """A home with the CPU runtime installed and active (from the cached build; cheap import check)."""
    import accelstack
    from accelstack.core.verifiers import import_verifier

    root = tmp_path_factory.mktemp("installed")
    s = Settings.resolve(home=root / "home", cache=root / "cache", manifests=[])
    summary = accelstack.install(None, stack="ggml", report=accelstack.detect(settings=s), settings=s, verifier=import_verifier())
    assert summary.receipt is not None
    return root
