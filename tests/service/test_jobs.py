"""Jobs over HTTP with the real CPU runtime: detect -> plan -> install -> verify with live events,
one home-changing job at a time, cancel, and SIGTERM in the middle of an install."""
from __future__ import annotations

import dataclasses
import signal
import threading

from accelstack.events import ProgressEvent
from accelstack.installer.home import Home
from accelstack.settings import Settings

API = "/api/v1"
EVENT_FIELDS = {f.name for f in dataclasses.fields(ProgressEvent)}


def test_an_app_drives_detect_plan_install_verify_over_http(start_service, tmp_path, ggml_cpu_build, probe_model):
    svc = start_service()
    report = svc.get(f"{API}/hardware").json()["report"]
    assert report["preference"][0]["api"]
    plan = svc.get(f"{API}/plans").json()["plans"]["ggml"]["plan"]
    assert plan["status"] in ("ready", "needs-build") and plan["backend"] == "cpu"

    job = svc.start_job("install")
    assert job["state"] in ("queued", "running") and job["links"]["events"] == f"{API}/jobs/{job['id']}/events"
    progress, conflict, final = [], None, None
    for event, eid, data in svc.events(job["id"]):
        if event != "progress":
            final = (event, data)
            break
        assert set(data) == EVENT_FIELDS, "exactly the library's ProgressEvent, as serde writes it"
        assert eid == len(progress)
        progress.append(data)
        if conflict is None:  # the install is running now: a second home-changing job is refused
            conflict = svc.post_job("repair")
    assert conflict is not None and conflict.status_code == 409, conflict.text
    assert conflict.json()["error"]["code"] == "job-conflict" and conflict.json()["error"]["job"] == job["id"]
    assert final is not None and final[0] == "result", final
    assert final[1]["state"] == "succeeded"
    summary = final[1]["result"]
    assert summary["changed"] is True and summary["receipt"]["verification"]["verdict"] == "PASS"
    stages = {e["stage"] for e in progress}
    assert {"install", "verify", "generate"} <= stages, stages
    assert any(e["kind"] == "advance" for e in progress)

    status = {s["stack"]: s for s in svc.get(f"{API}/status").json()["stacks"]}
    assert status["ggml"]["healthy"] and status["ggml"]["active"] == summary["runtime"]

    verify = svc.start_job("verify")
    progress, event, data = svc.follow(verify["id"])
    assert event == "result" and data["result"]["verdict"] == "PASS", data
    kinds = [e["kind"] for e in progress if e["stage"] == "verify"]
    assert kinds[0] == "start" and kinds[-1] == "end" and kinds.count("advance") >= 4  # check by check
    gen = [e for e in progress if e["stage"] == "generate"]
    assert gen and gen[-1]["kind"] == "end" and gen[-1]["done"] == gen[-1]["total"]
    image = svc.get(f"{API}/jobs/{verify['id']}/image")
    assert image.status_code == 200 and image.headers["content-type"] == "image/png"
    assert image.content.startswith(b"\x89PNG\r\n\x1a\n")
    job_dir = svc.home / "state" / "service" / "jobs" / verify["id"]
    assert (job_dir / "verify.png").read_bytes() == image.content
    assert svc.get(f"{API}/jobs/{verify['id']}/image", params={"index": "1"}).status_code == 404

    listed = svc.get(f"{API}/jobs").json()["jobs"]
    assert [(j["id"], j["state"]) for j in listed] == [(job["id"], "succeeded"), (verify["id"], "succeeded")]
    again = svc.get(f"{API}/jobs/{verify['id']}").json()["job"]
    assert again["result"]["verdict"] == "PASS" and again["images"] == 1
    # a finished job's stream replays everything, and resumes after Last-Event-ID
    replay = list(svc.events(verify["id"]))
    assert len(replay) == len(progress) + 1
    assert svc.get(f"{API}/jobs/{verify['id']}/events", headers={"Last-Event-ID": str(len(progress) - 1)},
                   stream=True).text.count("event: ") == 1


def test_cancel_a_running_and_a_queued_job(start_service, installed_home):
    svc = start_service(home=installed_home / "home", cache=installed_home / "cache")
    running = svc.start_job("verify")
    stream = svc.events(running["id"])
    event, _, first = next(stream)
    assert event == "progress"
    queued = svc.start_job("verify")  # waits: one job runs at a time
    assert queued["state"] == "queued"
    before = svc.get(f"{API}/jobs/{queued['id']}").json()["job"]
    r = _delete(svc, queued["id"])
    assert r.status_code == 202 and r.json()["job"]["state"] == "cancelled"
    r = _delete(svc, running["id"])
    assert r.status_code == 202 and r.json()["job"]["cancel_requested"] is True
    rest = list(stream)
    final_event, _, final = rest[-1]
    assert final_event == "error" and final["state"] == "cancelled" and final["error"]["code"] == "cancelled"
    assert _delete(svc, running["id"]).status_code == 409
    assert before["state"] == "queued"
    _, event, data = svc.follow(queued["id"])
    assert event == "error" and data["state"] == "cancelled"
    # the service goes on: the next job runs (an install of what is installed: a quick no-op)
    _, event, data = svc.follow(svc.start_job("install")["id"])
    assert event == "result" and data["result"]["changed"] is False


def test_sigterm_during_an_install_cancels_it_and_leaves_the_home_as_it_was(start_service, installed_home, tmp_path):
    home = installed_home / "home"
    before = Home(home).read_active().active["ggml"]
    svc = start_service(home=home, cache=installed_home / "cache")
    job = svc.start_job("install", force=True)  # a reinstall: stage, verify (here it is stopped), switch
    seen, final = [], []
    got_to_verify = threading.Event()

    def read() -> None:
        for event, _, data in svc.events(job["id"]):
            seen.append(data)
            if event == "progress" and data["stage"] in ("verify", "probe", "generate"):
                got_to_verify.set()
            if event != "progress":
                final.append((event, data))
        got_to_verify.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert got_to_verify.wait(120), "the install never reached its verification"
    assert not final, f"the install ended before it could be stopped: {final}"
    svc.proc.send_signal(signal.SIGTERM)
    assert svc.proc.wait(120) == 0, svc.stderr()
    reader.join(30)
    assert final and final[0][0] == "error" and final[0][1]["state"] == "cancelled", final
    assert "stopped (signal SIGTERM)" in svc.stderr()
    assert not svc.token_file.exists()
    h = Home(home)
    assert h.read_active().active["ggml"] == before
    assert not any(h.staging.iterdir()), "nothing half-installed is left in staging"
    import accelstack

    s = Settings.resolve(home=home, cache=installed_home / "cache", manifests=[])
    assert accelstack.status(settings=s, check_upgrades=False)[0].healthy


def test_generate_uses_a_model_named_from_the_models_dir(start_service, installed_home, probe_model, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / "probe").symlink_to(probe_model.path, target_is_directory=True)
    svc = start_service("--models-dir", str(models), home=installed_home / "home", cache=installed_home / "cache")
    for name in ("../probe", str(models / "probe"), "missing"):
        r = svc.post_job("generate", model=name, prompt="a red cube")
        assert r.status_code == 400 and "probe" in r.json()["error"]["hint"], r.text
    job = svc.start_job("generate", model="probe", prompt="a red cube", width=64, height=64, steps=1, seed=3)
    progress, event, data = svc.follow(job["id"])
    assert event == "result", data
    assert data["result"]["seeds"] == [3] and len(data["result"]["images"]) == 1
    assert any(e["stage"] == "generate" and e["kind"] == "end" and e["ok"] for e in progress)
    png = svc.get(f"{API}/jobs/{job['id']}/image")
    assert png.status_code == 200 and png.content.startswith(b"\x89PNG")


def _delete(svc, job_id):
    import requests

    return requests.delete(f"{svc.url}{API}/jobs/{job_id}", headers=svc.headers(), timeout=30)
