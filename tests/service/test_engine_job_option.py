"""A generate job's ``engine`` option (issue 45): config.yaml's engine keys over the service's config,
the memory levers included, checked when the job is posted (a bad value is a 400, nothing queued)."""
from __future__ import annotations

import pytest

from accelstack.service import jobs
from accelstack.service.errors import BadRequest
from accelstack.service.job_options import Options
from accelstack.settings import Settings


def test_the_engine_object_is_read_over_the_config(tmp_path):
    (tmp_path / "config.yaml").write_text("engine:\n  flash_attention: false\n  keep_vae_on_cpu: true\n")
    settings = Settings.resolve(config_file=tmp_path / "config.yaml", env={})
    options = jobs._engine_options(settings, Options("generate", {"engine": {"keep_clip_on_cpu": True, "max_vram": 6}})
                                   .mapping("engine"))
    assert (options.keep_clip_on_cpu, options.max_vram, options.keep_vae_on_cpu, options.flash_attention) == \
        (True, 6.0, True, False)
    assert jobs._engine_options(settings, {}) is None  # none given: the config, read when the job runs


@pytest.mark.parametrize("engine, words", [
    ({"max_vram": "lots"}, "max_vram"), ({"max_vram": 0.01}, "max_vram"), ({"keep_vae_on_cpu": "yes"}, "keep_vae_on_cpu"),
    ({"rm -rf": 1}, "unknown engine option"), ({"embeddings": ["/etc/passwd"]}, "unknown engine option"),
])
def test_a_bad_engine_option_is_a_bad_request(tmp_path, engine, words):
    settings = Settings.resolve(config_file=tmp_path / "config.yaml", env={})
    with pytest.raises(BadRequest) as err:
        jobs._engine_options(settings, Options("generate", {"engine": engine}).mapping("engine"))
    assert words in err.value.message and err.value.code == "bad-request"


@pytest.mark.parametrize("value", [[1], "auto", 3, {str(i): 1 for i in range(100)}])
def test_the_engine_option_must_be_a_small_object(value):
    with pytest.raises(BadRequest):
        Options("generate", {"engine": value}).mapping("engine")


def test_a_dry_run_job_declares_its_machine():
    """A generate job's dry_run (issue 45): with vram/ram, the declared machine reaches the planner."""
    dry = jobs._dry_run_of(Options("generate", {"dry_run": True, "vram": "8GiB", "ram": "16GiB"}))
    assert dry["dry_run"] and dry["machine"].ram_available == 16 * 2 ** 30
    assert dry["machine"].vram_free("cuda") == 8 * 2 ** 30
    assert jobs._dry_run_of(Options("generate", {})) == {}
    for bad in ({"dry_run": True, "vram": "0"}, {"dry_run": True, "ram": "lots"}, {"vram": "8GiB"}):
        with pytest.raises(BadRequest):
            jobs._dry_run_of(Options("generate", bad))
