"""The service's verify leaves what the CLI's leaves: the 1.07 GB probe goes when the verify ends
(not when the service stops), and what stays in the probe cache is the 27 MB of value pools the
README promises, as `accelstack cache list` counts them."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from accelstack.serde import size_text
from accelstack.settings import Settings

from service_helpers import REPO, service_env

API = "/api/v1"


@pytest.fixture(scope="module")
def cpu_home(tmp_path_factory, ggml_cpu_build) -> Path:
    """A home with the CPU runtime installed and active (from the cached build; import check, no probe)."""
    import accelstack
    from accelstack.core.verifiers import import_verifier

    root = tmp_path_factory.mktemp("probe-home")
    s = Settings.resolve(home=root / "home", cache=root / "cache", manifests=[])
    summary = accelstack.install(None, stack="ggml", report=accelstack.detect(settings=s), settings=s, verifier=import_verifier())
    assert summary.receipt is not None
    return root


def test_a_service_verify_removes_its_probe_when_it_ends(start_service, cpu_home, tmp_path):
    probe = tmp_path / "probe"  # a probe cache of this test's own: nothing kept there by other tests
    env = {"ACCELSTACK_PROBE_CACHE": str(probe)}
    home, cache = cpu_home / "home", cpu_home / "cache"
    svc = start_service(home=home, cache=cache, env=env)
    job = svc.start_job("verify")
    _progress, event, data = svc.follow(job["id"])
    assert event == "result" and data["state"] == "succeeded", data
    # the service still runs: its verify ended, so its probe is gone, as the CLI's is
    assert sorted(os.listdir(probe)) == [n for n in sorted(os.listdir(probe)) if n.startswith("pools-") or n.endswith(".lock")]
    r = subprocess.run([sys.executable, "-m", "accelstack", "cache", "list", "--json"], cwd=str(REPO), timeout=120,
                       env=service_env(home, cache, **env), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    infos = {c["name"]: c for c in json.loads(r.stdout.splitlines()[-1])["result"]["caches"]}
    kinds = {e["kind"] for e in infos["probe"]["entries"]}
    assert kinds == {"probe pools"}, infos["probe"]["entries"]
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    said = re.search(r"(\d+) MB of value pools stay cached, ([\d.]+ MiB) in `accelstack cache list`", readme)
    assert said is not None and round(infos["probe"]["size"] / 1e6) == int(said[1]), \
        f"README says {said and said[0]!r}; the probe cache holds {infos['probe']['size']} bytes"
    assert said[2] == size_text(infos["probe"]["size"])
