"""The progress renderer and events: JSON lines with a timestamp and a stage index, plain
timestamped lines (throttled, with a heartbeat) when output is not a terminal, bars that never
sit at ``0it``, and the build lock's wait shown while another process holds it."""
from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from accelstack.commands import progress as progress_mod
from accelstack.commands.progress import ProgressRenderer, configure, progress_renderer
from accelstack.commands.progress_format import local_time
from accelstack.events import STAGE_ORDER, ProgressEvent, iso_utc

LINE = re.compile(r"^\d\d:\d\d:\d\d \[[a-z]+\]")


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lines_renderer(**kw):
    out, clock = io.StringIO(), Clock()
    return ProgressRenderer("lines", stream=out, clock=clock, ticker=False, **kw), out, clock


def test_event_json_has_an_iso_utc_timestamp_and_a_stage_index():
    ev = ProgressEvent("start", "verify", task="cpu runtime", total=4, ts=1_800_000_000.25)
    line = json.loads(ev.to_json())
    assert line["ts"] == "2027-01-15T08:00:00.250Z" == iso_utc(1_800_000_000.25)
    assert datetime.strptime(line["ts"], "%Y-%m-%dT%H:%M:%S.%fZ")
    assert line["stage_index"] == STAGE_ORDER.index("verify")
    assert json.loads(ev.to_json(stage_index=3))["stage_index"] == 3
    assert json.loads(ProgressEvent("start", "something-new").to_json())["stage_index"] == len(STAGE_ORDER)
    assert abs(ProgressEvent("start", "x").ts - time.time()) < 5  # stamped when made
    assert ProgressEvent("start", "x", ts=1.0) == ProgressEvent("start", "x", ts=2.0)  # the time is not identity


def test_json_mode_counts_stages_in_the_order_met_and_done_advances():
    out, clock = io.StringIO(), Clock()
    r = ProgressRenderer("json", json_stream=out, clock=clock)
    r(ProgressEvent("start", "probe", task="probe model", total=10))
    r(ProgressEvent("start", "verify", task="cpu runtime", total=3))
    for done in (1, 2, 3):
        clock.now += 1
        r(ProgressEvent("advance", "verify", task="cpu runtime", done=done, total=3))
    r(ProgressEvent("end", "probe", task="probe model", ok=True, done=10, total=10))
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert all(x["event"] == "progress" and x["ts"].endswith("Z") for x in lines)
    assert [x["stage_index"] for x in lines] == [0, 1, 1, 1, 1, 0]
    assert [x["done"] for x in lines if x["kind"] == "advance"] == [1, 2, 3]
    stamps = [x["ts"] for x in lines]
    assert stamps == sorted(stamps)


def test_json_advances_are_thinned_per_task_but_starts_ends_and_the_last_step_all_come():
    out, clock = io.StringIO(), Clock()
    r = ProgressRenderer("json", json_stream=out, clock=clock, json_interval=0.25)
    r(ProgressEvent("start", "probe", task="probe model", total=1000))
    r(ProgressEvent("message", "probe", task="probe model", message="synthesizing"))
    for done in range(1, 1001):  # 1000 tensors in 1 s
        clock.now += 0.001
        r(ProgressEvent("advance", "probe", task="probe model", done=done, total=1000))
    r(ProgressEvent("end", "probe", task="probe model", ok=True, done=1000, total=1000))
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    advances = [x["done"] for x in lines if x["kind"] == "advance"]
    assert 4 <= len(advances) <= 6 and advances[-1] == 1000 and advances == sorted(advances)
    assert [x["kind"] for x in lines if x["kind"] != "advance"] == ["start", "message", "end"]


def test_auto_mode_is_bars_on_a_terminal_and_lines_otherwise():
    assert ProgressRenderer("auto", stream=io.StringIO()).mode == "lines"
    assert ProgressRenderer("auto", stream=FakeTTY()).mode == "bars"
    with pytest.raises(ValueError):
        ProgressRenderer("loud")


def test_lines_for_starts_ends_and_messages_with_a_timestamp():
    r, out, clock = lines_renderer()
    r(ProgressEvent("start", "verify", task="cpu runtime", total=4, extra={"unit": "check"}))
    r(ProgressEvent("message", "build", task="cpu", message="reusing cached build abc"))
    clock.now += 12.4
    r(ProgressEvent("end", "verify", task="cpu runtime", ok=True, done=4, total=4))
    r(ProgressEvent("start", "fetch", task="a.bin", total=3 << 20))
    clock.now += 3
    r(ProgressEvent("end", "fetch", task="a.bin", ok=False, message="connection reset"))
    got = out.getvalue().splitlines()
    assert all(LINE.match(line) for line in got), got
    text = [line[9:] for line in got]
    assert text == ["[verify] cpu runtime: started (4 checks)",
                    "[build] cpu: reusing cached build abc",
                    "[verify] cpu runtime: done in 12 s",
                    "[fetch] a.bin: started (3.0 MiB)",
                    "[fetch] a.bin: failed after 3.0 s: connection reset"]


def test_a_line_without_a_task_has_no_stray_colon():
    r, out, _clock = lines_renderer()
    r(ProgressEvent("message", "plan", message="no published build fits; reusing the cpu build"))
    assert [line[9:] for line in out.getvalue().splitlines()] == ["[plan] no published build fits; reusing the cpu build"]


def test_lines_throttle_progress_to_one_line_per_interval_per_task():
    r, out, clock = lines_renderer(line_interval=5.0)
    r(ProgressEvent("start", "generate", task="512x512, 20 steps", total=200, extra={"unit": "step"}))
    r(ProgressEvent("start", "fetch", task="b.bin", total=1000))
    for i in range(1, 201):  # 20 s of an event every 0.1 s, two tasks interleaved
        clock.now += 0.1
        r(ProgressEvent("advance", "generate", task="512x512, 20 steps", done=i, total=200, extra={"unit": "step"}))
        r(ProgressEvent("advance", "fetch", task="b.bin", done=i * 5, total=1000))
    got = out.getvalue().splitlines()
    steps = [line for line in got if "20 steps: " in line and "%" in line]
    files = [line for line in got if "b.bin: " in line and "%" in line]
    assert 3 <= len(steps) <= 4 and 3 <= len(files) <= 4, got  # at 5, 10, 15, 20 s at most
    assert "50% (100 of 200 steps), 10 s, about 10 s left" in steps[1]
    assert "(500 B of 1000 B)" in files[1]


def test_lines_heartbeat_names_the_innermost_task_when_all_is_silent():
    r, out, clock = lines_renderer(heartbeat=15.0)
    r(ProgressEvent("start", "verify", task="cpu runtime", total=4, extra={"unit": "check", "eta": False}))
    r(ProgressEvent("start", "verify", task="loading the probe model"))
    for _ in range(60):  # 30 s with no event at all
        clock.now += 0.5
        r.tick()
    still = [line for line in out.getvalue().splitlines() if "still working" in line or "%" in line]
    assert len(still) == 2 and all("loading the probe model: still working" in line for line in still)
    assert "still working, 15 s" in still[0] and "still working, 30 s" in still[1]
    r(ProgressEvent("end", "verify", task="loading the probe model", ok=True))
    r(ProgressEvent("start", "build", task="waiting for the cpu build lock", message="waiting"))
    for _ in range(40):  # signs of life every 0.5 s that carry no progress: a line every 15 s, not every 5
        clock.now += 0.5
        r(ProgressEvent("advance", "build", task="waiting for the cpu build lock", message="waiting"))
        r.tick()
    waits = [line for line in out.getvalue().splitlines() if "lock: still working" in line]
    assert len(waits) == 1, out.getvalue()
    r(ProgressEvent("end", "build", task="waiting for the cpu build lock", ok=True))
    clock.now += 16
    r.tick()
    assert out.getvalue().splitlines()[-1].endswith("[verify] cpu runtime: 0% (0 of 4 checks), 1 min 06 s")  # no ETA for checks


def test_debug_messages_only_when_verbose():
    for verbosity, shown in ((0, False), (1, True)):
        r, out, _ = lines_renderer(verbosity=verbosity)
        r(ProgressEvent("message", "verify", message="worker pid 42", extra={"level": "debug"}))
        r(ProgressEvent("message", "verify", message="restarting the worker"))
        assert ("worker pid 42" in out.getvalue()) is shown and "restarting the worker" in out.getvalue()


def test_configure_quiet_silences_the_cli_renderer():
    try:
        configure(-1)
        with progress_renderer(json_mode=True) as r:
            assert r.mode == "quiet"
        configure(0)
        with progress_renderer(json_mode=True) as r:
            assert r.mode == "json"
        with progress_renderer(stream=io.StringIO()) as r:
            assert r.mode == "lines"
        with progress_renderer(quiet=True) as r:
            assert r.mode == "quiet"
    finally:
        configure(0)


def test_bars_tick_with_a_spinner_and_elapsed_time_then_show_an_eta():
    tty, clock = FakeTTY(), Clock()
    r = ProgressRenderer("bars", stream=tty, clock=clock, ticker=False)
    r(ProgressEvent("start", "verify", task="loading the probe model", message="starting the worker"))
    for _ in range(8):
        clock.now += 0.5
        r.tick()
    shown = tty.getvalue().replace("\r", "\n")
    assert "0it" not in shown
    assert "loading the probe model: 4.0 s — starting the worker" in shown
    assert len({line[0] for line in shown.splitlines() if "loading the probe model:" in line}) >= 3  # it turns
    r(ProgressEvent("advance", "verify", task="loading the probe model", done=300, total=1000))
    assert re.search(r"loading the probe model: +30%\|.*\| 300/1000 \[\d\d:\d\d<", tty.getvalue().replace("\r", "\n"))
    clock.now += 1
    r(ProgressEvent("end", "verify", task="loading the probe model", ok=True, message="3.1 s on CPU"))
    r.close()
    assert "0it" not in tty.getvalue()


def test_bars_ticker_thread_moves_an_indeterminate_bar_by_itself(monkeypatch):
    monkeypatch.setattr(progress_mod, "TICK", 0.05)
    tty = FakeTTY()
    r = ProgressRenderer("bars", stream=tty)
    r(ProgressEvent("start", "install", task="checking the runtime"))
    deadline = time.monotonic() + 30  # waited for, not slept for: a loaded machine runs the ticker late
    while tty.getvalue().count("checking the runtime:") < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    before = tty.getvalue().count("checking the runtime:")
    assert before >= 5, tty.getvalue()
    r(ProgressEvent("end", "install", task="checking the runtime", ok=True))
    while r._ticker is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert r._ticker is None  # nothing runs: the ticker stopped
    r.close()


def _lock_holder(lock: Path) -> subprocess.Popen[str]:
    """Another process holding ``lock`` until told to let go (a line on its stdin): the wait ends
    when the test says, never after a fixed sleep."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfrom filelock import FileLock\nl = FileLock(sys.argv[1]); l.acquire()\n"
         "print('held', flush=True); sys.stdin.readline(); l.release()", str(lock)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def _release_after_ticks(holder: subprocess.Popen[str], progress, ticks: int):
    """``progress``, which tells the holder to let go once the wait has ticked ``ticks`` times."""
    seen = []

    def hear(event) -> None:
        progress(event)
        if event.kind == "advance":
            seen.append(event)
            if len(seen) == ticks and holder.stdin is not None:
                holder.stdin.write("go\n")
                holder.stdin.flush()
    return hear


def _stop(holder: subprocess.Popen[str]) -> None:
    if holder.poll() is None and holder.stdin is not None:
        holder.stdin.close()
    holder.wait(30)


def test_build_lock_wait_is_said_and_ticks(tmp_path):
    from accelstack.publisher.build_cache import build_lock

    lock = tmp_path / "slot.lock"
    holder = _lock_holder(lock)
    try:
        events = []
        with build_lock(lock, "cpu", _release_after_ticks(holder, events.append, 2), poll=0.2):
            pass
    finally:
        _stop(holder)
    said = [e.message for e in events if e.kind == "message"]
    assert said == [f"waiting for another accelstack build of cpu (lock {lock})"]
    kinds = [e.kind for e in events if e.task == "waiting for the cpu build lock"]
    assert kinds[0] == "start" and kinds[-1] == "end" and kinds.count("advance") >= 2
    assert events[-1].ok and "finished after" in events[-1].message
    events.clear()
    with build_lock(lock, "cpu", events.append):  # free: taken at once, nothing said
        pass
    assert events == []


def test_lines_rendering_of_a_real_lock_wait(tmp_path):
    """The wait through the lines renderer, as `accelstack build` piped to a log shows it."""
    from accelstack.publisher.build_cache import build_lock

    lock = tmp_path / "slot.lock"
    holder = _lock_holder(lock)
    out = io.StringIO()
    r = ProgressRenderer("lines", stream=out)
    try:
        with build_lock(lock, "vulkan", _release_after_ticks(holder, r, 2), poll=0.2):
            pass
    finally:
        _stop(holder)
        r.close()
    got = out.getvalue().splitlines()
    assert all(LINE.match(line) for line in got), got
    assert any(f"[build] vulkan: waiting for another accelstack build of vulkan (lock {lock})" in line for line in got)
    assert any("waiting for the vulkan build lock: done in" in line for line in got)


def test_times_for_people_are_local_to_the_minute(monkeypatch):
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    try:
        assert local_time("2026-12-04T04:43:16.168155Z") == "2026-12-04 05:43 CET"
        assert local_time("not a time") == "not a time"
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
