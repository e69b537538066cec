"""Fixtures of the manifest/resolver tests (helpers live in ``_factory``)."""
from __future__ import annotations

import pytest

from accelstack.manifests import Manifests

from ._factory import loaded_manifests


@pytest.fixture(scope="session")
def manifests() -> Manifests:
    """The built-in torch matrix plus the example ggml manifest, loaded once."""
    return loaded_manifests()
