"""Bad input gets a clear error that names the problem and what to do: config.yaml, requests,
model files, runtimes, and the CLI's exit codes. No worker is needed for any of these."""
from __future__ import annotations

import json
import pickle
import struct
import zipfile
from pathlib import Path

import pytest

from accelstack.domain import RUNTIME_LIBS_NOTE, RUNTIME_LIBS_NOTE_FORMAT
from accelstack.engine.config import EngineOptions, apply_overrides, load_config, options_from_mapping
from accelstack.engine.errors import ConfigError, GenerationError, InvalidRequestError, ModelLoadError, RuntimeNotFoundError
from accelstack.engine.generation import output_paths
from accelstack.engine.models.check import check_model
from accelstack.engine.runtime import Runtime
from accelstack.engine.worker.protocol import GenerateRequest
from accelstack.errors import Action
from accelstack.settings import Settings

from engine_helpers import cli_env, run_cli


# -- config.yaml ---------------------------------------------------------------------------------------
def test_defaults_when_no_config_file(tmp_path):
    assert load_config(Settings.resolve().config_file, missing_ok=True) == EngineOptions()  # ACCELSTACK_CONFIG: a missing file
    opts = EngineOptions()
    assert opts.flash_attention and opts.threads == 0  # offload, VAE tiling, weight type: auto (engine.memory.plan)
    assert (opts.offload_to_cpu, opts.vae_tiling, opts.weight_type) == ("auto", "auto", "auto")


def test_valid_config_file(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("engine:\n  flash_attention: false\n  vae_tiling: true\n  vae_tile_size: 16\n"
                   "  threads: 3\n  weight_type: Q8_0\n")
    opts = load_config(cfg)
    assert opts == EngineOptions(flash_attention=False, vae_tiling=True, vae_tile_size=16, threads=3, weight_type="q8_0")
    assert load_config(cfg) == load_config(str(cfg))
    (tmp_path / "auto.yaml").write_text("engine:\n  threads: auto\n")
    assert load_config(tmp_path / "auto.yaml").threads == 0


@pytest.mark.parametrize("text, words", [
    ("engine:\n  flash_atention: true\n", ["engine.flash_atention", "allowed", "flash_attention"]),
    ("engine:\n  vae_tiling: maybe\n", ["engine.vae_tiling", "true or false"]),
    ("engine:\n  vae_tile_size: 2\n", ["engine.vae_tile_size", "from 4 to 512"]),
    ("engine:\n  threads: -2\n", ["engine.threads", "auto or an integer from 1 to 512"]),
    ("engine:\n  weight_type: q9\n", ["engine.weight_type", "f16", "q8_0"]),
    ("engin:\n  threads: 2\n", ["unknown section engin", "engine"]),
    ("engine: [1, 2]\n", ["'engine' must be a mapping"]),
    ("- just\n- a list\n", ["expected a mapping"]),
    ("engine:\n  threads: 2\n bad: indent\n", ["not valid YAML", "line"]),
])
def test_invalid_config_names_the_key_and_allowed_values(tmp_path, text, words):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    for w in words:
        assert w in str(err.value), (w, str(err.value))
    assert str(cfg) in err.value.message


def test_missing_explicit_config_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_overrides_from_flags():
    opts = apply_overrides(EngineOptions(), {"threads": 4, "vae_tiling": True, "flash_attention": None})
    assert opts.threads == 4 and opts.vae_tiling and opts.flash_attention
    with pytest.raises(InvalidRequestError, match="--weight-type"):
        apply_overrides(EngineOptions(), {"weight_type": "int3"})
    assert options_from_mapping(None) == EngineOptions()


def test_cli_reports_an_invalid_config_yaml(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("engine:\n  offload_to_cpu: sometimes\n")
    res = run_cli(["verify", "--runtime", tmp_path, "--config", cfg], cli_env(tmp_path / "cache", tmp_path))
    assert res.returncode == 2
    assert "engine.offload_to_cpu must be true or false" in res.stderr and "Traceback" not in res.stderr


# -- requests --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("field, value, words", [
    ("width", 100, ["width 100", "multiple of 8", "try width 96"]),
    ("height", 30, ["height 30", "between 64 and 4096"]),
    ("steps", 0, ["steps", "between 1 and"]),
    ("sampler", "euler_x", ["unknown sampler 'euler_x'", "euler_a"]),
    ("scheduler", "fancy", ["unknown scheduler 'fancy'", "karras"]),
    ("batch_count", 0, ["batch count"]),
    ("cfg_scale", -1.0, ["cfg scale"]),
])
def test_bad_requests_are_refused_with_the_reason(field, value, words):
    req = GenerateRequest(prompt="x", **{field: value})
    with pytest.raises(GenerationError) as err:
        req.validate()
    text = str(err.value)
    for w in words:
        assert w in text, (w, text)


def test_output_names_for_batches(tmp_path):
    assert output_paths(tmp_path / "a.png", 1) == [tmp_path / "a.png"]
    assert output_paths(tmp_path / "a.png", 2) == [tmp_path / "a-1.png", tmp_path / "a-2.png"]
    assert output_paths(str(tmp_path / "img_%d.png"), 2)[1] == tmp_path / "img_2.png"
    with pytest.raises(GenerationError, match=r"\.png"):
        output_paths(tmp_path / "a.jpg", 1)


# -- model files ----------------------------------------------------------------------------------------
def _safetensors(path: Path, header: dict, data: bytes) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def test_missing_model(tmp_path):
    with pytest.raises(ModelLoadError) as err:
        check_model(tmp_path / "sd15.safetensors")
    assert "sd15.safetensors does not exist" in err.value.message


@pytest.mark.parametrize("make, reason", [
    (lambda p: p.write_bytes(b""), "empty"),
    (lambda p: p.write_bytes(b"\x10\x00"), "only 2 bytes"),
    (lambda p: p.write_bytes(struct.pack("<Q", 10 ** 6) + b"{}"), "header length"),
    (lambda p: p.write_bytes(struct.pack("<Q", 4) + b"nope" + b"\0" * 8), "not JSON"),
    (lambda p: _safetensors(p, {"w": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]}}, b"\0" * 4), "truncated"),
    (lambda p: _safetensors(p, {"__metadata__": {}}, b""), "no tensors"),
])
def test_corrupt_safetensors_gets_a_reason(tmp_path, make, reason):
    path = tmp_path / "model.safetensors"
    make(path)
    with pytest.raises(ModelLoadError) as err:
        check_model(path)
    assert str(path) in err.value.message and reason in err.value.message
    assert err.value.hint


def test_other_formats(tmp_path):
    (tmp_path / "empty.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\0" * 16)  # no tensors: as safetensors, refused
    with pytest.raises(ModelLoadError, match="holds no tensors"):
        check_model(tmp_path / "empty.gguf")
    (tmp_path / "m.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + struct.pack("<Q", 1) + b"w"
                                      + struct.pack("<IQIQ", 1, 8, 0, 0) + b"\0" * 64)  # one F32 tensor of 8
    assert check_model(tmp_path / "m.gguf").kind == "gguf"
    (tmp_path / "bad.gguf").write_bytes(b"NOPE" * 4)
    with pytest.raises(ModelLoadError, match="GGUF"):
        check_model(tmp_path / "bad.gguf")
    with zipfile.ZipFile(tmp_path / "m.ckpt", "w") as archive:  # the layout torch.save writes
        archive.writestr("archive/data.pkl", pickle.dumps({"w": 1}, protocol=2))
        archive.writestr("archive/data/0", b"\0" * 16)
    assert check_model(tmp_path / "m.ckpt").kind == "ckpt"
    (tmp_path / "fake.ckpt").write_bytes(b"PK\x03\x04" + b"\0" * 16)  # a zip magic and nothing else
    with pytest.raises(ModelLoadError, match="no zip directory"):
        check_model(tmp_path / "fake.ckpt")
    (tmp_path / "bad.ckpt").write_bytes(b"hello world, no pickle")
    with pytest.raises(ModelLoadError, match="torch checkpoint"):
        check_model(tmp_path / "bad.ckpt")
    (tmp_path / "notes.txt").write_text("a text file")
    with pytest.raises(ModelLoadError, match="unknown model format"):
        check_model(tmp_path / "notes.txt")


def test_diffusers_folder_must_be_complete(tmp_path):
    (tmp_path / "unet").mkdir()
    with pytest.raises(ModelLoadError) as err:
        check_model(tmp_path)
    assert "unet/diffusion_pytorch_model.safetensors" in err.value.message
    assert "folder" in (err.value.hint or "")


def test_probe_model_passes_the_checks(probe_model):
    """Its folder or its file: one safetensors file holding the three parts."""
    for given in (probe_model.path, probe_model.model):
        info = check_model(given)
        assert info.kind == "safetensors" and info.tensors == 196 + 686 + 248 and info.path == probe_model.model


# -- runtimes and the CLI ------------------------------------------------------------------------------
def test_runtime_checks(tmp_path):
    with pytest.raises(ConfigError, match="unknown backend 'cdua'"):
        Runtime(tmp_path, backend="cdua").check()
    with pytest.raises(RuntimeNotFoundError, match="does not exist"):
        Runtime(tmp_path / "nope").check()
    with pytest.raises(RuntimeNotFoundError, match="no stable_diffusion_cpp") as err:
        Runtime(tmp_path).check()
    assert err.value.action == Action.INSTALL and err.value.hint and "accelstack" not in err.value.hint
    env = Runtime(tmp_path, env={"CUDA_VISIBLE_DEVICES": "1"}).worker_env({"PYTHONPATH": "/x"})
    assert env["PYTHONPATH"].split(":")[:2] == [str(tmp_path), "/x"] and env["CUDA_VISIBLE_DEVICES"] == "1"


def test_the_worker_is_told_its_runtimes_libraries_and_stack_as_options(tmp_path):
    # What the parent decides reaches the worker on its command line (the runtime's library note,
    # read here, and its stack), not through variables the worker would read itself.
    libs = tmp_path / "libs"
    libs.mkdir()
    (libs / "libcudart.so.13").write_bytes(b"")
    (libs / "libcublas.so.13").write_bytes(b"")
    rt = tmp_path / "rt"
    (rt / "stable_diffusion_cpp").mkdir(parents=True)
    (rt / RUNTIME_LIBS_NOTE).write_text(json.dumps({"format": RUNTIME_LIBS_NOTE_FORMAT, "libraries": [
        {"dir": str(libs), "base": "absolute", "files": ["libcudart.so.13", "libcublas.so.13"]}]}))
    cmd = Runtime(rt, backend="cuda").check().worker_command()
    assert cmd[3:] == ["--backend", "ggml", "--lib-dir", str(libs), "--preload", str(libs / "libcudart.so.13"),
                       "--preload", str(libs / "libcublas.so.13")]
    assert Runtime(tmp_path, backend="torch").worker_command()[3:] == ["--backend", "torch"]  # no note is read
    assert Runtime(rt, backend="torch").stack == "torch" and Runtime(rt, backend="vulkan").stack == "ggml"


def test_verify_without_runtime_says_what_to_do(tmp_path):
    res = run_cli(["verify"], cli_env(tmp_path / "cache", tmp_path))
    assert res.returncode == 1
    assert "no runtime" in res.stderr and "--runtime" in res.stderr and "accelstack install" in res.stderr


def test_generate_cli_bad_inputs_fail_before_any_work(tmp_path):
    env = cli_env(tmp_path / "cache", tmp_path)
    res = run_cli(["generate", "--runtime", tmp_path, "-m", tmp_path / "missing.safetensors", "-p", "x"], env)
    # a missing input file is a usage error, exit 2 (issue 25; it was 1)
    assert res.returncode == 2 and "missing.safetensors does not exist" in res.stderr
    (tmp_path / "junk.safetensors").write_bytes(b"\xff" * 64)
    res = run_cli(["generate", "--runtime", tmp_path, "-m", tmp_path / "junk.safetensors", "-p", "x"], env)
    assert res.returncode == 1 and "not a valid safetensors file" in res.stderr
    assert "NULL pointer" not in res.stderr and "Traceback" not in res.stderr
    res = run_cli(["generate", "-m", tmp_path / "junk.safetensors", "-p", "x", "-W", "500", "--json"], env)
    assert res.returncode == 2  # a usage error, like every other bad argument
    assert json.loads(res.stdout)["message"].startswith("width 500 is not allowed")
    res = run_cli(["generate", "-m", tmp_path / "junk.safetensors", "-p", "x", "--steps", "0"], env)
    assert res.returncode == 2 and "steps must be an integer" in res.stderr
    res = run_cli(["generate", "-m", tmp_path / "junk.safetensors", "-p", "x", "--sampler", "magic"], env)
    assert res.returncode == 2 and "unknown sampler 'magic'" in res.stderr and "euler_a" in res.stderr
