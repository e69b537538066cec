"""Where detection measures free disk: the home every other command uses (``Settings.home``), found
by the same rule on the machine being looked at, so a replayed Windows capture gets a Windows home.

The core (``accelstack.core.detection.detect``) applies the rule; ``accelstack.hardware.detect``
is given the home (or the rule) and resolves nothing itself."""
from __future__ import annotations

import json

import accelstack
from accelstack.core.detection import detect
from accelstack.hardware import detect as hardware_detect
from accelstack.hardware.system import CapturingSystem, LiveSystem, ReplaySystem
from accelstack.settings import Settings

from .conftest import TEST_HOME

GB = 10 ** 9


def test_windows_capture_resolves_a_windows_home(builder, tmp_path):
    b = builder(system="Windows", machine="AMD64")
    b.env.update({"LOCALAPPDATA": "C:\\Users\\ann\\AppData\\Local", "USERPROFILE": "C:\\Users\\ann"})
    b.disk["C:\\Users\\ann\\AppData\\Local\\accelstack"] = 321 * GB
    r = detect(ReplaySystem(str(b.write(tmp_path / "c"))))
    assert (r.memory.disk_path, r.memory.disk_free) == ("C:\\Users\\ann\\AppData\\Local\\accelstack", 321 * GB)


def test_windows_capture_without_localappdata_uses_the_profile(builder, tmp_path):
    b = builder(system="Windows", machine="AMD64")
    b.env["USERPROFILE"] = "D:\\Profiles\\bob"
    r = detect(ReplaySystem(str(b.write(tmp_path / "c"))))
    assert r.memory.disk_path == "D:\\Profiles\\bob\\AppData\\Local\\accelstack"


def test_macos_capture_resolves_application_support(builder, tmp_path):
    b = builder(system="Darwin", machine="arm64")
    b.env["HOME"] = "/Users/ann"
    r = detect(ReplaySystem(str(b.write(tmp_path / "c"))))
    assert r.memory.disk_path == "/Users/ann/Library/Application Support/accelstack"


def test_linux_capture_follows_xdg_then_accelstack_home(builder, tmp_path):
    b = builder()
    b.env.update({"HOME": "/home/ann", "XDG_DATA_HOME": "/data/ann"})
    assert detect(ReplaySystem(str(b.write(tmp_path / "xdg")))).memory.disk_path == "/data/ann/accelstack"
    b.env["ACCELSTACK_HOME"] = "/srv/runtimes"
    b.disk["/srv/runtimes"] = 7 * GB
    r = detect(ReplaySystem(str(b.write(tmp_path / "home"))))
    assert (r.memory.disk_path, r.memory.disk_free) == ("/srv/runtimes", 7 * GB)


def test_an_explicit_home_wins(builder, tmp_path):
    b = builder()
    b.env["ACCELSTACK_HOME"] = "/srv/runtimes"
    r = hardware_detect(ReplaySystem(str(b.write(tmp_path / "c"))), home=TEST_HOME)
    assert r.memory.disk_path == str(TEST_HOME)


def test_live_default_is_the_settings_home(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELSTACK_HOME", str(tmp_path / "runtimes"))
    for report in (accelstack.detect(), detect(LiveSystem())):
        assert report.memory.disk_path == str(Settings.resolve().home) == str(tmp_path / "runtimes")
        assert report.memory.disk_free and report.source == "live"


def test_a_capture_records_what_the_home_rule_read(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELSTACK_HOME", str(tmp_path / "runtimes"))
    capturing = CapturingSystem(LiveSystem())
    live = detect(capturing)
    capturing.save(str(tmp_path / "cap"))
    index = json.loads((tmp_path / "cap" / "capture.json").read_text(encoding="utf-8"))
    assert index["env"]["ACCELSTACK_HOME"] == str(tmp_path / "runtimes")
    assert not any(name.startswith("ACCELSTACK_") and name != "ACCELSTACK_HOME" for name in index["env"])
    monkeypatch.delenv("ACCELSTACK_HOME")  # the replay reads the captured machine, not this one
    replayed = detect(ReplaySystem(str(tmp_path / "cap")))
    assert (replayed.memory.disk_path, replayed.memory.disk_free) == (live.memory.disk_path, live.memory.disk_free)
