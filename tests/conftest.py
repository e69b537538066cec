"""Session fixtures shared by every test directory.

The ggml CPU runtime is the real stable-diffusion.cpp build: compiled once from the bindings'
source distribution by ``accelstack.publisher.build`` and cached by its inputs (source hash +
options) in the build cache, so only the first run on a machine pays the few minutes.
"""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, Iterator

import pytest
import wheelhouse

from accelstack.settings import ENV, Settings

REPO = Path(__file__).resolve().parents[1]


def _isolate_from_the_user_dirs() -> None:
    """Tests never write into the developer's real accelstack directories, and share what is costly.

    - home, cache, config file and config dir (ACCELSTACK_HOME / _CACHE / _CONFIG / _CONFIG_DIR, which
      holds the user's trusted keys): one temporary directory for
      the session, set even when the developer's shell names real ones, so a test (or a CLI it
      starts) that relies on the defaults cannot touch real runtimes, receipts, rollback watermarks
      or downloads. Tests that need their own set them per test, as before.
    - the ggml build cache (ACCELSTACK_BUILD_CACHE) stays shared in the user's cache dir: builds are
      keyed by their inputs (source hash + options), so reuse is always correct, and it saves the
      ~4 minute stable-diffusion.cpp build on every run (CI keeps that directory between runs).
    - the 2 GB probe model (ACCELSTACK_PROBE_CACHE), made once and shared by every test and CLI they
      start: in the repository's git-ignored .cache/probe, unless the variable is already set.
    """
    real = Settings.resolve()  # before anything below changes the environment
    os.environ.setdefault(ENV["build_cache"], str(real.build_cache))
    os.environ.setdefault(ENV["probe_cache"], str(REPO / ".cache" / "probe"))
    session = Path(tempfile.mkdtemp(prefix="accelstack-tests-"))
    atexit.register(shutil.rmtree, session, ignore_errors=True)
    os.environ[ENV["home"]] = str(session / "home")
    os.environ[ENV["cache"]] = str(session / "cache")
    os.environ[ENV["config_file"]] = str(session / "config" / "config.yaml")
    os.environ[ENV["config_dir"]] = str(session / "config")


_isolate_from_the_user_dirs()


def _ctrl_c_as_a_terminal_gives_it() -> None:
    """The tests of Ctrl-C send SIGINT to real commands (and to this process) and expect what a person
    at a terminal gets. A test run started in the background by a shell without job control (`cmd &`
    in a script, as a CI harness may) inherits SIGINT *ignored*, and an ignored signal stays ignored
    across exec: every command those tests start then never sees the Ctrl-C (exit 0 or 1, not 130),
    however fast the machine. The session takes Python's own handler back, so its commands start with
    the default, as from a terminal."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


_ctrl_c_as_a_terminal_gives_it()
FIXTURES = REPO / "tests" / "fixtures"


@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory, request) -> Iterator[Path]:
    """A folder for what one test module's tests share (a probe and its parts: GBs), removed when the
    module is done. A full run would otherwise keep every module's probes to the end of the session
    (37 GB measured), more than a CI machine's disk; per-test folders go with the "failed" retention
    policy in pyproject.toml."""
    path = tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])
    yield path
    shutil.rmtree(path, ignore_errors=True)


# the families whose full-size probes several modules generate with: made once for the session
SHARED_FAMILY_PROBES = ("sd2", "sdxl", "sd3")


@pytest.fixture(scope="session")
def family_probe(tmp_path_factory) -> Iterator[Callable[[str], object]]:
    """``family_probe(family)``: the kept probe of sd2, sdxl or sd3 (1.2, 1.6 and 2.9 GB) for verify's own
    probe seed (DEFAULT_SEED), in one folder for the session. tests/engine/loras/test_family_companions.py,
    request/test_generate_components.py and verification/test_verify_families.py each synthesized their
    own, and verify_families' verify a second one (seed 7 inspected, verify's 1234 generated with):
    14, 20 and 17 s each on two busy cores. A probe is a function of its family and seed, so the copy an
    earlier module made is the same file, and ``verify(probe_cache=<its folder>)`` finds it there as it
    finds a kept probe in a user's cache. The folder goes at the end of the session (5.7 GB held)."""
    from accelstack.engine.probes.family_files import ensure_family_probe
    from accelstack.engine.probes.model import DEFAULT_SEED

    root = tmp_path_factory.mktemp("family-probes")

    def probe(family: str):
        assert family in SHARED_FAMILY_PROBES, f"{family}'s probe is made by one module: give it a folder of its own"
        return ensure_family_probe(family, DEFAULT_SEED, root, keep=True)

    probe.families = SHARED_FAMILY_PROBES  # type: ignore[attr-defined]
    yield probe
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def torch_cpu_wheels() -> Dict[str, str]:
    """The pip environment that installs torch 2.13 (CPU), torchvision 0.28 and the torch engine's
    packages from a wheel folder the tests fill once (tests/wheelhouse.py); skips with pip's reason
    where they cannot be downloaded."""
    folder, why = wheelhouse.fill(wheelhouse.TORCH_CPU_STACK)
    if why:
        pytest.skip(f"cannot download {' '.join(wheelhouse.TORCH_CPU_STACK)} into a local wheel folder: {why}")
    return wheelhouse.pip_env(folder)


@pytest.fixture(scope="session")
def ggml_cpu_build():
    """BuildResult of the CPU variant (built or reused from the cache). The build stays in the shared
    build cache for the whole session: a test that purged it (a cache purge run on the session's own
    caches instead of its own) would empty it for every later test and the next first run, so its
    end checks the wheel is still there."""
    from accelstack.publisher.build import build_ggml

    build = build_ggml("cpu", Settings.resolve())
    yield build
    assert Path(build.wheel).is_file(), (
        f"the session's CPU build {build.wheel} is gone: a test removed the shared build cache "
        "(give a test that purges caches a cache of its own)")


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


# -- where a run's time went, by test file ---------------------------------------------------------
_FILE_SECONDS: Dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """The files that took longest (setup, call and teardown of their tests summed): a run near its
    time limit says which files to look at, which --durations' single steps do not."""
    if len(_FILE_SECONDS) < 20:  # a few files run by hand: nothing to rank
        return
    total = sum(_FILE_SECONDS.values())
    terminalreporter.write_sep("=", f"slowest 25 test files (of {len(_FILE_SECONDS)}, {total / 60:.1f} min in tests)")
    for path, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])[:25]:
        terminalreporter.write_line(f"{seconds:8.1f}s {100 * seconds / total:5.1f}%  {path}")
