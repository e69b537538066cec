"""The Vulkan enumeration kept between runs (hardware/vulkan_cache.py), on this machine's real
lavapipe: a second detection does not start the child; a changed driver manifest, ``--refresh``
or a damaged or planted cache file makes it run again; a capture runs it for real and its replay
gives the report the cached live run gave; the child runs beside the other probes.

Children are counted, never timed: a LiveSystem that notes each start, or (through the CLI) a
``python3`` on PATH that writes a line to a marker file before it runs the probe.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import threading
from pathlib import Path
from typing import Any, Dict, List, Sequence

import pytest

from accelstack.cli import main
from accelstack.core.detection import detect as core_detect
from accelstack.hardware import detect, vulkan_cache
from accelstack.hardware import vulkan as vk
from accelstack.hardware.common import Probe
from accelstack.hardware.linux import pci_gpus
from accelstack.hardware.protocol import DEFAULT_TIMEOUT, CommandResult, RunningCommand
from accelstack.hardware.report import HardwareReport
from accelstack.hardware.system import CapturingSystem, LiveSystem, ReplaySystem
from accelstack.limits import MAX_DETECT_CACHE_BYTES, MAX_DETECT_CACHE_ENTRIES
from accelstack.serde import to_dict

from .conftest import TEST_HOME
from .test_vulkan_devices import needs_lavapipe
from cli_helpers import result_of

LVP_ICD = next((Path(d, f"lvp_icd.{a}.json") for d in ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d")
                for a in ("x86_64", "aarch64") if Path(d, f"lvp_icd.{a}.json").is_file()), None)


class Counting(LiveSystem):
    """This machine, noting every Vulkan probe started and, in ``events``, reads and collections."""

    def __init__(self) -> None:
        self.probes = 0
        self.events: List[str] = []

    def read_text(self, path: str) -> str:
        self.events.append(f"read {path}")
        return super().read_text(path)

    def start(self, argv: Sequence[str], timeout: float = DEFAULT_TIMEOUT) -> RunningCommand:
        running = super().start(argv, timeout)
        if list(argv) != vk.probe_argv():
            return running
        self.probes += 1
        self.events.append("vulkan started")
        events = self.events

        class Noted:
            def result(self) -> CommandResult:
                events.append("vulkan collected")
                return running.result()

        return Noted()


def comparable(report: HardwareReport) -> Dict[str, Any]:
    """The report but what changes from one run to the next (available RAM, free disk, time)."""
    data = to_dict(report)
    for key in ("duration_ms", "source", "memory"):
        data.pop(key)
    return data


@pytest.fixture
def own_icd(tmp_path, monkeypatch) -> Path:
    """The loader pointed at a copy of lavapipe's manifest, so a test may touch it."""
    if LVP_ICD is None:
        pytest.skip("no lavapipe manifest here (scripts/setup-vulkan.sh installs it)")
    icd = tmp_path / "icd" / "lvp_icd.json"
    icd.parent.mkdir()
    shutil.copyfile(LVP_ICD, icd)
    for name in ("VK_DRIVER_FILES", "VK_ICD_FILENAMES"):
        monkeypatch.setenv(name, str(icd))
    return icd


def _entries(cache: Path) -> List[Path]:
    return sorted(cache.glob("vulkan-*.json"))


@needs_lavapipe
def test_the_second_detection_does_not_start_the_child(tmp_path):
    system, cache = Counting(), tmp_path / "detect"
    first = detect(system, home=TEST_HOME, cache=cache)
    assert system.probes == 1 and len(_entries(cache)) == 1
    assert any(d.driver_name == "llvmpipe" for d in first.vulkan_devices)
    second = detect(system, home=TEST_HOME, cache=cache)
    assert system.probes == 1, "the kept enumeration was not used"
    assert comparable(second) == comparable(first)


@needs_lavapipe
def test_a_changed_driver_manifest_or_refresh_runs_it_again(own_icd, tmp_path):
    system, cache = Counting(), tmp_path / "detect"
    first = detect(system, home=TEST_HOME, cache=cache)
    assert [d.driver_name for d in first.vulkan_devices] == ["llvmpipe"]
    detect(system, home=TEST_HOME, cache=cache)
    assert system.probes == 1
    st = own_icd.stat()
    os.utime(own_icd, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the same bytes, a new mtime
    detect(system, home=TEST_HOME, cache=cache)
    assert system.probes == 2
    own_icd.write_text(own_icd.read_text(encoding="utf-8") + "\n", encoding="utf-8")  # new content
    detect(system, home=TEST_HOME, cache=cache)
    assert system.probes == 3
    detect(system, home=TEST_HOME, cache=cache)
    assert system.probes == 3
    again = detect(system, home=TEST_HOME, cache=cache, refresh=True)
    assert system.probes == 4 and comparable(again) == comparable(first)
    detect(system, home=TEST_HOME, cache=cache)
    assert system.probes == 4  # refresh kept its answer


@needs_lavapipe
def test_another_driver_set_is_another_entry(own_icd, tmp_path, monkeypatch):
    """The loader pointed elsewhere (another VK_DRIVER_FILES) is a miss; pointed back, a hit."""
    system, cache = Counting(), tmp_path / "detect"
    detect(system, home=TEST_HOME, cache=cache)
    for name in ("VK_DRIVER_FILES", "VK_ICD_FILENAMES"):
        monkeypatch.setenv(name, str(tmp_path / "none.json"))
    nothing = detect(system, home=TEST_HOME, cache=cache)
    assert system.probes == 2 and nothing.vulkan_devices == []
    assert "vulkan_enumeration_failed" in nothing.problem_codes()
    for name in ("VK_DRIVER_FILES", "VK_ICD_FILENAMES"):
        monkeypatch.setenv(name, str(own_icd))
    back = detect(system, home=TEST_HOME, cache=cache)
    assert system.probes == 2 and [d.driver_name for d in back.vulkan_devices] == ["llvmpipe"]
    # the loader's answer without drivers (exit 0: a clean answer, not a crash) was kept as well
    assert len(_entries(cache)) == 2


def _planted(tmp_path: Path) -> Path:
    """A warm cache's one entry (its name is the key of this machine's inputs)."""
    cache = tmp_path / "detect"
    detect(Counting(), home=TEST_HOME, cache=cache)
    (entry,) = _entries(cache)
    return entry


def _fake_devices(entry: Path, **change: Any) -> bytes:
    data = json.loads(entry.read_text(encoding="utf-8"))
    probe = json.loads(data["stdout"])
    probe["devices"][0]["name"] = "Planted GPU"
    data["stdout"] = json.dumps(probe) + "\n"
    for key, value in change.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = value
    return json.dumps(data).encode("utf-8")


def _plant(entry: Path, kind: str, tmp_path: Path) -> None:
    if kind == "fifo":
        entry.unlink()
        os.mkfifo(entry)
    elif kind == "symlink":
        elsewhere = tmp_path / "elsewhere.json"
        elsewhere.write_bytes(_fake_devices(entry))  # a well-formed entry for exactly these inputs, but a link
        entry.unlink()
        entry.symlink_to(elsewhere)
    elif kind == "huge":
        entry.write_bytes(_fake_devices(entry, stderr=" " * MAX_DETECT_CACHE_BYTES))
    elif kind == "bad json":
        entry.write_bytes(b'{"format": "accelstack-detect-cache", "version": 1, "stdout": ')
    elif kind == "wrong key":
        data = json.loads(_fake_devices(entry))
        data["inputs"]["env"]["VK_DRIVER_FILES"] = "/planted/icd.json"
        entry.write_text(json.dumps(data), encoding="utf-8")
    elif kind == "failed run":
        entry.write_bytes(_fake_devices(entry, returncode=-11))
    elif kind == "not an object":
        entry.write_text("[1, 2, 3]", encoding="utf-8")
    elif kind == "stdout not text":
        entry.write_bytes(_fake_devices(entry, stdout=None))
    elif kind == "a directory":
        entry.unlink()
        entry.mkdir()
    else:  # pragma: no cover
        raise AssertionError(kind)


@needs_lavapipe
@pytest.mark.parametrize("kind", ["huge", "symlink", "fifo", "bad json", "wrong key", "failed run", "not an object",
                                  "stdout not text", "a directory"])
def test_a_hostile_cache_file_is_ignored(kind, tmp_path):
    entry = _planted(tmp_path)
    _plant(entry, kind, tmp_path)
    system = Counting()
    reports: List[HardwareReport] = []
    worker = threading.Thread(target=lambda: reports.append(detect(system, home=TEST_HOME, cache=entry.parent)),
                              daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "detection blocked on the planted cache file"
    (report,) = reports
    assert system.probes == 1, "the planted file was used"
    assert [d.driver_name for d in report.vulkan_devices] and "Planted GPU" not in [d.name for d in report.vulkan_devices]
    assert not [p for p in report.problems if p.code.startswith("probe_failed")]
    if kind == "symlink":
        assert b"Planted GPU" in (tmp_path / "elsewhere.json").read_bytes()  # the link's target is untouched
    if kind != "a directory":  # the answer was kept again, as a regular file in the link's or FIFO's place
        assert stat.S_ISREG(os.lstat(entry).st_mode)
        detect(system, home=TEST_HOME, cache=entry.parent)
        assert system.probes == 1


def test_a_planted_answer_for_these_inputs_is_what_detection_reports(builder, tmp_path):
    """The other side of the key: a well-formed entry for exactly these inputs is used as the
    probe's output (so the tests above prove the bounds, not a cache that is never read)."""
    b = builder()
    b.file("/usr/lib/x86_64-linux-gnu/libvulkan.so.1", "")
    b.file("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json", "{}")
    b.command(vk.probe_argv(), stdout='{"loader": "1.3.239", "devices": [], "error": ""}\n')
    system = ReplaySystem(str(b.write(tmp_path / "machine")))
    cache = tmp_path / "detect"
    detect(system, home=TEST_HOME, cache=cache)  # a replay run through the cache code: keeps its answer
    (entry,) = _entries(cache)
    data = json.loads(entry.read_text(encoding="utf-8"))
    data["stdout"] = json.dumps({"loader": "1.3.239", "error": "", "devices": [
        {"index": 0, "name": "Planted GPU", "type": 2, "vendor_id": 0x10DE, "device_id": 0x2684}]}) + "\n"
    entry.write_text(json.dumps(data), encoding="utf-8")
    report = detect(ReplaySystem(str(tmp_path / "machine")), home=TEST_HOME, cache=cache)
    assert [d.name for d in report.vulkan_devices] == ["Planted GPU"]


@needs_lavapipe
def test_only_the_newest_entries_are_kept(tmp_path, monkeypatch):
    cache = tmp_path / "detect"
    cache.mkdir()
    mine = cache / "notes.txt"
    mine.write_text("not accelstack's")
    for i in range(MAX_DETECT_CACHE_ENTRIES + 2):
        monkeypatch.setenv("VK_LOADER_DEVICE_SELECT", f"none-{i}")  # each a set of inputs of its own
        detect(Counting(), home=TEST_HOME, cache=cache)
    assert len(_entries(cache)) == MAX_DETECT_CACHE_ENTRIES and mine.read_text() == "not accelstack's"


@needs_lavapipe
def test_a_replayed_capture_gives_the_report_the_cached_live_run_gave(tmp_path):
    system, cache = Counting(), tmp_path / "detect"
    detect(system, home=TEST_HOME, cache=cache)
    live = detect(system, home=TEST_HOME, cache=cache)
    assert system.probes == 1  # the live report came from the cache
    counted = Counting()
    capturing = CapturingSystem(counted)
    captured = core_detect(capturing)  # the core gives a capture no cache: it runs the child for real
    assert counted.probes == 1
    root = capturing.save(str(tmp_path / "capture"))
    index = json.loads((root / "capture.json").read_text(encoding="utf-8"))
    assert [c["argv"] for c in index["commands"]].count(vk.probe_argv()) == 1
    replayed = detect(ReplaySystem(str(root)), home=TEST_HOME)
    assert comparable(replayed) == comparable(live)
    assert to_dict(replayed)["vulkan_devices"] == to_dict(captured)["vulkan_devices"]


@needs_lavapipe
def test_the_child_runs_beside_the_other_probes(tmp_path):
    """Started before the GPUs' driver versions are read (and nvidia-smi asked), collected after."""
    system = Counting()
    detect(system, home=TEST_HOME, cache=tmp_path / "detect")
    events = system.events
    started, collected = events.index("vulkan started"), events.index("vulkan collected")
    assert started < events.index("read /sys/module/nvidia/version", started) < collected
    assert not [e for e in events[collected:] if e.startswith("read /sys/bus/pci")]


def _python3_counting_runs(bin_dir: Path, marker: Path, *, crash: bool = False) -> None:
    """``python3`` on PATH: a line in ``marker`` per run, then the real interpreter (or a crash)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    tail = "kill -SEGV $$" if crash else f'exec "{sys.executable}" "$@"'
    script = bin_dir / "python3"
    script.write_text(f'#!/bin/sh\necho run >> "{marker}"\n{tail}\n', encoding="utf-8")
    script.chmod(0o755)


def _runs(marker: Path) -> int:
    return len(marker.read_text().splitlines()) if marker.exists() else 0


@needs_lavapipe
def test_cli_detect_uses_the_kept_answer_and_refresh_runs_it_again(tmp_path, monkeypatch, capsys):
    marker = tmp_path / "runs"
    _python3_counting_runs(tmp_path / "bin", marker)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("ACCELSTACK_CACHE", str(tmp_path / "cache"))
    reports = []
    for argv, runs in ((["detect", "--json"], 1), (["detect", "--json"], 1), (["detect", "--json", "--refresh"], 2),
                       (["detect", "--json"], 2)):
        assert main(argv) == 0
        reports.append(result_of(capsys.readouterr().out))
        assert _runs(marker) == runs, argv
    assert list((tmp_path / "cache" / "detect").glob("vulkan-*.json"))
    for r in reports:
        for key in ("duration_ms", "memory"):
            r.pop(key)
    assert all(r == reports[0] for r in reports) and reports[0]["vulkan_devices"]


@needs_lavapipe
def test_a_crashing_driver_is_asked_again_next_time(tmp_path, monkeypatch):
    marker = tmp_path / "runs"
    _python3_counting_runs(tmp_path / "bin", marker, crash=True)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    cache = tmp_path / "detect"
    for runs in (1, 2):
        report = detect(LiveSystem(), home=TEST_HOME, cache=cache)
        assert "vulkan_probe_crashed" in report.problem_codes() and _runs(marker) == runs
    assert _entries(cache) == []


def test_the_key_names_what_the_enumeration_depends_on(builder, tmp_path):
    b = builder(release="6.1.0-18-amd64")
    b.pci("0000:01:00.0", "030000", "10de", "2684", driver="nvidia")
    b.file("/sys/module/nvidia/version", "550.54.14\n")
    b.file("/usr/lib/x86_64-linux-gnu/libvulkan.so.1", "")
    b.file("/usr/share/vulkan/icd.d/nvidia_icd.json", "{}")
    b.file("/home/ann/.local/share/vulkan/implicit_layer.d/steam.json", "{}")
    b.env.update({"HOME": "/home/ann", "VK_ADD_DRIVER_FILES": "/opt/icd/extra.json"})
    system = ReplaySystem(str(b.write(tmp_path / "m")))
    probe = Probe(system)
    inputs = vulkan_cache.inputs(probe, "/usr/lib/x86_64-linux-gnu/libvulkan.so.1", system.platform(), pci_gpus(probe))
    assert set(inputs["manifests"]) == {"/usr/share/vulkan/icd.d/nvidia_icd.json", "/opt/icd/extra.json",
                                        "/home/ann/.local/share/vulkan/implicit_layer.d/steam.json"}
    assert inputs["gpus"] == [["0000:01:00.0", "10de", "2684", "nvidia"]]
    assert inputs["modules"]["/sys/module/nvidia/version"] == "550.54.14"
    assert inputs["kernel"][0] == "6.1.0-18-amd64"
    assert inputs["env"] == {"HOME": "/home/ann", "VK_ADD_DRIVER_FILES": "/opt/icd/extra.json"}
    assert inputs["loader"][0] == "/usr/lib/x86_64-linux-gnu/libvulkan.so.1"
    assert probe.problems == []


def test_a_driver_library_rebuilt_in_place_is_a_new_key(tmp_path):
    """A driver manifest names its library; rebuilding that library (``ninja install`` into /opt)
    keeps the manifest as it was, and must still make the kept answer stale."""
    from accelstack.hardware.common import Probe
    from accelstack.hardware.live import LiveSystem
    from accelstack.hardware.vulkan_cache import _driver_libraries

    lib = tmp_path / "libvulkan_test.so"
    lib.write_bytes(b"one")
    manifest = tmp_path / "test_icd.json"
    manifest.write_text('{"file_format_version": "1.0.0", "ICD": {"library_path": "%s", "api_version": "1.3.0"}}' % lib)
    fifo = tmp_path / "fifo_icd.json"
    os.mkfifo(fifo)  # never opened: a FIFO has no size to read
    probe = Probe(LiveSystem(), timeout=5)
    stamps = {str(p): list(LiveSystem().stat(str(p)) or []) or None for p in (manifest, fifo)}
    before = _driver_libraries(probe, stamps)
    lib.write_bytes(b"two, longer")
    after = _driver_libraries(probe, stamps)
    assert before[str(manifest)][0] == str(lib) and before != after
    assert str(fifo) not in before
