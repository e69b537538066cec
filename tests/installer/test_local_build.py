"""With no published build, install builds locally: a cached build needs no compiler at all."""
from __future__ import annotations

import shutil

import accelstack
from accelstack.core.verifiers import import_verifier
from accelstack.settings import Settings


def test_a_cached_local_build_installs_on_a_machine_without_a_toolchain(ggml_cpu_build, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no cmake, no ninja, no compiler
    assert shutil.which("cmake") is None and shutil.which("c++") is None
    s = Settings.resolve(home=tmp_path / "home", cache=tmp_path / "cache", manifests=[])
    report = accelstack.detect(settings=s)
    plan = accelstack.plan(report, stack="ggml", settings=s)
    assert plan.status == "needs-build"
    summary = accelstack.install(plan, report=report, settings=s, verifier=import_verifier())
    assert summary.built_locally and summary.changed and summary.receipt is not None
    assert summary.receipt.manifest_source == "local-build"
    assert accelstack.status(settings=s)[0].healthy
