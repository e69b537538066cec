"""An install, repair, upgrade or rollback never runs beside a loaded worker of the runtime it changes (issue 46),
even from another process: a real service holding a warm worker of the CPU build, and a real repair of that
runtime run in this process (the core call every command passes through) and a real CLI rollback."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest
import requests
from test_warm_model import API, _generate, _gone, _workers

import accelstack
from accelstack.core.held_workers import WorkerHeldError, held_workers, register
from accelstack.core.verifiers import import_verifier
from accelstack.settings import Settings

from service_helpers import service_env


def test_a_repair_in_another_process_has_the_service_release_its_loaded_worker_first(start_service, installed_home,
                                                                                     probe_model, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / "probe").symlink_to(probe_model.path, target_is_directory=True)
    home, cache = installed_home / "home", installed_home / "cache"
    svc = start_service("--models-dir", str(models), home=home, cache=cache)
    _generate(svc, seed=1)
    s = Settings.resolve(home=home, cache=cache, manifests=[])
    held = held_workers(s.state_dir)
    assert [(h.pid, h.stack) for h in held] == [(svc.proc.pid, "ggml")] and held[0].url == svc.url + "/"
    assert str(home) in held[0].runtime
    workers = _workers(svc.proc.pid)
    assert len(workers) == 1

    accelstack.install(stack="ggml", settings=s, report=accelstack.detect(settings=s), dry_run=True)
    assert svc.get(f"{API}/session").json()["session"]["loaded"], "a dry run released the worker"

    accelstack.repair(stack="ggml", settings=s, verifier=import_verifier())
    assert _gone(workers, within=5), "the repair ran beside the loaded worker"
    assert not svc.get(f"{API}/session").json()["session"]["loaded"] and held_workers(s.state_dir) == []
    assert _generate(svc, seed=2)["reused_worker"] is False  # the service goes on: the next job loads again
    requests.delete(f"{svc.url}{API}/session", headers=svc.headers(), timeout=60)
    assert held_workers(s.state_dir) == []


def _registered(state_dir, pid, home, started=None):
    """A registration naming ``pid`` as a service (started at ``started``) on a port where nothing answers."""
    path = register(state_dir, url="http://127.0.0.1:1/", port=1, stack="ggml", runtime=str(home / "x"))
    doc = json.loads(path.read_text())
    doc["pid"] = pid
    doc["started"] = started if started is not None else psutil.Process(pid).create_time() if psutil.pid_exists(pid) else 0
    named = path.with_name(f"worker-{pid}.json")
    named.write_text(json.dumps(doc))
    os.unlink(path)
    return named


def test_a_service_that_does_not_release_stops_the_command_with_a_typed_error_and_a_stale_file_is_ignored(tmp_path):
    home, cache = tmp_path / "home", tmp_path / "cache"
    s = Settings.resolve(home=home, cache=cache, manifests=[])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = _registered(s.state_dir, dead.pid, home)
    env = service_env(home, cache, ACCELSTACK_MANIFESTS="")
    run = subprocess.run([sys.executable, "-m", "accelstack", "rollback", "--json"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert "service" not in run.stdout and "no previous ggml runtime" in run.stdout  # the dead service's file is ignored
    os.unlink(stale)

    # a live process named as a service that does not answer: the command refuses, naming it, and changes nothing
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        _registered(s.state_dir, live.pid, home, started=psutil.Process(live.pid).create_time() - 1000)
        run = subprocess.run([sys.executable, "-m", "accelstack", "rollback", "--json"], env=env, capture_output=True,
                             text=True, timeout=120)  # a killed service's pid, now another process's: ignored
        assert "service" not in run.stdout and "no previous ggml runtime" in run.stdout, run.stdout
        _registered(s.state_dir, live.pid, home)
        run = subprocess.run([sys.executable, "-m", "accelstack", "rollback", "--json"], env=env, capture_output=True,
                             text=True, timeout=120)
        last = json.loads(run.stdout.strip().splitlines()[-1])
        assert run.returncode == 1, run.stderr
        assert last["event"] == "error" and last["error"] == "WorkerHeldError", last
        assert f"service {live.pid} at http://127.0.0.1:1/" in last["message"] and "rollback" in last["message"], last
        assert "stop that service" in last["hint"]
        with pytest.raises(WorkerHeldError) as caught:  # the same from the core call, as a typed error
            accelstack.rollback(stack="ggml", settings=s)
        assert caught.value.exit_code == 1
        with pytest.raises(Exception) as other:  # another stack's change is not in its way
            accelstack.rollback(stack="torch", settings=s)
        assert not isinstance(other.value, WorkerHeldError)
    finally:
        live.kill()
        live.wait()
