"""The builder's own contract, without the network: time limits that stop whole process trees,
typed errors with an action (no command-line syntax), and the build cache taken from Settings."""
from __future__ import annotations

import json
import os
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

from accelstack.errors import Action, SubprocessTimeout
from accelstack.publisher.build import build_ggml, build_options
from accelstack.publisher.build_cache import BuildResult, build_cache_dir, cache_key, cached_sha256, sha256_file
from accelstack.publisher.errors import BuildError, BuildTimeout
from accelstack.publisher.publish import PublishError, build_manifest
from accelstack.publisher.sdist import fetch_sdist
from accelstack.publisher.variants import missing_toolchain
from accelstack.publisher.wheel_repack import PACKAGING_VERSION
from accelstack.settings import Settings
from accelstack.subprocesses import run_logged

posix_only = pytest.mark.skipif(os.name != "posix", reason="the fake commands are shell scripts")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a killed child of an exited parent may linger as a zombie until init reaps it
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _wait_dead(pid: int, seconds: float = 5.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def _settings(build_cache: Path) -> Settings:
    """The caller's settings, with the build cache at ``build_cache``."""
    return Settings.resolve(build_cache=build_cache)


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


@posix_only
def test_a_step_past_its_time_limit_is_stopped_with_its_children(tmp_path):
    pidfile = tmp_path / "child.pid"
    cmd = _script(tmp_path / "slow", f"""\
        echo "[1/2] compiling"
        sleep 120 &
        echo $! > {pidfile}
        wait
        """)
    lines = []
    start = time.monotonic()
    outcome = run_logged([str(cmd)], log_path=tmp_path / "step.log", timeout=1.0, on_line=lines.append)
    assert outcome.timed_out and time.monotonic() - start < 30
    assert lines == ["[1/2] compiling\n"] and "[1/2] compiling" in outcome.tail()
    assert _wait_dead(int(pidfile.read_text())), "the grandchild outlived the time limit"


def test_a_step_within_its_limit_reports_its_exit_status(tmp_path):
    outcome = run_logged([sys.executable, "-c", "print('done'); raise SystemExit(3)"], log_path=tmp_path / "ok.log",
                         timeout=60)
    assert not outcome.timed_out and outcome.returncode == 3 and outcome.tail() == "done"


@posix_only
def test_a_source_download_past_its_limit_is_a_typed_timeout(tmp_path):
    pidfile = tmp_path / "pip.pid"
    python = _script(tmp_path / "python", f"""\
        sleep 120 &
        echo $! > {pidfile}
        wait
        """)
    with pytest.raises(BuildTimeout) as info:
        fetch_sdist(tmp_path / "sdist", timeout=1.0, python=str(python))
    err = info.value
    assert isinstance(err, SubprocessTimeout) and isinstance(err, BuildError)
    assert err.action is Action.CHECK_NETWORK and err.code == "build-timeout"
    assert "within 1 s" in err.message and "--" not in err.hint and "accelstack" not in err.hint
    assert _wait_dead(int(pidfile.read_text()))


@posix_only
def test_a_failed_source_download_says_to_give_a_local_source(tmp_path):
    python = _script(tmp_path / "python", "echo 'ERROR: No matching distribution found'; exit 1\n")
    with pytest.raises(BuildError) as info:
        fetch_sdist(tmp_path / "sdist", timeout=60, python=str(python))
    err = info.value
    assert not isinstance(err, BuildTimeout)
    assert err.action is Action.GIVE_SOURCE and "No matching distribution" in err.message
    assert "--sdist" not in err.hint and err.log is not None and err.log.is_file()


def _slow_sdist(tmp_path: Path, pidfile: Path) -> Path:
    """A source distribution whose in-tree build backend (run by pip) sleeps instead of compiling."""
    src = tmp_path / "slow-0.1"
    src.mkdir()
    (src / "pyproject.toml").write_text(textwrap.dedent("""\
        [build-system]
        requires = []
        build-backend = "slow_backend"
        backend-path = ["."]
        """))
    (src / "slow_backend.py").write_text(textwrap.dedent(f"""\
        import os, time
        def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
            open({str(pidfile)!r}, "w").write(str(os.getpid()))
            print("[1/51] Building C object ggml.c.o", flush=True)
            time.sleep(300)
        """))
    sdist = tmp_path / "slow-0.1.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(src, arcname=src.name)
    return sdist


@pytest.mark.skipif(bool(missing_toolchain("cpu")), reason="no CMake / C++ compiler here")
def test_a_compile_past_its_limit_is_a_typed_timeout_and_stops_the_compiler(tmp_path):
    pidfile = tmp_path / "backend.pid"
    events = []
    with pytest.raises(BuildTimeout) as info:
        build_ggml("cpu", _settings(tmp_path / "cache"), sdist=_slow_sdist(tmp_path, pidfile), compile_timeout=20,
                   progress=events.append)
    err = info.value
    assert err.action is Action.RETRY and "within 20 s" in err.message
    assert err.log is not None and err.log.is_file() and str(err.log) in err.hint
    assert ("advance", 1, 51) in [(e.kind, e.done, e.total) for e in events]
    assert events[-1].kind == "end" and events[-1].ok is False
    assert _wait_dead(int(pidfile.read_text())), "the build backend pip started outlived the time limit"
    assert not list((tmp_path / "cache").glob("*/build.json")), "a failed build must not be recorded"


def test_a_cache_hit_writes_nothing_beside_a_given_source(tmp_path):
    """The build cache remembers digests beside its own files only: a source distribution the
    caller names stays alone in its folder, and a recorded build is reused, not compiled again."""
    from dataclasses import asdict

    sdist = tmp_path / "mine" / "stable_diffusion_cpp_python-0.4.7.tar.gz"
    sdist.parent.mkdir()
    sdist.write_bytes(b"source bytes")
    cache = tmp_path / "cache"
    options, _ = build_options("cpu", cuda_env={})  # the options build_ggml keys a cpu build with here
    key = cache_key(sha256_file(sdist), "cpu", options)
    wheel = cache / key / "stable_diffusion_cpp_python-0.4.7-py3-none-linux_x86_64.whl"
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"wheel bytes")
    record = BuildResult(variant="cpu", wheel=str(wheel), sha256=sha256_file(wheel), size=11, cmake_args=options,
                         source_sha256=sha256_file(sdist), key=key, packaging=PACKAGING_VERSION)
    (wheel.parent / "build.json").write_text(json.dumps(asdict(record)))
    result = build_ggml("cpu", _settings(cache), sdist=sdist)
    assert result.cache_hit and result.wheel == str(wheel) and result.key == key
    assert sorted(p.name for p in sdist.parent.iterdir()) == [sdist.name]
    assert (wheel.parent / (wheel.name + ".sha256")).read_text().split()[0] == record.sha256
    wheel.write_bytes(b"changed wheel")  # a changed wheel is hashed again, so it no longer matches its record
    assert cached_sha256(wheel) == sha256_file(wheel) != record.sha256


def test_input_errors_carry_an_action_and_no_command_line(tmp_path):
    with pytest.raises(BuildError) as info:
        build_ggml("tpu", _settings(tmp_path))
    assert info.value.action is Action.FIX_INPUT and "cpu" in info.value.hint
    with pytest.raises(BuildError) as info:
        build_ggml("cpu", _settings(tmp_path), sdist=tmp_path / "missing.tar.gz")
    assert info.value.action is Action.FIX_INPUT and "--" not in info.value.hint
    (tmp_path / "empty").mkdir()
    with pytest.raises(PublishError) as pinfo:
        build_manifest(tmp_path / "empty", "https://x", source="t", version=1)
    assert pinfo.value.action is Action.FIX_INPUT and "accelstack" not in pinfo.value.hint


def test_the_build_cache_is_the_settings_one(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELSTACK_BUILD_CACHE", str(tmp_path / "builds"))
    assert build_cache_dir(Settings.resolve()) == tmp_path / "builds"
    monkeypatch.delenv("ACCELSTACK_BUILD_CACHE")
    monkeypatch.setenv("ACCELSTACK_CACHE", str(tmp_path / "cache"))
    assert build_cache_dir(Settings.resolve()) == tmp_path / "cache" / "builds"
