"""Shared pieces of the detection tests: the replay captures and a builder for fault cases."""
from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from typing import Callable

import pytest

from accelstack.hardware import detect
from accelstack.hardware.report import HardwareReport
from accelstack.hardware.system import ReplaySystem

REPO = Path(__file__).resolve().parents[2]
CAPTURES = REPO / "tests" / "fixtures" / "captures"
# Where reports say runtimes would go: inside the repository (git-ignored, never created), so reports
# do not depend on this machine's user directories and free disk is measured on the checkout's disk.
TEST_HOME = REPO / ".cache" / "detect-test-home"


def _load_builder():
    """tests/fixtures/make_fixture.py is a script, not a package: load it by path."""
    spec = importlib.util.spec_from_file_location("accelstack_make_fixture", CAPTURES.parent / "make_fixture.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


make_fixture = _load_builder()


def fixture_names():
    return sorted(p.name for p in CAPTURES.iterdir() if (p / "capture.json").is_file())


def replay(path, timeout: float = 5.0) -> HardwareReport:
    return detect(ReplaySystem(str(path)), home=TEST_HOME, timeout=timeout)


@pytest.fixture
def builder():
    """The CaptureBuilder class: describe a machine in a few calls, ``write`` it to a directory."""
    return make_fixture.CaptureBuilder


@pytest.fixture
def copy_capture(tmp_path) -> Callable[[str], Path]:
    """Copy a committed capture into tmp_path so a test can change it."""

    def copy(name: str) -> Path:
        dest = tmp_path / name
        shutil.copytree(CAPTURES / name, dest)
        return dest

    return copy
