"""Issue 42, item 5: the torch stack's messages say what is missing and the one command that installs
it. `generate --backend torch` without torch said "run: accelstack install --force" (which reinstalls the
ggml runtime); `verify --backend torch` wrote the 1 GB probe, then failed with an empty device line and no
hint. The real CLI, in this interpreter (which has no torch: the tests skip where it has)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine_helpers import cli_env, run_cli

pytestmark = pytest.mark.skipif(subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0,
                                reason="torch is importable here: the case of a machine without it cannot be made")


def _final(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def test_verify_torch_without_torch_names_the_install_before_writing_a_probe(tmp_path):
    env = cli_env(tmp_path / "cache", tmp_path)
    res = run_cli(["verify", "--backend", "torch", "--json"], env)
    assert res.returncode == 1, res.stdout + res.stderr
    err = _final(res.stdout)
    assert err["event"] == "error" and err["code"] == "torch-missing", err
    assert err["message"].startswith(f"torch is not installed for {sys.executable}"), err
    assert err["action"] == "install" and err["run"] == "accelstack install --stack torch", err
    probe = tmp_path / "cache" / "probe"
    assert not probe.exists() or not any(probe.iterdir()), list(probe.iterdir())  # no 1 GB probe written
    res = run_cli(["verify", "--backend", "torch"], env)
    assert res.returncode == 1 and "run: accelstack install --stack torch" in res.stderr, res.stderr
    assert "device" not in res.stdout  # no report of a check that never ran


def test_generate_torch_without_torch_names_the_torch_install_not_a_ggml_reinstall(tmp_path, probe_model):
    env = cli_env(tmp_path / "cache", tmp_path)
    args = ["generate", "--backend", "torch", "-m", probe_model.path, "-p", "a cat", "-W", "64", "-H", "64",
            "--steps", "1", "-o", tmp_path / "out.png"]
    res = run_cli([*args, "--json"], env)
    assert res.returncode == 1, res.stdout + res.stderr
    err = _final(res.stdout)
    assert err["code"] == "torch-missing" and err["run"] == "accelstack install --stack torch", err
    res = run_cli(args, env)
    assert res.returncode == 1 and "run: accelstack install --stack torch" in res.stderr, res.stderr
    assert "install --force" not in res.stderr and not (tmp_path / "out.png").exists()


def test_a_torch_that_fails_to_import_shows_no_empty_device_line(tmp_path):
    target = tmp_path / "target"
    (target / "torch").mkdir(parents=True)
    (target / "torch" / "__init__.py").write_text("raise ImportError('libtorch_cuda.so: cannot open shared object file')\n")
    res = run_cli(["verify", "--backend", "torch", "--runtime", target, "--no-diffusers"], cli_env(tmp_path / "cache", tmp_path))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "device      none: torch did not run" in res.stdout and "device       —" not in res.stdout, res.stdout
