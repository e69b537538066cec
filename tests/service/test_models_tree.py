"""Issue 42, the service: a ComfyUI-style models tree (subfolders), with the no-escape rules kept, and
refusals that list what fits the field; errors in the service's own words (its JSON fields)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from component_files import standalone_vae, write_png_image  # noqa: E402  (the engine tests' files)


def _tree(models: Path, probe_model, outside: Path) -> None:
    for folder in ("checkpoints", "unet", "diffusion_models", "vae", "clip", "text_encoders", "loras", "inputs"):
        (models / folder).mkdir(parents=True)
    (models / "checkpoints" / "probe").symlink_to(probe_model.path, target_is_directory=True)
    standalone_vae(probe_model.path, models / "vae" / "probe-vae.safetensors")
    write_png_image(models / "inputs" / "init.png", 64, 64, seed=2)
    (outside / "secret.safetensors").write_bytes(b"not yours")
    (models / "elsewhere").symlink_to(outside, target_is_directory=True)


def test_a_comfyui_tree_is_named_by_subfolder_and_nothing_escapes_it(start_service, installed_home, probe_model, tmp_path):
    models, outside = tmp_path / "models", tmp_path / "outside"
    outside.mkdir()
    _tree(models, probe_model, outside)
    svc = start_service("--models-dir", str(models), home=installed_home / "home", cache=installed_home / "cache")
    for name in ("../outside/secret.safetensors", str(outside / "secret.safetensors"), "elsewhere/secret.safetensors",
                 "checkpoints/../../outside/secret.safetensors", "checkpoints\\probe", "/checkpoints/probe", "checkpoints//probe",
                 "checkpoints/probe/../../../outside/secret.safetensors", "missing.safetensors"):
        r = svc.post_job("generate", model=name, prompt="a cube")
        assert r.status_code == 400, (name, r.text)
        hint = r.json()["error"]["hint"]
        assert "checkpoints/probe" in hint and "vae/probe-vae.safetensors" in hint, hint  # the models, by their place
        listed = hint.split("choose one of: ", 1)[1].split(", ")
        assert not any(n.endswith(".png") for n in listed) and "loras" not in listed and "unet" not in listed, hint
        assert "secret" not in hint, hint  # nothing through the link: the link itself is the owner's entry, as at the top
    r = svc.post_job("generate", model="checkpoints/probe", prompt="a cube", init_image="init.png")
    assert r.status_code == 400 and "inputs/init.png" in r.json()["error"]["hint"], r.text  # images for an image
    r = svc.post_job("generate", model="checkpoints/probe", prompt="a cube", lora_dir="elsewhere")
    assert r.status_code == 400 and "loras" in r.json()["error"]["hint"] and "elsewhere" not in r.json()["error"]["hint"]
    job = svc.start_job("generate", model="checkpoints/probe", prompt="a cube", vae="vae/probe-vae.safetensors",
                        init_image="inputs/init.png", strength=0.5, lora_dir="loras", width=64, height=64, steps=1, seed=3)
    progress, event, data = svc.follow(job["id"])
    assert event == "result", data
    assert data["result"]["init_image"] == "init.png"
    assert data["result"]["components"] == {"vae": "probe-vae.safetensors"}


def test_service_errors_speak_the_apis_words_never_the_clis(start_service, installed_home, probe_model, tmp_path):
    from filelock import FileLock

    models = tmp_path / "models"
    (models / "controlnet").mkdir(parents=True)
    (models / "checkpoints").mkdir()
    (models / "checkpoints" / "probe").symlink_to(probe_model.path, target_is_directory=True)
    (models / "controlnet" / "edges.safetensors").write_bytes(b"x" * 64)
    svc = start_service("--models-dir", str(models), home=installed_home / "home", cache=installed_home / "cache")
    job = svc.start_job("generate", model="checkpoints/probe", prompt="a cube", control_net="controlnet/edges.safetensors")
    _progress, event, data = svc.follow(job["id"])
    assert event == "error", data
    said = data["error"]["message"] + " " + data["error"]["hint"]
    assert "--control" not in said and "control_net" in said and "control_image" in said, data["error"]

    lock = FileLock(str(installed_home / "home" / "install.lock"))  # another accelstack process changes the home
    with lock:
        job = svc.start_job("repair")
        _progress, event, data = svc.follow(job["id"])
    assert event == "error" and data["error"]["action"] == "wait", data
    hint = data["error"]["hint"]
    assert "--wait" not in hint and "pass " not in hint and "start the job again" in hint, hint
