"""Detection on a misbehaving machine: hung and missing tools, garbage output, unreadable files,
unknown GPUs and broken captures. It must report what it can and say what went wrong, never crash."""
from __future__ import annotations

import json
import os
import re
import signal
import stat
import threading
from pathlib import Path
from typing import List, Optional, Sequence

import pytest

from accelstack.errors import AccelstackError, Action, CaptureFormatError
from accelstack.hardware import detect
from accelstack.hardware.report import HardwareReport
from accelstack.hardware.system import DEFAULT_TIMEOUT, CapturingSystem, CommandResult, LiveSystem, ReplaySystem

from .conftest import CAPTURES, TEST_HOME, make_fixture, replay
from cli_helpers import error_of, result_of

MIB = 1024 * 1024
CLI_SYNTAX = re.compile(r"`accelstack|accelstack (detect|install|repair)|--[a-z]")  # library text never names CLI syntax
RTX4070 = "linux-nvidia-rtx4070-550"


class FilesFromCaptureCommandsLive(ReplaySystem):
    """A captured machine's files, with its commands run for real on this machine (found on PATH)."""

    def run(self, argv: Sequence[str], timeout: float = DEFAULT_TIMEOUT) -> CommandResult:
        return LiveSystem().run(argv, timeout)


def fake_tool(bin_dir: Path, name: str, script: str) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def detect_bounded(system, timeout: float, guard: float = 30.0) -> HardwareReport:
    """Run detection in a thread and fail (instead of hanging the suite) if it never returns."""
    result: List[HardwareReport] = []
    worker = threading.Thread(target=lambda: result.append(detect(system, home=TEST_HOME, timeout=timeout)), daemon=True)
    worker.start()
    worker.join(guard)
    assert not worker.is_alive(), "detection did not return: the command timeout was not honoured"
    return result[0]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def read_pid(path: Path) -> int:
    return int(path.read_text().strip())


# -- hung and missing commands ------------------------------------------------------------------


def test_hung_nvidia_smi_is_killed_and_reported(tmp_path, monkeypatch):
    pidfile = tmp_path / "pid"
    fake_tool(tmp_path / "bin", "nvidia-smi", f'echo $$ > "{pidfile}"\nexec sleep 60\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    system = CapturingSystem(FilesFromCaptureCommandsLive(str(CAPTURES / RTX4070)))

    r = detect_bounded(system, timeout=0.5)

    hung = [p for p in r.problems if p.code == "nvidia_smi_hung"]
    assert len(hung) == 1 and hung[0].severity == "error" and "0.5 s" in hung[0].message
    smi = [c for c in system.commands if c.argv[0] == "nvidia-smi"]
    assert len(smi) == 1 and smi[0].timed_out and smi[0].returncode is None  # no retry of a hung tool
    assert not pid_alive(read_pid(pidfile)), "the hung nvidia-smi is still running"
    # sysfs still tells the GPU, its driver and (through the name table) its compute capability
    g = r.gpus[0]
    assert (g.name, g.driver_version, g.compute_capability, g.cuda_driver_version) == ("NVIDIA GeForce RTX 4070", "550.40.07", "8.9", "12.4")
    assert g.vram_total is None
    assert r.api("cuda").usable


def test_hung_tool_whose_child_holds_the_pipe_does_not_block(tmp_path, monkeypatch):
    """A wedged driver can leave a grandchild holding stdout open after the tool itself is killed."""
    pidfile = tmp_path / "pid"
    fake_tool(tmp_path / "bin", "nvidia-smi", f'sleep 60 &\necho $! > "{pidfile}"\nwait\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    try:
        r = detect_bounded(FilesFromCaptureCommandsLive(str(CAPTURES / RTX4070)), timeout=0.3)
        assert "nvidia_smi_hung" in r.problem_codes()
        assert r.gpus[0].vendor == "nvidia"
    finally:
        if pidfile.exists() and pid_alive(read_pid(pidfile)):
            os.kill(read_pid(pidfile), signal.SIGKILL)  # the orphan this test started


def test_live_run_of_a_missing_program():
    res = LiveSystem().run(["accelstack-test-no-such-program-xyz", "--version"])
    assert res.missing and not res.ok and not res.timed_out


def test_live_run_captures_output_and_exit_status(tmp_path, monkeypatch):
    fake_tool(tmp_path / "bin", "nvidia-smi", 'echo "out"; echo "err" >&2; exit 3\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    res = LiveSystem().run(["nvidia-smi"], timeout=10)
    assert (res.returncode, res.stdout, res.stderr, res.ok) == (3, "out\n", "err\n", False)


def test_missing_nvidia_smi_still_reports_the_gpu(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    r = detect_bounded(FilesFromCaptureCommandsLive(str(CAPTURES / RTX4070)), timeout=2)
    assert r.gpus[0].name == "NVIDIA GeForce RTX 4070" and r.gpus[0].cuda_driver_version == "12.4"
    assert not [c for c in r.problem_codes() if c.startswith("nvidia_smi")]


def test_failing_real_tool_becomes_a_problem(tmp_path, monkeypatch):
    fake_tool(tmp_path / "bin", "nvidia-smi", "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"; exit 9\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    r = detect_bounded(FilesFromCaptureCommandsLive(str(CAPTURES / RTX4070)), timeout=5)
    assert "nvidia_driver_not_loaded" in r.problem_codes()


# -- garbage and truncated output ---------------------------------------------------------------


def linux_4070(builder, smi_stdout: Optional[str] = None, smi_rc: int = 0, cpuinfo: Optional[str] = None):
    b = builder()
    b.pci("0000:2d:00.0", "030000", "10de", "2786", driver="nvidia")
    b.file("/sys/module/nvidia/version", "550.40.07\n")
    if smi_stdout is not None:
        b.command(make_fixture.SMI_QUERY, stdout=smi_stdout, returncode=smi_rc)
    if cpuinfo is not None:
        b.file("/proc/cpuinfo", cpuinfo)
    return b


@pytest.mark.parametrize(
    "stdout",
    [
        "\x00\x7fgarbage\n,,,,,,\n",
        "0, 00000000:2D:00.0, NVIDIA GeForce RTX 40",  # cut mid-row
        "index, pci.bus_id, name\n",  # a header only
        "",
    ],
)
def test_garbage_nvidia_smi_output(builder, tmp_path, stdout):
    r = replay(linux_4070(builder, stdout).write(tmp_path / "c"))
    assert "nvidia_smi_garbage" in r.problem_codes()
    g = r.gpus[0]
    assert (g.name, g.compute_capability, g.cuda_driver_version) == ("NVIDIA GeForce RTX 4070", "8.9", "12.4")


def test_nvidia_smi_fields_not_available(builder, tmp_path):
    r = replay(linux_4070(builder, "0, 00000000:2D:00.0, NVIDIA GeForce RTX 4070, [N/A], [N/A], 550.40.07, [N/A]\n").write(tmp_path / "c"))
    g = r.gpus[0]
    assert g.vram_total is None and g.vram_free is None
    assert g.compute_capability == "8.9" and "compute_capability: name table" in g.sources
    assert not [c for c in r.problem_codes() if c.startswith("nvidia_smi")]


def test_nvidia_smi_unknown_failure_is_reported_with_its_first_line(builder, tmp_path):
    r = replay(linux_4070(builder, "Unable to determine the device handle for GPU0000:2D:00.0: Unknown Error\n", smi_rc=15).write(tmp_path / "c"))
    failed = [p for p in r.problems if p.code == "nvidia_smi_failed"]
    assert len(failed) == 1 and "Unknown Error" in failed[0].message and "exit 15" in failed[0].message


def test_truncated_and_garbage_cpuinfo(builder, tmp_path):
    cut = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Some CPU\nflags\t\t: fpu sse sse2 avx avx2 fma av"
    r = replay(linux_4070(builder, cpuinfo=cut).write(tmp_path / "cut"))
    assert {"avx", "avx2", "fma"} <= set(r.cpu.features) and "av" not in r.cpu.features
    assert r.cpu.vendor == "intel"
    junk = "\x00\xff\xfe binary \x01\nflags:::\n:\n" + "processor : x\n" * 3
    r = replay(linux_4070(builder, cpuinfo=junk).write(tmp_path / "junk"))
    assert r.cpu.features == [] and r.cpu.x86_64_level is None
    assert "no_avx2" not in r.problem_codes()  # unknown features are not "no AVX2"


def test_garbage_sysfs_values(builder, tmp_path):
    b = builder()
    b.file("/sys/bus/pci/devices/0000:03:00.0/class", "0x030000\n")
    b.file("/sys/bus/pci/devices/0000:03:00.0/vendor", "0x1002\n")
    b.file("/sys/bus/pci/devices/0000:03:00.0/device", "garbage\n")
    b.file("/sys/bus/pci/devices/0000:03:00.0/mem_info_vram_total", "N/A\n")
    b.file("/sys/bus/pci/devices/0000:07:00.0/class", "\x00\x00")
    b.kfd_node(1, gfx_target_version=0)
    b.file("/sys/class/kfd/kfd/topology/nodes/2/properties", "gfx_target_version banana\nlocation_id\n")
    b.links["/sys/bus/pci/devices/0000:03:00.0/driver"] = "../../../../bus/pci/drivers/amdgpu"
    r = replay(b.write(tmp_path / "c"))
    assert len(r.gpus) == 1
    g = r.gpus[0]
    assert g.vendor == "amd" and g.pci_device_id == "" and g.vram_total is None and g.gfx_target == ""
    assert r.preference[-1].api == "cpu"


WIN_OK = {
    "gpus": [{"Name": "NVIDIA GeForce RTX 4060", "PNPDeviceID": "PCI\\VEN_10DE&DEV_2882", "DriverVersion": "32.0.15.9186", "AdapterRAM": 4293918720, "Status": "OK"}],
    "registry": [],
    "cpu": {"Name": "Intel(R) Core(TM) i5-12400F", "Manufacturer": "GenuineIntel", "NumberOfCores": 6, "NumberOfLogicalProcessors": 12},
    "features": {"39": True, "40": True},
}


def windows(builder, stdout: Optional[str] = None, data=None, timed_out: bool = False, missing: bool = False):
    b = builder(system="Windows", machine="AMD64")
    if data is not None:
        b.powershell(data)
    else:
        b.command(make_fixture.powershell_argv(), stdout=stdout or "", timed_out=timed_out, missing=missing)
    return b


def test_truncated_powershell_json(builder, tmp_path):
    full = json.dumps(WIN_OK)
    r = replay(windows(builder, full[: len(full) // 2]).write(tmp_path / "c"))
    garbage = [p for p in r.problems if p.code == "powershell_garbage"]
    assert len(garbage) == 1 and garbage[0].action is Action.REPORT_BUG
    assert "bug report" in garbage[0].hint and not CLI_SYNTAX.search(garbage[0].hint)
    assert r.gpus == [] and r.preference[-1].api == "cpu"


def test_cli_renders_a_problem_action_as_the_command(builder, tmp_path, capsys):
    """The library names the action (report-bug); only the CLI turns it into its command line."""
    from accelstack.cli import main

    full = json.dumps(WIN_OK)
    directory = windows(builder, full[: len(full) // 2]).write(tmp_path / "c")
    assert main(["detect", "--replay", str(directory)]) == 0
    text = capsys.readouterr().out
    assert "what to do: attach a capture of this machine's detection to a bug report (run `accelstack detect --capture DIR`)" in text
    assert main(["detect", "--replay", str(directory), "--json"]) == 0
    problems = result_of(capsys.readouterr().out)["problems"]
    assert [p["action"] for p in problems if p["code"] == "powershell_garbage"] == ["report-bug"]


@pytest.mark.parametrize(
    "data",
    [
        [1, 2, 3],
        {"gpus": "oops", "registry": 7, "cpu": [1], "features": None},
        {"gpus": [None, 5, {"Name": None, "PNPDeviceID": None}], "cpu": {"NumberOfCores": "six"}},
        {"gpus": {"Name": "Single GPU is an object, not a list", "PNPDeviceID": "PCI\\VEN_10DE&DEV_2882", "DriverVersion": "garbage", "AdapterRAM": -1}},
    ],
)
def test_odd_powershell_json_shapes(builder, tmp_path, data):
    r = replay(windows(builder, data=data).write(tmp_path / "c"))
    assert r.os.name == "windows" and r.preference[-1].api == "cpu"
    assert r.cpu.physical_cores is None or isinstance(r.cpu.physical_cores, int)


def test_single_gpu_object_and_bad_driver_version(builder, tmp_path):
    data = {"gpus": {"Name": "NVIDIA GeForce RTX 4060", "PNPDeviceID": "PCI\\VEN_10DE&DEV_2882", "DriverVersion": "garbage", "AdapterRAM": 4293918720}}
    r = replay(windows(builder, data=data).write(tmp_path / "c"))
    assert [g.name for g in r.gpus] == ["NVIDIA GeForce RTX 4060"]
    # NVIDIA's marketing name means NVIDIA's driver is installed; only its version is unknown (issue 11)
    assert r.gpus[0].driver_version == "" and r.problem_codes() == ["nvidia_driver_version_unknown"]


def test_powershell_hung_or_missing(builder, tmp_path):
    r = replay(windows(builder, timed_out=True).write(tmp_path / "hung"))
    assert "powershell_hung" in r.problem_codes()
    r = replay(windows(builder, missing=True).write(tmp_path / "missing"))
    assert "powershell_failed" in r.problem_codes()


def test_garbage_system_profiler_and_sysctl(builder, tmp_path):
    b = builder(system="Darwin", machine="arm64")
    b.command(make_fixture.SYSCTL, stdout="\x00garbage: : :\nnot a sysctl line\n")
    b.command(make_fixture.PROFILER_JSON, stdout='{"SPDisplaysDataType": [ {"_na\x00\x01{{{', returncode=0)
    b.command(make_fixture.PROFILER_TEXT, stdout="\x00\x01\x02 nothing useful\n")
    r = replay(b.write(tmp_path / "c"))
    assert r.os.name == "macos" and r.gpus == [] and r.preference[-1].api == "cpu"


def test_system_profiler_text_fallback_after_garbage_json(builder, tmp_path):
    b = builder(system="Darwin", machine="x86_64")
    b.command(make_fixture.PROFILER_JSON, stdout="<html>not json</html>\n", returncode=0)
    b.command(make_fixture.PROFILER_TEXT, stdout=(CAPTURES / "macos-imacpro-vega64" / "commands" / "1.out").read_text(encoding="utf-8"))
    r = replay(b.write(tmp_path / "c"))
    assert [g.name for g in r.gpus] == ["Radeon Pro Vega 64"]


# -- unreadable files ---------------------------------------------------------------------------


def test_unreadable_sysfs_and_procfs_files(copy_capture):
    root = copy_capture(RTX4070)
    index = json.loads((root / "capture.json").read_text(encoding="utf-8"))
    index["errors"] = {
        "/sys/bus/pci/devices/0000:2d:00.0/device": "EACCES",
        "/sys/module/nvidia/version": "EACCES",
        "/proc/cpuinfo": "EPERM",
    }
    (root / "capture.json").write_text(json.dumps(index), encoding="utf-8")
    r = replay(root)
    unreadable = [p for p in r.problems if p.code == "unreadable"]
    assert len(unreadable) == 1 and unreadable[0].severity == "info"
    assert "cannot read /proc/cpuinfo: Operation not permitted" in unreadable[0].message
    g = r.gpus[0]
    assert g.vendor == "nvidia" and g.pci_device_id == ""
    assert g.name == "NVIDIA GeForce RTX 4070" and g.driver_version == "550.40.07"  # nvidia-smi fills the gaps
    assert r.api("cuda").usable


def test_unlistable_pci_directory(copy_capture):
    root = copy_capture(RTX4070)
    index = json.loads((root / "capture.json").read_text(encoding="utf-8"))
    index["dirs"] = {"/sys/bus/pci/devices": None}
    index["errors"] = {"/sys/bus/pci/devices": "EACCES"}
    (root / "capture.json").write_text(json.dumps(index), encoding="utf-8")
    r = replay(root)
    assert r.preference[-1].api == "cpu"  # no crash; the GPU is simply not seen through PCI


def test_replay_raises_like_open_for_recorded_errors(copy_capture):
    root = copy_capture(RTX4070)
    index = json.loads((root / "capture.json").read_text(encoding="utf-8"))
    index["errors"] = {"/proc/cpuinfo": "EACCES"}
    (root / "capture.json").write_text(json.dumps(index), encoding="utf-8")
    system = ReplaySystem(str(root))
    with pytest.raises(PermissionError):
        system.read_text("/proc/cpuinfo")
    with pytest.raises(FileNotFoundError):
        system.read_text("/no/such/file")
    assert system.exists("/proc/cpuinfo")


# -- unknown hardware ---------------------------------------------------------------------------


def test_unknown_nvidia_pci_id(builder, tmp_path):
    b = builder()
    b.pci("0000:01:00.0", "030000", "10de", "fff0", driver="nvidia")
    b.file("/sys/module/nvidia/version", "610.10\n")
    b.command(make_fixture.SMI_QUERY, missing=True)
    r = replay(b.write(tmp_path / "c"))
    g = r.gpus[0]
    assert g.name == "NVIDIA device 10de:fff0" and g.kind == "discrete" and g.compute_capability == ""
    assert g.cuda_driver_version == "13.3" and r.api("cuda").usable


def test_unknown_nvidia_pci_id_named_by_nvidia_smi(builder, tmp_path):
    b = builder()
    b.pci("0000:01:00.0", "030000", "10de", "fff0", driver="nvidia")
    b.file("/sys/module/nvidia/version", "610.10\n")
    b.smi([[0, "00000000:01:00.0", "NVIDIA GeForce RTX 6090", 49152, 49000, "610.10", "13.5"]])
    g = replay(b.write(tmp_path / "c")).gpus[0]
    assert (g.name, g.compute_capability, g.vram_total) == ("NVIDIA GeForce RTX 6090", "13.5", 49152 * MIB)


def test_unknown_amd_and_other_vendor_gpus(builder, tmp_path):
    b = builder()
    b.pci("0000:03:00.0", "030000", "1002", "fff0", driver="amdgpu")
    b.pci("0000:04:00.0", "030000", "1a03", "2000", driver="ast")  # a server BMC's ASPEED VGA
    b.pci("0000:05:00.0", "120000", "1e52", "0001")  # an NPU-style accelerator: not a GPU
    b.device("/dev/kfd", rw=True)
    r = replay(b.write(tmp_path / "c"))
    assert [(g.vendor, g.name) for g in r.gpus] == [("amd", "AMD device 1002:fff0"), ("other", "PCI device 1a03:2000")]
    assert r.gpus[0].gfx_target == "" and r.gpus[1].kind == "unknown"
    assert [p.api for p in r.preference] == ["cpu"]


# -- broken captures ----------------------------------------------------------------------------


def test_directory_without_capture_json(tmp_path):
    with pytest.raises(CaptureFormatError) as err:
        ReplaySystem(str(tmp_path))
    assert "capture.json is missing" in err.value.message and "capturing detection" in err.value.hint
    assert err.value.action is Action.FIX_INPUT and not CLI_SYNTAX.search(err.value.hint)


@pytest.mark.parametrize(
    "index, words",
    [
        ({"format": "accelstack-capture", "version": 2, "platform": {"system": "Linux"}}, "version 2 is not supported"),
        ({"format": "accelstack-capture", "platform": {"system": "Linux"}}, "version None is not supported"),
        ({"format": "something-else", "version": 1}, "not an accelstack capture"),
        ({"format": "accelstack-capture", "version": 1, "platform": {"os": "Linux"}}, "bad platform section"),
    ],
)
def test_unsupported_or_malformed_capture(tmp_path, index, words):
    (tmp_path / "capture.json").write_text(json.dumps(index), encoding="utf-8")
    with pytest.raises(CaptureFormatError) as err:
        ReplaySystem(str(tmp_path))
    assert words in err.value.message
    assert not CLI_SYNTAX.search(err.value.hint)
    if "is not supported" in words:
        assert err.value.action is Action.UPDATE_ACCELSTACK


def test_capture_json_that_is_not_json(tmp_path):
    (tmp_path / "capture.json").write_text("{ this is not json", encoding="utf-8")
    with pytest.raises(CaptureFormatError, match="not valid JSON"):
        ReplaySystem(str(tmp_path))


def test_capture_naming_a_missing_output_file(copy_capture):
    root = copy_capture(RTX4070)
    (root / "commands" / "0.out").unlink()
    with pytest.raises(CaptureFormatError, match="commands/0.out"):
        replay(root)


def test_cli_reports_a_bad_capture_with_a_hint(tmp_path, capsys):
    from accelstack.cli import main

    assert main(["detect", "--replay", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "capture.json is missing" in err and "what to do:" in err
    assert main(["detect", "--replay", str(tmp_path), "--json"]) == 1
    out = error_of(capsys.readouterr().out)
    assert out["error"] == "CaptureFormatError" and out["hint"]
    assert issubclass(CaptureFormatError, AccelstackError)
