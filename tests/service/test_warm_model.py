"""The service keeps a generate job's model loaded for the next one (issue 46): a real service with the
real CPU build and the SD 1.x probe. The same model's second job reuses the worker (its result says so);
DELETE /api/v1/session, a verify job and a SIGKILL of the service each leave no worker behind."""
from __future__ import annotations

import signal
import time

import psutil
import requests

API = "/api/v1"
IMAGE = dict(model="probe", width=64, height=64, steps=1, sampler="euler")


def _workers(pid):
    """The service's worker processes (its children running accelstack's engine worker)."""
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for p in kids:
        try:
            if any("accelstack.engine.worker" in part for part in p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def _generate(svc, **kw):
    options = {"prompt": "a cube", **IMAGE, **kw}
    _, event, data = svc.follow(svc.start_job("generate", **options)["id"])
    assert event == "result", data
    return data["result"]


def _gone(procs, within=30.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in procs):
            return True
        time.sleep(0.2)
    return False


def test_a_second_job_of_the_same_model_reuses_the_loaded_worker_and_nothing_leaks(start_service, installed_home,
                                                                                  probe_model, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / "probe").symlink_to(probe_model.path, target_is_directory=True)
    svc = start_service("--models-dir", str(models), home=installed_home / "home", cache=installed_home / "cache")
    first, second = _generate(svc, seed=1), _generate(svc, seed=2, prompt="another")
    assert first["reused_worker"] is False and second["reused_worker"] is True and second["seeds"] == [2]
    state = svc.get(f"{API}/session").json()["session"]
    assert state["loaded"] and state["loads"] == 1 and state["model"] == "probe"
    workers = _workers(svc.proc.pid)
    assert len(workers) == 1
    released = requests.delete(f"{svc.url}{API}/session", headers=svc.headers(), timeout=60).json()
    assert released["released"] is True and not released["session"]["loaded"] and _gone(workers)

    assert _generate(svc, seed=3)["reused_worker"] is False  # loaded again
    workers = _workers(svc.proc.pid)
    _, event, data = svc.follow(svc.start_job("verify")["id"])  # needs the memory: the model goes first
    assert event == "result", data
    assert _gone(workers) and not svc.get(f"{API}/session").json()["session"]["loaded"]

    _generate(svc, seed=4)
    workers = _workers(svc.proc.pid)
    assert len(workers) == 1
    svc.proc.send_signal(signal.SIGKILL)
    svc.proc.wait(30)
    assert _gone(workers, within=60), "the killed service's worker is still running"
