"""scripts/device-check.sh (issue 45) is ready for the next GPU: its CPU mode runs here (detect, then the
planner's decisions for full-size SDXL and FLUX.1-dev at 1024x1024 from header-only files, written as the
same device-check.json the GPU mode writes), and the whole script passes shellcheck."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "device-check.sh"


def _run(*args: str, out: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OUT=str(out), TMPDIR=str(out.parent), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=600)


def test_the_cpu_mode_writes_the_figures_the_gpu_mode_writes(tmp_path):
    out = tmp_path / "out"
    proc = _run("--cpu", "--vram", "8GiB", out=out)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    figures = json.loads((out / "device-check.json").read_text())
    assert figures["mode"] == "cpu" and set(figures["models"]) == {"sdxl", "flux"}
    sdxl, flux = figures["models"]["sdxl"], figures["models"]["flux"]
    assert 0 < sdxl["estimate_vram"] <= 8 * 2 ** 30 and sdxl["settings"]["offload_to_cpu"] is True
    assert 0 < flux["estimate_vram"] <= 8 * 2 ** 30 and [p["phase"] for p in flux["phases"]] == [
        "text encoders", "diffusion", "vae decode"]
    assert "Stable Diffusion XL at 1024x1024" in proc.stdout and "FLUX.1 at 1024x1024" in proc.stdout
    assert not list(tmp_path.glob("device-check.*"))  # its work folder (sparse full-size files) is gone


def test_bad_arguments_are_usage_errors(tmp_path):
    assert _run("--no-such-option", out=tmp_path / "o").returncode == 2
    assert _run("--build", str(tmp_path / "missing.tar.gz"), out=tmp_path / "o").returncode == 2
    assert _run(str(tmp_path / "missing-dir"), out=tmp_path / "o").returncode == 2


@pytest.mark.skipif(not shutil.which("shellcheck"), reason="shellcheck is not installed")
def test_the_device_scripts_pass_shellcheck():
    for name in ("device-check.sh", "device-check-torch.sh", "device-check-step.sh"):  # -x: the step they source
        proc = subprocess.run(["shellcheck", "-x", str(REPO / "scripts" / name)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout[-3000:]
