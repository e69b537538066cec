"""A job's files go with the job: a forgotten job's folder is removed by the running service, and
what a stopped (or SIGKILLed) service left is removed by the next start, by `accelstack gc` and by
`accelstack cache purge`, and counted by `accelstack cache list`; never a running service's, a
folder accelstack did not mark, or anything through a link, and nothing on a dry run."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import psutil

from accelstack.service.jobs import MAX_FINISHED_JOBS
from accelstack.settings import Settings

from service_helpers import REPO, Service, service_env

API = "/api/v1"


def jobs_dir(home: Path) -> Path:
    return Settings.resolve(home=home).state_dir / "service" / "jobs"


def cli(home: Path, cache: Path, *args: str) -> Dict[str, Any]:
    """The real CLI on this test's home and caches: its own build and probe caches too, so that a
    `cache purge all` here never empties the session's shared ones (the CPU build other tests use)."""
    env = service_env(home, cache, ACCELSTACK_BUILD_CACHE=str(cache / "builds"), ACCELSTACK_PROBE_CACHE=str(cache / "probe"))
    r = subprocess.run([sys.executable, "-m", "accelstack", *args, "--json"], env=env, cwd=str(REPO),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])["result"]


def ended_job(svc: Service) -> str:
    """A job that ends at once (verify with nothing installed fails): its folder is made all the same."""
    job = svc.start_job("verify")
    _progress, event, _data = svc.follow(job["id"])
    assert event in ("result", "error")
    return job["id"]


def service_entries(home: Path, cache: Path) -> List[Dict[str, Any]]:
    infos = {c["name"]: c for c in cli(home, cache, "cache", "list")["caches"]}
    return infos["service"]["entries"]


def test_a_forgotten_job_takes_its_folder_with_it(start_service, tmp_path):
    svc = start_service()
    first = ended_job(svc)
    folder = jobs_dir(svc.home) / first
    assert folder.is_dir()
    for _ in range(MAX_FINISHED_JOBS):
        ended_job(svc)
    assert svc.get(f"{API}/jobs/{first}").status_code == 404, "forgotten past the limit"
    assert not folder.exists(), "a forgotten job's folder (its images) goes with it"
    assert len(os.listdir(jobs_dir(svc.home))) == MAX_FINISHED_JOBS


def test_a_killed_services_job_folders_are_counted_and_removed_by_gc(start_service, tmp_path):
    home, cache = tmp_path / "home", tmp_path / "cache"
    svc = start_service(home=home, cache=cache)
    left = jobs_dir(home) / ended_job(svc)
    (left / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 1000)
    svc.stop(signal.SIGKILL)
    mine = jobs_dir(home) / ("ab" * 8)  # a person's folder, named like a job but not marked
    mine.mkdir()
    (mine / "keep.txt").write_text("mine")
    outside = tmp_path / "outside"
    outside.mkdir()
    dead = {"what": "accelstack service job", "pid": 2**22 + 1, "host": socket.gethostname()}  # no such process
    (outside / ".accelstack-owned").write_text(json.dumps(dead))  # marked, but reached only through a link
    (jobs_dir(home) / ("cd" * 8)).symlink_to(outside, target_is_directory=True)

    entries = service_entries(home, cache)
    assert [e["name"] for e in entries] == [left.name] and entries[0]["size"] >= 1000
    assert "stopped" in entries[0]["kind"]
    dry = cli(home, cache, "cache", "purge", "service", "--dry-run")
    assert dry["removed"] == [str(left)] and left.is_dir(), "nothing is removed on a dry run"

    report = cli(home, cache, "gc")
    assert report["service_jobs_removed"] == [str(left)] and report["bytes_freed"] >= 1000
    assert not left.exists()
    assert (mine / "keep.txt").read_text() == "mine", "an unmarked folder stays"
    assert (outside / ".accelstack-owned").is_file() and (jobs_dir(home) / ("cd" * 8)).is_symlink(), "never through a link"
    assert service_entries(home, cache) == []


def test_the_next_start_removes_what_a_stopped_service_left_and_a_running_ones_stay(start_service, tmp_path):
    home, cache = tmp_path / "home", tmp_path / "cache"
    first = start_service(home=home, cache=cache)
    left = jobs_dir(home) / ended_job(first)
    first.stop(signal.SIGKILL)
    second = start_service(home=home, cache=cache)
    assert not left.exists(), "the next start removes a stopped service's job folders"
    live = jobs_dir(home) / ended_job(second)
    entries = service_entries(home, cache)
    assert [e["name"] for e in entries] == [live.name] and "running" in entries[0]["kind"]
    assert cli(home, cache, "gc")["service_jobs_removed"] == []
    purged = cli(home, cache, "cache", "purge", "all", "--yes")
    assert not any(p == str(live) for p in purged["removed"]) and any(str(live) in k for k in purged["kept"])
    assert live.is_dir() and second.get(f"{API}/jobs/{live.name}").status_code == 200
    second.stop()  # stopped cleanly: its folders wait for the next start, gc or purge
    assert live.is_dir()
    assert cli(home, cache, "cache", "purge", "service", "--yes")["removed"] == [str(live)]
    assert not live.exists()


def test_a_killed_service_not_yet_reaped_is_not_running(start_service, tmp_path):
    """A SIGKILLed service whose parent has not reaped it (a zombie) keeps its pid: its folders go all the same."""
    home, cache = tmp_path / "home", tmp_path / "cache"
    svc = start_service(home=home, cache=cache)
    left = jobs_dir(home) / ended_job(svc)
    os.kill(svc.proc.pid, signal.SIGKILL)
    while psutil.Process(svc.proc.pid).status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.05)
    assert cli(home, cache, "gc")["service_jobs_removed"] == [str(left)]
    assert not left.exists()
