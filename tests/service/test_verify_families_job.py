"""The service's verify job takes the model families an app ships (issue 26: "an app can ask for the
families it ships"), as ``accelstack verify --family`` does: unknown ones are refused before any work."""
from __future__ import annotations

import pytest

from service_helpers import Service


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    s = Service(root / "home", root / "cache")
    yield s
    assert s.stop() == 0


@pytest.mark.parametrize("families,words", [
    (["flux", "sd9"], "sd9"),
    ("flux", "families"),  # a list of names, not a text
    ([""], "families"),
])
def test_a_verify_job_with_bad_families_is_refused_before_anything_runs(svc, families, words):
    r = svc.post_job("verify", families=families)
    assert r.status_code == 400, r.text
    assert words in r.text and r.json()["error"]["code"] == "bad-request"
    assert svc.get("/api/v1/jobs").json()["jobs"] == []


def test_a_verify_job_of_the_torch_stack_takes_no_families(svc):
    r = svc.post_job("verify", stack="torch", families=["flux"])
    assert r.status_code == 400 and "stable-diffusion.cpp" in r.text, r.text


def _recorded(installed_home):
    from accelstack.core.running import active_receipt
    from accelstack.settings import Settings

    receipt = active_receipt("ggml", Settings.resolve(home=installed_home / "home", cache=installed_home / "cache"))
    return receipt.verified_at, receipt.verification


def test_a_verify_job_proves_the_families_asked_for(start_service, installed_home):
    """The families' report is the job's result; the receipt keeps the runtime's own verdict, which
    status, doctor and the fleet view show (a flux-only FAIL is not "this runtime fails")."""
    before = _recorded(installed_home)
    svc = start_service(home=installed_home / "home", cache=installed_home / "cache")
    job = svc.post_job("verify", families=["flux"]).json()["job"]
    _progress, event, data = svc.follow(job["id"])
    assert event == "result" and data["state"] == "succeeded", data
    report = data["result"]
    assert report["ok"] and "flux" in report["details"]["families"], report
    assert any(c["name"].startswith("flux:") for c in report["checks"])
    assert _recorded(installed_home) == before


def test_the_core_refuses_families_for_a_stack_that_cannot_verify_them():
    from accelstack.core import direct
    from accelstack.engine.errors import InvalidRequestError

    assert direct.verify_families("ggml", ["flux", "flux"]) == ["flux"]
    with pytest.raises(InvalidRequestError, match="stable-diffusion.cpp stack only"):
        direct.verify_families("torch", ["flux"])
