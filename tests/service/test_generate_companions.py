"""The service's generate job takes lora_dir / embeddings_dir as names of folders in its models
directory (the rule it applies to the model), never as paths from the request."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from companion_files import embedding, kohya_lora  # noqa: E402  (the engine tests' tiny files)


def test_generate_takes_lora_and_embedding_folders_by_name(start_service, installed_home, probe_model, tmp_path):
    models = tmp_path / "models"
    (models / "loras").mkdir(parents=True)
    (models / "embeddings").mkdir()
    (models / "probe").symlink_to(probe_model.path, target_is_directory=True)
    kohya_lora(models / "loras" / "style.safetensors")
    embedding(models / "embeddings" / "glowstyle.safetensors")
    outside = tmp_path / "outside"
    outside.mkdir()
    (models / "linked").symlink_to(outside, target_is_directory=True)
    svc = start_service("--models-dir", str(models), home=installed_home / "home", cache=installed_home / "cache")
    for field in ("lora_dir", "embeddings_dir"):
        for name in ("../loras", str(models / "loras"), "missing", "linked", "probe/x"):
            r = svc.post_job("generate", model="probe", prompt="a cube <lora:style:1>", **{field: name})
            assert r.status_code == 400 and "loras" in r.json()["error"]["hint"], r.text
    job = svc.start_job("generate", model="probe", prompt="a glowstyle cube <lora:style:0.5>", lora_dir="loras",
                        embeddings_dir="embeddings", width=64, height=64, steps=1, seed=3)
    progress, event, data = svc.follow(job["id"])
    assert event == "result", data
    assert data["result"]["loras"] == [{"name": "style", "weight": 0.5, "tensors": 21, "applied": 63, "total": 63, "warning": ""}]
    assert data["result"]["embeddings"] == ["glowstyle"]
