"""Live detection on this machine (runs in CI): its CPU facts match the kernel's, and the report
round-trips through JSON and through the real `python -m accelstack` process."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Set

import pytest

from accelstack.hardware import detect
from accelstack.hardware.report import HardwareReport
from accelstack.hardware.system import LiveSystem
from accelstack.serde import dumps, from_dict, loads, to_dict

from .conftest import CAPTURES, TEST_HOME, fixture_names, replay
from cli_helpers import result_of

LINUX_X86 = sys.platform.startswith("linux") and platform.machine().lower() in ("x86_64", "amd64")


@pytest.fixture(scope="module")
def live() -> HardwareReport:
    return detect(LiveSystem(), home=TEST_HOME)


def raw_cpu_flags() -> Set[str]:
    for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return set(value.split())
    return set()


@pytest.mark.skipif(not LINUX_X86, reason="compares with the flags line of x86 Linux /proc/cpuinfo")
@pytest.mark.parametrize("feature", ["sse4_2", "avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"])
def test_live_cpu_features_match_proc_cpuinfo(live, feature):
    ours = {"sse4_2": "sse4.2", "avx512_vnni": "avx512vnni"}.get(feature, feature)
    assert (ours in live.cpu.features) == (feature in raw_cpu_flags())


@pytest.mark.skipif(not LINUX_X86, reason="x86 Linux only")
def test_live_cpu_level_and_identity(live):
    flags = raw_cpu_flags()
    assert live.os.name == "linux" and live.os.arch == "x86_64"
    assert live.cpu.vendor in ("intel", "amd")
    assert live.cpu.logical_cores == os.cpu_count()
    v3 = {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "xsave"} <= flags and "abm" in flags
    assert (live.cpu.x86_64_level >= 3) == v3
    assert ("no_avx2" in live.problem_codes()) == ("avx2" not in flags)


def test_live_report_basics(live):
    assert live.source == "live" and live.duration_ms > 0
    assert live.os.python_version == platform.python_version()
    assert live.preference[-1].api == "cpu" and live.api("cpu").usable
    assert live.memory.ram_total and live.memory.disk_path == str(TEST_HOME)


def test_live_report_json_round_trip(live):
    text = json.dumps(to_dict(live))
    back = from_dict(HardwareReport, json.loads(text))
    assert back == live
    assert loads(HardwareReport, dumps(live)) == live


@pytest.mark.parametrize("name", fixture_names())
def test_fixture_report_json_round_trip(name):
    report = replay(CAPTURES / name)
    assert from_dict(HardwareReport, json.loads(json.dumps(to_dict(report)))) == report


def test_access_opens_device_nodes_instead_of_trusting_permission_bits():
    """os.access says yes to root for anything; ROCm needs /dev/kfd to actually open read-write."""
    system = LiveSystem()
    assert system.access("/dev/null", "rw")
    assert os.access("/dev/shm", os.R_OK | os.W_OK) or not os.path.exists("/dev/shm")
    if os.path.isdir("/dev/shm"):
        assert not system.access("/dev/shm", "rw")  # a directory cannot be opened read-write
    assert not system.access("/dev/accelstack-no-such-device", "rw")


def run_module(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "accelstack", *args], capture_output=True, text=True, timeout=120)


def test_python_dash_m_detect_json():
    proc = run_module("detect", "--json")
    assert proc.returncode == 0, proc.stderr
    report = from_dict(HardwareReport, result_of(proc.stdout))
    assert report.source == "live" and report.preference[-1].api == "cpu"


def test_python_dash_m_detect_replay_human():
    proc = run_module("detect", "--replay", str(CAPTURES / "linux-nvidia-driver-library-mismatch-580"))
    assert proc.returncode == 0, proc.stderr
    assert "Driver/library version mismatch" not in proc.stdout  # our message, not the tool's raw text
    assert "NVML driver/library version mismatch" in proc.stdout and "580.173.02" in proc.stdout
