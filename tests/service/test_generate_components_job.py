"""The service's generate job takes component files, an init image and a ControlNet's image as
names of files in its models directory (the rule it applies to the model), never as paths."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from component_files import standalone_vae, write_png_image  # noqa: E402  (the engine tests' files)

from accelstack.engine.worker.protocol import PATH_FIELDS  # noqa: E402
from accelstack.service import jobs  # noqa: E402


def test_every_file_field_of_the_request_is_a_models_dir_name():
    assert set(jobs.GENERATE_FILES) == set(PATH_FIELDS)


def test_generate_takes_components_and_images_by_name(start_service, installed_home, probe_model, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / "probe").symlink_to(probe_model.path, target_is_directory=True)
    standalone_vae(probe_model.path, models / "vae.safetensors")
    write_png_image(models / "init.png", 64, 64, seed=2)
    svc = start_service("--models-dir", str(models), home=installed_home / "home", cache=installed_home / "cache")
    for field, fits, other in (("vae", "vae.safetensors", "init.png"), ("init_image", "init.png", "vae.safetensors"),
                               ("control_net", "vae.safetensors", "init.png")):
        for name in ("../vae.safetensors", str(models / "vae.safetensors"), "missing.png"):
            r = svc.post_job("generate", model="probe", prompt="a cube", **{field: name})
            hint = r.json()["error"]["hint"]
            assert r.status_code == 400 and fits in hint and other not in hint, r.text  # what fits the field (issue 42)
    r = svc.post_job("generate", model="probe", prompt="a cube", init_pixels="AAAA")
    assert r.status_code == 400 and "init_pixels" in r.text, r.text
    r = svc.post_job("generate", prompt="a cube")  # neither model nor diffusion_model
    assert r.status_code == 400 and "model" in r.text, r.text
    job = svc.start_job("generate", model="probe", prompt="a cube", vae="vae.safetensors", init_image="init.png",
                        strength=0.5, width=64, height=64, steps=1, seed=3)
    progress, event, data = svc.follow(job["id"])
    assert event == "result", data
    assert data["result"]["components"] == {"vae": "vae.safetensors"}
    assert (data["result"]["init_image"], data["result"]["strength"]) == ("init.png", 0.5)
    assert str(models) not in str(data["result"]["components"])
