"""Fuzzing capture replay (issue 10): mutated ``capture.json`` and probe files of the fixtures.

A capture comes attached to a bug report, so it is hostile input. For every mutation, opening it
(``ReplaySystem``) either refuses it with ``CaptureFormatError`` or succeeds, and once it has
loaded ``detect()`` never raises: what cannot be parsed becomes a problem in the report. Every
call returns within a time bound and a memory bound. Examples that found bugs are kept below as
plain tests.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelstack.errors import AccelstackError, CaptureFormatError
from accelstack.hardware import detect
from accelstack.hardware.replay import ReplaySystem
from accelstack.limits import MAX_CAPTURE_FILE_BYTES

from .fuzzing import Counter, bounded, fuzz, node_mutation

REPO = Path(__file__).resolve().parents[2]
CAPTURES = REPO / "tests" / "fixtures" / "captures"
HOME = REPO / ".cache" / "detect-test-home"  # never created; free disk is measured on the checkout's disk
# Fixtures that reach every probe family: NVIDIA, AMD (kfd), Intel, Jetson, Windows, macOS, WSL.
FIXTURES = ["linux-nvidia-rtx4070-550", "linux-amd-2x-rx7900xtx-rocm", "linux-intel-arc-a770",
            "linux-arm64-jetson-orin-nx", "windows-ryzen-igpu-arc-b580", "macos-apple-m3",
            "wsl2-nvidia-rtx3060-laptop", "linux-nvidia-nouveau-intel-haswell"]
FIXTURES = [f for f in FIXTURES if (CAPTURES / f / "capture.json").is_file()]

STATS = {"index": Counter(), "files": Counter(), "refused": Counter(), "problems": Counter()}


def replay_bounded(root: Path) -> None:
    """Open ``root`` and detect over it: refused with CaptureFormatError, or a report; bounded."""
    with bounded(f"replay of {root.name}"):
        try:
            system = ReplaySystem(str(root))
        except CaptureFormatError:
            STATS["refused"]()
            return
        report = detect(system, home=HOME, timeout=1.0)  # never raises once the capture loaded
        if any(p.code.startswith("probe_failed_") for p in report.problems):
            STATS["problems"]()


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="accelstack-fuzz-capture-") as d:
        yield Path(d)


def fresh_copy(workdir: Path, name: str) -> Path:
    dest = workdir / "cap"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(CAPTURES / name, dest)
    return dest


# -- strategies -------------------------------------------------------------------------------
HUGE = ["9" * 200_000, "1" * 5000, "-" + "9" * 5000]
ODD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-(2 ** 80), max_value=2 ** 80),
    st.just(10 ** 4000), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
    st.sampled_from(HUGE), st.just("x" * 100_000), st.just("\x00"), st.just("../../../../etc/passwd"),
    st.lists(st.one_of(st.none(), st.integers(), st.text(max_size=5)), max_size=4),
    st.dictionaries(st.text(max_size=5), st.one_of(st.none(), st.integers(), st.text(max_size=5)), max_size=3),
    st.just([[[[[]]]]]), st.just({"a": {"b": {"c": []}}}),
)


def index_mutation() -> Any:
    return node_mutation(ODD_VALUES, 5)


FILE_CONTENTS = st.one_of(
    st.binary(max_size=300),
    st.sampled_from([b"", b"null", b"[]", b"1", b'"x"', b"[1, 2", b"{}", b'{"SPDisplaysDataType": 5}',
                     b'{"SPDisplaysDataType": [5, null, "x"]}', b"\xff\xfe\x00",
                     b"9" * 1_000_000, b"0x" + b"f" * 100_000, b"\n" * 200_000, b"a" * (MAX_CAPTURE_FILE_BYTES + 10)]),
)


@st.composite
def file_mutation(draw: Any) -> Callable[[Path], None]:
    """A function that damages one file of the capture: truncated, bytes flipped, or replaced."""
    pick = draw(st.integers(min_value=0, max_value=100_000))
    how = draw(st.sampled_from(["truncate", "flip", "replace", "append", "every"]))
    where = draw(st.floats(min_value=0.0, max_value=1.0))
    count = draw(st.integers(min_value=1, max_value=8))
    content = draw(FILE_CONTENTS)

    def damage(root: Path) -> None:
        files = sorted(p for p in root.rglob("*") if p.is_file() and p.name not in ("capture.json", "README.md"))
        if not files:
            return
        if how == "every":  # every probe output at once: reaches the parsers a single file would not
            for f in files:
                f.write_bytes(content)
            return
        f = files[pick % len(files)]
        data = f.read_bytes()
        at = int(where * len(data))
        if how == "truncate":
            data = data[:at]
        elif how == "flip" and data:
            buf = bytearray(data)
            for i in range(count):
                j = (at + i * 7919) % len(buf)
                buf[j] ^= 0xFF
            data = bytes(buf)
        elif how == "append":
            data = data[:at] + content + data[at:]
        else:
            data = content
        f.write_bytes(data)

    return damage


# -- targets ----------------------------------------------------------------------------------
@fuzz(250)
@given(name=st.sampled_from(FIXTURES), mutations=st.lists(index_mutation(), min_size=1, max_size=3))
def test_fuzz_capture_json(workdir, name, mutations):
    STATS["index"]()
    root = fresh_copy(workdir, name)
    doc = json.loads((root / "capture.json").read_text(encoding="utf-8"))
    for m in mutations:
        doc = m(doc)
    (root / "capture.json").write_text(json.dumps(doc), encoding="utf-8")
    replay_bounded(root)


@fuzz(200)
@given(name=st.sampled_from(FIXTURES), damages=st.lists(file_mutation(), min_size=1, max_size=3))
def test_fuzz_capture_files(workdir, name, damages):
    STATS["files"]()
    root = fresh_copy(workdir, name)
    for d in damages:
        d(root)
    replay_bounded(root)


def test_fuzz_capture_counts(capsys):
    """Report how many inputs ran (the issue's closing note quotes it); runs after the targets."""
    with capsys.disabled():
        print(f"\nfuzz capture: capture.json {STATS['index'].count}, files {STATS['files'].count}, "
              f"refused {STATS['refused'].count}, with a probe-failed problem {STATS['problems'].count}")


# -- examples that found bugs, kept as plain tests -----------------------------------------------
CPUINFO = "linux-cpu-pentium-e5700-no-avx"  # a fixture with /proc/cpuinfo


def copy_of(tmp_path: Path, name: str = "linux-nvidia-rtx4070-550") -> Path:
    dest = tmp_path / name
    shutil.copytree(CAPTURES / name, dest)
    return dest


def edit_index(root: Path, change: Callable[[dict], Any]) -> None:
    doc = json.loads((root / "capture.json").read_text(encoding="utf-8"))
    change(doc)
    (root / "capture.json").write_text(json.dumps(doc), encoding="utf-8")


@pytest.mark.parametrize("change, field", [
    (lambda d: d.__setitem__("memory", "16G"), "memory"),  # was TypeError in memory()
    (lambda d: d.__setitem__("memory", {"total": 1}), "memory"),
    (lambda d: d.__setitem__("cpu_count", [1, "8"]), "cpu_count[1]"),
    (lambda d: d.__setitem__("env", []), "env"),  # was AttributeError: list has no get
    (lambda d: d.__setitem__("errors", {"/proc/cpuinfo": 13}), "errors['/proc/cpuinfo']"),
    (lambda d: d.__setitem__("dirs", {"/sys/bus/pci/devices": "0000:01:00.0"}), "dirs['/sys/bus/pci/devices']"),
    (lambda d: d.__setitem__("dirs", {"/sys/bus/pci/devices": [".."]}), "dirs['/sys/bus/pci/devices'][0]"),
    (lambda d: d.__setitem__("disk", {"/": "lots"}), "disk['/']"),
    (lambda d: d.__setitem__("commands", {"argv": ["x"]}), "commands"),
    (lambda d: d["commands"][0].__setitem__("argv", "nvidia-smi"), "commands[0].argv"),  # was matching letters
    (lambda d: d["commands"][0].__setitem__("argv", ["nvidia-smi", 5]), "commands[0].argv[1]"),
    (lambda d: d["commands"][0].__setitem__("returncode", "0"), "commands[0].returncode"),
    (lambda d: d["commands"][0].__setitem__("stdout", 5), "commands[0].stdout"),
    (lambda d: d["commands"][0].__setitem__("stdout", "../../../../etc/passwd"), "commands[0].stdout"),
    (lambda d: d["commands"][0].__setitem__("duration_ms", "fast"), "commands[0].duration_ms"),  # was ValueError
    (lambda d: d["commands"][0].__setitem__("timed_out", "no"), "commands[0].timed_out"),
    (lambda d: d["platform"].__setitem__("machine", 64), "platform.machine"),  # was AttributeError on .lower()
    (lambda d: d.__setitem__("platform", "Linux"), "platform"),
    (lambda d: d.__setitem__("which", {"nvidia-smi": True}), "which['nvidia-smi']"),
])
def test_wrong_types_in_capture_json_name_the_field(tmp_path, change, field):
    root = copy_of(tmp_path)
    edit_index(root, change)
    with pytest.raises(CaptureFormatError) as info:
        ReplaySystem(str(root))
    assert f"capture.json: {field}: " in info.value.message


def test_deeply_nested_capture_json_is_a_capture_format_error(tmp_path):
    root = copy_of(tmp_path)
    (root / "capture.json").write_bytes(b'{"format": "accelstack-capture", "env": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    with pytest.raises(CaptureFormatError, match="nests"):
        ReplaySystem(str(root))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this OS")
def test_a_fifo_in_a_capture_is_refused_without_being_opened(tmp_path):
    root = copy_of(tmp_path, CPUINFO)
    cpuinfo = root / "files" / "proc" / "cpuinfo"
    cpuinfo.unlink()
    os.mkfifo(cpuinfo)  # opening it for reading would block forever
    with pytest.raises(CaptureFormatError, match="files/proc/cpuinfo is not a regular file"):
        ReplaySystem(str(root))


def test_a_symlink_in_a_capture_is_refused(tmp_path):
    root = copy_of(tmp_path, CPUINFO)
    secret = tmp_path / "secret"
    secret.write_text("not the capture's")
    cpuinfo = root / "files" / "proc" / "cpuinfo"
    cpuinfo.unlink()
    cpuinfo.symlink_to(secret)
    with pytest.raises(CaptureFormatError, match="not a regular file"):
        ReplaySystem(str(root))


def test_replayed_reads_are_capped_like_live_reads(tmp_path):
    from accelstack.hardware.live import LiveSystem

    root = copy_of(tmp_path, CPUINFO)
    (root / "files" / "proc" / "cpuinfo").write_bytes(b"flags\t: avx2\n" + b"x" * (20 << 20))  # 20 MB
    system = ReplaySystem(str(root))
    assert ReplaySystem.MAX_READ == LiveSystem.MAX_READ == MAX_CAPTURE_FILE_BYTES
    assert len(system.read_text("/proc/cpuinfo")) == MAX_CAPTURE_FILE_BYTES
    with bounded("detect over a 20 MB cpuinfo"):
        detect(system, home=HOME)


def test_a_driver_version_of_a_million_digits_is_a_problem_not_a_crash(tmp_path):
    root = copy_of(tmp_path)
    (root / "files" / "sys" / "module" / "nvidia" / "version").write_bytes(b"9" * 1_000_000 + b"\n")
    report = detect(ReplaySystem(str(root)), home=HOME)
    assert report.gpus  # the rest of detection went on


@pytest.mark.parametrize("output", [b"[]", b"5", b"null", b'"text"', b'{"SPDisplaysDataType": 5}',
                                    b'{"SPDisplaysDataType": [5, null]}'])
def test_system_profiler_json_that_is_not_an_object_does_not_raise(tmp_path, output):
    root = copy_of(tmp_path, "macos-apple-m3")
    doc = json.loads((root / "capture.json").read_text(encoding="utf-8"))
    for c in doc["commands"]:
        if c["argv"][0] == "system_profiler" and c.get("stdout"):
            (root / c["stdout"]).write_bytes(output)
    report = detect(ReplaySystem(str(root)), home=HOME)
    assert report.os.name == "macos"


@pytest.mark.parametrize("output", [b"[]", b"5", b"null", b'"text"', b"[" * 100_000, b'{"DriverVersion": [5]}',
                                    b'[{"MatchingDeviceId": 5, "DriverVersion": "31.0.15.5222"}, null]', b"\xff\xfe garbage"])
def test_registry_driver_json_that_is_no_list_of_keys_does_not_raise(tmp_path, output):
    """The Windows registry read of an NVIDIA GPU's driver version (issue 27): garbage gives no version."""
    root = copy_of(tmp_path, "windows-nvidia-rtx4060-laptop-driver-from-registry")
    doc = json.loads((root / "capture.json").read_text(encoding="utf-8"))
    for c in doc["commands"]:
        if "DriverVersion)" in c["argv"][-1] and c.get("stdout"):
            (root / c["stdout"]).write_bytes(output)
    report = detect(ReplaySystem(str(root)), home=HOME)
    assert report.gpus[1].driver_version == "" and "nvidia_driver_version_unknown" in report.problem_codes()


def test_a_failing_probe_stage_becomes_a_problem_and_detection_goes_on(tmp_path, monkeypatch):
    from accelstack.hardware import linux

    def broken(*args: Any) -> None:
        raise ValueError("invalid literal for int() with base 10: '999…'")

    monkeypatch.setattr(linux, "gpus", broken)
    report = detect(ReplaySystem(str(copy_of(tmp_path))), home=HOME)
    problem = next(p for p in report.problems if p.code == "probe_failed_gpus")
    assert problem.message.startswith("could not read gpus: ValueError") and problem.action.value == "report-bug"
    assert report.gpus == [] and report.api("cpu").usable  # the other stages still ran


def test_only_typed_errors_escape_the_replay_of_every_fixture(tmp_path):
    """Sanity for the bounds: every committed fixture replays within them."""
    for name in sorted(p.name for p in CAPTURES.iterdir() if (p / "capture.json").is_file()):
        try:
            with bounded(name):
                detect(ReplaySystem(str(CAPTURES / name)), home=HOME)
        except AccelstackError as exc:  # pragma: no cover - a fixture must replay
            pytest.fail(f"{name}: {exc}")


def test_a_gpu_name_read_from_a_4_mb_file_does_not_stall_the_name_rules(tmp_path):
    """Found by test_fuzz_capture_files: a Jetson's /proc/device-tree/model replaced by 4 MB made
    every GPU-name rule scan all of it (about 7 s); names are matched on their first
    MAX_NAME_LENGTH characters."""
    root = copy_of(tmp_path, "linux-arm64-jetson-orin-nx")
    (root / "files" / "proc" / "device-tree" / "model").write_bytes(b"a" * (MAX_CAPTURE_FILE_BYTES + 10))
    with bounded("detect over a 4 MB device-tree model"):
        detect(ReplaySystem(str(root)), home=HOME)


@pytest.mark.parametrize("output", [b"[" * 100_000, b'{"gpus": ' * 50_000])
def test_the_first_powershell_query_nested_past_the_parsers_depth_is_garbage_not_a_failed_stage(tmp_path, output):
    """JSON nested deeper than the parser goes raises RecursionError, not ValueError: the report says the
    query printed what could not be understood (a hint to capture), not that a detection stage broke."""
    root = copy_of(tmp_path, "windows-nvidia-rtx4060-591")
    doc = json.loads((root / "capture.json").read_text(encoding="utf-8"))
    first = next(c for c in doc["commands"] if c["argv"][0] == "powershell" and c.get("stdout"))
    (root / first["stdout"]).write_bytes(output)
    report = detect(ReplaySystem(str(root)), home=HOME)
    codes = report.problem_codes()
    assert "powershell_garbage" in codes and not any(c.startswith("probe_failed") for c in codes), codes


def test_a_vulkan_probe_answer_nested_past_the_parsers_depth_is_no_result():
    from accelstack.hardware import vulkan

    assert vulkan.parse("[" * 100_000) == ("", [], "the Vulkan probe printed no result")
