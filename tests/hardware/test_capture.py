"""Capture and replay: what a capture records replays to the same report, here and through the CLI."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

import pytest

from accelstack.cli import main
from accelstack.core.detection import detect as core_detect
from accelstack.errors import Action, UsageError
from accelstack.hardware import detect
from accelstack.hardware.report import HardwareReport
from accelstack.hardware.system import CAPTURE_VERSION, CapturingSystem, LiveSystem, ReplaySystem
from accelstack.serde import to_dict

from .conftest import CAPTURES, TEST_HOME, fixture_names, replay
from cli_helpers import result_of


def comparable(report: HardwareReport) -> Dict[str, Any]:
    data = to_dict(report)
    data.pop("duration_ms")
    data.pop("source")
    return data


def test_live_capture_replays_to_the_same_report(tmp_path):
    capturing = CapturingSystem(LiveSystem())
    live = detect(capturing, home=TEST_HOME)
    capturing.save(str(tmp_path / "cap"))

    index = json.loads((tmp_path / "cap" / "capture.json").read_text(encoding="utf-8"))
    assert index["format"] == "accelstack-capture" and index["version"] == CAPTURE_VERSION
    assert index["platform"]["system"] == LiveSystem().platform().system
    for cmd in index["commands"]:
        assert (tmp_path / "cap" / cmd["stdout"]).is_file() and (tmp_path / "cap" / cmd["stderr"]).is_file()
    if Path("/proc/cpuinfo").is_file():
        assert (tmp_path / "cap" / "files" / "proc" / "cpuinfo").read_text(encoding="utf-8") == Path("/proc/cpuinfo").read_text(encoding="utf-8")

    replayed = replay(tmp_path / "cap")
    assert comparable(replayed) == comparable(live)


@pytest.mark.parametrize("name", fixture_names())
def test_recapturing_a_replay_is_lossless(name, tmp_path):
    """CapturingSystem over a ReplaySystem writes a capture that replays identically (the writer keeps
    commands, links, errors, platform facts and Windows paths)."""
    capturing = CapturingSystem(ReplaySystem(str(CAPTURES / name)))
    first = detect(capturing, home=TEST_HOME)
    capturing.save(str(tmp_path / "again"))
    assert comparable(replay(tmp_path / "again")) == comparable(first)


def test_a_capture_is_never_written_over_other_files(tmp_path, capsys):
    """An older capture's files/ would mix into the new one on replay, and a user's files are not
    accelstack's to overwrite: only a new or empty directory takes a capture."""
    name = fixture_names()[0]
    capturing = CapturingSystem(ReplaySystem(str(CAPTURES / name)))
    detect(capturing, home=TEST_HOME)
    (tmp_path / "empty").mkdir()
    assert (capturing.save(str(tmp_path / "empty")) / "capture.json").is_file()
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    (tmp_path / "notes.txt").write_text("mine")
    for occupied in (tmp_path / "empty", tmp_path, tmp_path / "notes.txt"):
        with pytest.raises(UsageError) as err:
            capturing.save(str(occupied))
        assert "not an empty directory" in err.value.message and err.value.action is Action.FIX_INPUT
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == sorted(before + ["notes.txt"])
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert main(["detect", "--capture", str(tmp_path / "empty")]) == 2
    assert "not an empty directory" in capsys.readouterr().err


def test_cli_capture_then_replay(tmp_path, capsys):
    cap = tmp_path / "bug-report"
    assert main(["detect", "--capture", str(cap), "--json"]) == 0
    captured = result_of(capsys.readouterr().out)
    assert (cap / "capture.json").is_file()
    assert main(["detect", "--replay", str(cap), "--json"]) == 0
    replayed = result_of(capsys.readouterr().out)
    for data in (captured, replayed):
        data.pop("duration_ms")
    assert replayed.pop("source") == f"replay:{cap}" and captured.pop("source") == "live"
    assert replayed == captured


@pytest.mark.parametrize("name", ["windows-ryzen-igpu-arc-b580", "linux-nvidia-8x-b200-580", "macos-apple-m3-pro-truncated-json"])
def test_cli_replay_json_equals_the_library(name, capsys):
    directory = str(CAPTURES / name)
    assert main(["detect", "--replay", directory, "--json"]) == 0
    out = result_of(capsys.readouterr().out)
    lib = to_dict(core_detect(ReplaySystem(directory)))  # the replayed machine's home rule, as the CLI
    assert out.pop("source") == f"replay:{directory}"
    out.pop("duration_ms"), lib.pop("duration_ms"), lib.pop("source")
    assert out == lib


def test_cli_human_output_names_gpus_apis_and_problems(capsys):
    assert main(["detect", "--replay", str(CAPTURES / "windows-ryzen-igpu-arc-b580")]) == 0
    text = capsys.readouterr().out
    for words in ("Intel(R) Arc(TM) B580 Graphics", "AMD Radeon(TM) Graphics", "gfx1036", "Xe2-HPG (Battlemage)", "1. xpu on GPU 1", "from replay:"):
        assert words in text

    assert main(["detect", "--replay", str(CAPTURES / "linux-nvidia-nouveau-intel-haswell")]) == 0
    text = capsys.readouterr().out
    assert "NVIDIA GeForce GTX 1060 6GB" in text and "Problems" in text
    assert "has no NVIDIA driver loaded (it uses nouveau)" in text and "what to do: install the NVIDIA proprietary driver" in text

    assert main(["detect", "--replay", str(CAPTURES / "linux-cpu-pentium-e5700-no-avx")]) == 0
    text = capsys.readouterr().out
    assert "GPUs     none found" in text and "has no AVX2" in text and "x86-64-v1" in text


def test_cli_rejects_capture_with_replay(capsys, tmp_path):
    assert main(["detect", "--replay", str(CAPTURES / "macos-apple-m3"), "--capture", str(tmp_path / "x")]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_the_documented_example_replays(tmp_path):
    """docs/capture-format.md's hand-written fixture is a working capture."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "capture-format.md").read_text(encoding="utf-8")
    blocks = [b.split("```", 1)[0] for b in doc.split("```json\n")[1:]]
    full, example = (json.loads(b) for b in blocks)
    assert full["version"] == CAPTURE_VERSION and set(full) >= {"platform", "env", "exists", "access", "links", "dirs", "errors", "commands"}
    root = tmp_path / "rtx4070"
    (root / "commands").mkdir(parents=True)
    (root / "capture.json").write_text(json.dumps(example), encoding="utf-8")
    listing = doc.split("rtx4070/\n", 1)[1].split("```", 1)[0]
    for line in listing.splitlines()[1:]:
        rel, _, content = line.strip().partition(" ")
        content = "" if content.strip() == "(empty)" else content.strip() + "\n"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(content, encoding="utf-8")
    g = replay(root).gpus[0]
    assert (g.name, g.bus_id, g.driver, g.compute_capability, g.cuda_driver_version) == ("NVIDIA GeForce RTX 4070", "0000:2d:00.0", "nvidia", "8.9", "12.4")
