"""A generate request is checked once (issue 43): the CLI, the library and the service build one typed
request and make one check call (engine.request.check.check_generation) and one generate call. It was
checked three times (the CLI's prepare, the engine's generate, the supervisor) and, on the installed
route, went object -> dict -> object; a request's files' headers were read twice."""
from __future__ import annotations

from typing import Dict

import pytest

from accelstack.cli import main
from accelstack.engine.request import components
from accelstack.engine.worker import protocol


@pytest.fixture
def counted(monkeypatch) -> Dict[str, int]:
    calls = {"validate": 0, "check_components": 0}
    real_validate, real_check = protocol.GenerateRequest.validate, components.check_components

    def validate(self):
        calls["validate"] += 1
        return real_validate(self)

    def check_components(*args, **kwargs):
        calls["check_components"] += 1
        return real_check(*args, **kwargs)

    monkeypatch.setattr(protocol.GenerateRequest, "validate", validate)
    monkeypatch.setattr(components, "check_components", check_components)
    return calls


def test_the_cli_checks_a_request_once(cpu_runtime, probe_model, tmp_path, counted):
    out = tmp_path / "once.png"
    assert main(["generate", "--runtime", str(cpu_runtime.path), "-m", probe_model.path, "-p", "a lighthouse", "-W", "64",
                 "-H", "64", "--steps", "1", "-o", str(out)]) == 0
    assert out.is_file()
    assert counted == {"validate": 1, "check_components": 1}  # in this process: the worker validates its own side


def test_a_refused_request_is_refused_by_that_one_check_before_any_worker(cpu_runtime, probe_model, tmp_path, counted,
                                                                          monkeypatch):
    from accelstack.engine.supervision import supervisor

    started = []
    monkeypatch.setattr(supervisor, "early_worker", lambda *a, **k: started.append(1))
    rc = main(["generate", "--runtime", str(cpu_runtime.path), "-m", probe_model.path, "-p", "x", "-W", "65",
               "-o", str(tmp_path / "bad.png"), "--json"])
    assert rc == 2 and not started and not (tmp_path / "bad.png").exists()
    assert counted["validate"] == 1 and counted["check_components"] == 0  # the files are not read for a bad width
