"""Fuzzing the service's job lifecycle (issue 47): jobs x restarts x gc, on the real `accelstack serve`.

Hypothesis draws a short life: jobs, a clean stop, a SIGKILL, a new start, `accelstack gc`, `cache
purge service`. After every step the job folders on disk are exactly those of the jobs the running
service still knows, plus those a stopped service left that nothing has swept yet; a start, a gc
and a purge sweep what a stopped service left and never touch a running one's. Seeded and bounded
(a failure reproduces on every machine).
"""
from __future__ import annotations

import itertools
import signal
from pathlib import Path
from typing import Dict, List, Set

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_job_files import cli, ended_job, jobs_dir

from accelstack.service.jobs import MAX_FINISHED_JOBS

ACTIONS = ("job", "job", "stop", "kill", "start", "gc", "purge")
LIVES = itertools.count()


def _on_disk(home: Path) -> Set[str]:
    folder = jobs_dir(home)
    return {p.name for p in folder.iterdir() if p.is_dir() and not p.is_symlink()} if folder.is_dir() else set()


@settings(max_examples=12, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.sampled_from(ACTIONS), min_size=2, max_size=7))
@example(["job", "job", "kill", "gc"])  # a killed service's folders: gc sweeps them
@example(["job", "stop", "job", "kill", "purge", "job"])  # two services' leftovers, purged; then a new life
@example(["job", "kill", "start", "job", "gc", "job"])  # the start sweeps; gc leaves the running one's
def test_job_folders_follow_the_jobs_through_restarts_and_gc(start_service, tmp_path, life: List[str]):
    root = tmp_path / f"life-{next(LIVES)}"
    home, cache = root / "home", root / "cache"
    root.mkdir(parents=True)
    svc = None
    known: List[str] = []  # the running service's jobs, oldest first
    left: Set[str] = set()  # what stopped services left, not swept yet
    try:
        for step in life:
            if step in ("job", "start") and svc is None:
                svc = start_service(home=home, cache=cache)
                left, known = set(), []  # the start sweeps what a stopped service left
            if step == "job":
                assert svc is not None
                known.append(ended_job(svc))
                if len(known) > MAX_FINISHED_JOBS:
                    known.pop(0)  # forgotten: its folder goes with it
            elif step in ("stop", "kill") and svc is not None:
                svc.stop(signal.SIGTERM if step == "stop" else signal.SIGKILL)
                svc, left, known = None, left | set(known), []
            elif step == "gc":
                report: Dict = cli(home, cache, "gc")
                assert {Path(p).name for p in report["service_jobs_removed"]} == left
                left = set()
            elif step == "purge":
                report = cli(home, cache, "cache", "purge", "service", "--yes")
                assert {Path(p).name for p in report["removed"]} == left
                left = set()
            assert _on_disk(home) == set(known) | left, (step, life)
    finally:
        if svc is not None:
            svc.stop()
