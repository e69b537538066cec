"""``generate --dry-run`` (issue 45): the memory planner's decision for the given files, size and batch on a
machine that is live, replayed (--replay) or declared (--vram 8GiB --ram 16GiB), without loading anything
or starting a worker; --json gives the decision as data. The files are synthesized at their real sizes."""
from __future__ import annotations

from pathlib import Path

import pytest
from test_memory_plan import GIB, sdxl_file

from accelstack import core
from accelstack.core import machine
from accelstack.engine.errors import InvalidRequestError

from cli_helpers import error_of, result_of, run_cli

CAPTURES = Path(__file__).resolve().parents[2] / "fixtures" / "captures"


def _generate(tmp_path, *extra):
    model = sdxl_file(tmp_path)
    return run_cli(["generate", "-m", model, "-p", "a cat", "-W", "1024", "-H", "1024", "--dry-run",
                    "-o", tmp_path / "out.png", *extra], env={"ACCELSTACK_HOME": str(tmp_path / "home"),
                                                              "ACCELSTACK_CONFIG": str(tmp_path / "none.yaml")})


def test_a_dry_run_on_declared_memory_says_what_it_would_do(tmp_path):
    code, out, err = _generate(tmp_path, "--vram", "6GiB", "--ram", "16GiB", "--json")
    assert code == 0, err
    d = result_of(out)
    assert d["dry_run"] is True and d["machine"] == "declared" and d["device"] == "gpu" and d["fits"] is True
    assert d["vram_free"] == 6 * GIB and d["ram_available"] == 16 * GIB and d["files"]["model"] == "sd_xl_base_1.0.safetensors"
    plan = d["plan"]
    assert plan["offload_to_cpu"] and plan["vae_tiling"] and plan["vram_need"] <= 6 * GIB
    assert [p["phase"] for p in plan["phases"]] == ["text encoders", "diffusion", "vae decode"]
    assert not (tmp_path / "out.png").exists() and not (tmp_path / "home").exists()  # nothing written, nothing started
    code, text, err = _generate(tmp_path, "--vram", "6GiB", "--ram", "16GiB")
    assert code == 0, err
    assert "dry run: nothing loaded" in text and "Stable Diffusion XL at 1024x1024" in text and "tiling the VAE" in text
    assert "vae decode" in text and "GiB" in text


def test_a_dry_run_that_would_be_refused_says_why_and_what_would_fit(tmp_path):
    code, out, err = _generate(tmp_path, "--vram", "512MiB", "--ram", "4GiB", "--json")
    assert code == 0, err
    d = result_of(out)
    assert d["fits"] is False and d["plan"] is None and "needs about" in d["refusal"] and d["hint"]
    code, text, err = _generate(tmp_path, "--vram", "512MiB", "--ram", "4GiB")
    assert "would be refused" in text and "needs about" in text


def test_a_dry_run_on_a_replayed_machine(tmp_path):
    code, out, err = _generate(tmp_path, "--replay", CAPTURES / "linux-nvidia-h200-580-container", "--backend", "cuda",
                               "--json")
    assert code == 0, err
    d = result_of(out)
    assert d["machine"].startswith("replay:") and d["device"] == "gpu" and d["vram_free"] > 100 * GIB
    assert d["plan"]["offload_to_cpu"] is False and not d["plan"]["changed"]  # an H200 holds it all


@pytest.mark.parametrize("size", ["lots", "0", "0GiB", "-8GiB", "8 parsecs", "1e400GiB", "9999TiB", "nan", ""])
def test_a_bad_declared_size_is_a_usage_error(tmp_path, size):
    code, out, err = _generate(tmp_path, "--vram", size, "--json")
    assert code == 2, (size, out, err)
    assert "--vram" in error_of(out)["message"]


@pytest.mark.parametrize("text, value", [("8GiB", 8 * GIB), ("8 GiB", 8 * GIB), ("8G", 8 * GIB), ("8gb", 8 * 10 ** 9),
                                         ("1536MiB", 1536 * 2 ** 20), ("0.5GiB", GIB // 2), ("17179869184", 16 * GIB)])
def test_sizes_are_read_as_written(text, value):
    assert machine.parse_size(text, "--ram") == value


def test_the_core_dry_run_is_the_same_decision(tmp_path):
    model = sdxl_file(tmp_path)
    d = core.generate(model, "a cat", tmp_path / "o.png", width=1024, height=1024, dry_run=True,
                      machine=machine.declared_machine("cuda", ram=16 * GIB, vram=8 * GIB))
    assert d.machine == "declared" and d.fits and d.plan.vram_need <= 8 * GIB and not (tmp_path / "o.png").exists()
    with pytest.raises(InvalidRequestError):
        machine.declared_machine("cuda", ram=0, vram=8 * GIB)
