"""Generate jobs through a real service (issue 46): the result names the model as the client gave it (its
place in the models directory, never the absolute path the service resolved it to on its own machine), and
the job's worker starts before the request is checked."""
from __future__ import annotations


def test_a_generate_jobs_result_names_the_model_as_given(start_service, installed_home, probe_model, tmp_path):
    models = tmp_path / "models"
    (models / "sd").mkdir(parents=True)
    (models / "sd" / "probe").symlink_to(probe_model.path, target_is_directory=True)
    svc = start_service("--models-dir", str(models), home=installed_home / "home", cache=installed_home / "cache")
    options = {"prompt": "a cube", "model": "sd/probe", "width": 64, "height": 64, "steps": 1, "sampler": "euler"}
    _, event, data = svc.follow(svc.start_job("generate", **options)["id"])
    assert event == "result", data["error"].get("message")
    assert data["result"]["model"] == "sd/probe"
    assert str(tmp_path) not in str(data["result"])  # no path of the service's machine anywhere in it


def test_a_generate_jobs_worker_starts_while_its_request_is_checked(start_service, installed_home, probe_model, tmp_path):
    """The job's worker is launched before the request's one check (check_generation) runs, as the CLI's
    is: a request the check refuses (a width stable-diffusion.cpp cannot make) had its worker started."""
    import psutil

    models = tmp_path / "models"
    models.mkdir()
    (models / "probe").symlink_to(probe_model.path, target_is_directory=True)
    svc = start_service("--models-dir", str(models), home=installed_home / "home", cache=installed_home / "cache")
    options = {"prompt": "a cube", "model": "probe", "width": 65, "height": 64, "steps": 1}
    progress, event, data = svc.follow(svc.start_job("generate", **options)["id"])
    assert event == "error" and "65" in data["error"]["message"]
    early = [e for e in progress if e.get("task") == "worker" and e.get("extra", {}).get("early")]
    assert early, progress
    pid = early[0]["extra"]["pid"]
    kids = {p.pid: p for p in psutil.Process(svc.proc.pid).children(recursive=True)}
    assert pid in kids and any("accelstack.engine.worker" in part for part in kids[pid].cmdline())
    assert not [e for e in progress if e.get("task") == "check"]  # the check refused it: it never ended well
