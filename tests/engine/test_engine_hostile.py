"""Hostile input to the engine is refused with a short typed error before any work starts:
config.yaml, generation parameters, prompts, output paths, model paths (issue 10).
No worker is started here; the worker's HTTP server and crashes are in test_engine_hostile_worker."""
from __future__ import annotations

import json
import os
import stat

import pytest

from accelstack.engine import generation
from accelstack.engine.config import EngineOptions, apply_overrides, load_config
from accelstack.engine.errors import ConfigError, GenerationError, InsufficientMemoryError, InvalidRequestError
from accelstack.engine.generation import check_outputs, output_paths
from accelstack.engine.memory import estimate as memory
from accelstack.engine.memory.device import MachineMemory
from accelstack.engine.worker.protocol import DeviceInfo, GenerateRequest, WorkerStatus
from accelstack.limits import MAX_PROMPT_CHARS, MAX_THREADS

from engine_helpers import cli_env, run_cli


# -- config.yaml -------------------------------------------------------------------------------------
@pytest.mark.parametrize("data, words", [
    (b"\xff\xfe\x00engine", ["not UTF-8"]),
    (b"engine:\n  threads: 2\x00\n", ["NUL"]),
    (("engine:\n  threads: " + "[" * 5000 + "]" * 5000 + "\n").encode(), ["nests"]),
    (b"a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
     b"engine:\n  weight_type: [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n", ["alias"]),
    (b"engine:\n  weight_type: " + b"q" * 300_000 + b"\n", ["more than the 256 KiB accepted"]),
    (b"engine:\n  weight_type: '" + b"q" * 100_000 + b"'\n", ["engine.weight_type", "..."]),
    (b"engine:\n  threads: 1" + b"0" * 5000 + b"\n", ["not valid YAML", "digits"]),
    (b"engine:\n  ? [a, b]\n  : 1\n", ["config file"]),
    (b"engine:\n  threads: 513\n", ["from 1 to 512"]),
    (b"engine:\n  vae_tile_size: 100000\n", ["from 4 to 512"]),
    (b"engine:\n  threads: .nan\n", ["engine.threads"]),
    (b"engine:\n  weight_type: !!binary aGVsbG8=\n", ["engine.weight_type"]),
    (b"!!python/object:os.system {}\n", ["not valid YAML"]),
])
def test_hostile_config_gives_a_short_typed_error(tmp_path, data, words):
    cfg = tmp_path / "config.yaml"
    cfg.write_bytes(data)
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    text = str(err.value)
    assert len(text) < 1000, text[:300]
    for w in words:
        assert w in text, (w, text)


def test_config_that_is_not_a_regular_file_is_never_opened(tmp_path):
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)  # opening it for reading would block forever
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config(tmp_path)


def test_engine_options_ranges():
    assert apply_overrides(EngineOptions(), {"threads": MAX_THREADS}).threads == MAX_THREADS
    assert apply_overrides(EngineOptions(), {"threads": "auto"}).threads == 0
    for bad in (MAX_THREADS + 1, 5000, -1, True, 2.5, "many"):  # a flag's value: a usage error naming it
        with pytest.raises(InvalidRequestError, match="--threads must be"):
            apply_overrides(EngineOptions(), {"threads": bad})
    with pytest.raises(ConfigError):  # the worker validates what it receives too
        EngineOptions(threads=10 ** 6).validate()
    with pytest.raises(ConfigError):
        EngineOptions(weight_type=["f16"]).validate()  # type: ignore[arg-type]


# -- generation parameters and prompts ---------------------------------------------------------------------
@pytest.mark.parametrize("field, value, words", [
    ("prompt", "x" * (MAX_PROMPT_CHARS + 1), ["characters long", "75-token chunks", "shorten"]),
    ("negative_prompt", "y" * 100_000, ["negative prompt is 100000 characters"]),
    ("prompt", "a (cat:.) b", ["attention weight"]),  # std::stof(".") aborts the worker (found by hand)
    ("prompt", "(cat:1" + "0" * 60 + ")", ["attention weight"]),  # out of float range: std::stof throws
    ("prompt", "(cat:0.0000000000000000000000000000000000000000001)", ["attention weight"]),
    ("prompt", "a <lora:/dev/zero:1> cat", ["lora"]),  # the bindings would read any file as a LoRA
    ("prompt", "nul\x00byte", ["NUL"]),
    ("prompt", "lone \ud800 surrogate", ["surrogate"]),
    ("prompt", 12, ["must be text"]),
    ("width", 10 ** 100, ["more than 30 digits", "try width 4096"]),
    ("height", 4104, ["between 64 and 4096"]),
    ("steps", 10 ** 6, ["steps"]),
    ("cfg_scale", float("nan"), ["cfg scale"]),
    ("cfg_scale", float("inf"), ["cfg scale"]),
    ("seed", 2 ** 64, ["seed"]),
    ("seed", -(2 ** 70), ["seed"]),
    ("clip_skip", 1000, ["clip skip"]),
    ("sampler", ["euler"], ["unknown sampler"]),
    ("batch_count", 10 ** 9, ["batch count"]),
])
def test_hostile_requests_are_refused(field, value, words):
    kwargs = {"prompt": "a cat", field: value}
    with pytest.raises(GenerationError) as err:
        GenerateRequest(**kwargs).validate()
    text = str(err.value)
    assert len(text) < 600
    for w in words:
        assert w.lower() in text.lower(), (w, text)


def test_reasonable_prompts_pass():
    GenerateRequest(prompt="a (house:1.3) [on] a (hill:0.5), sun, (((sky))). BREAK \\(literal\\)").validate()
    GenerateRequest(prompt="p" * MAX_PROMPT_CHARS, negative_prompt="blurry, (ugly:-1.5)", seed=-1).validate()


# -- output paths ----------------------------------------------------------------------------------------
def test_outputs_checked_before_any_work(tmp_path):
    (tmp_path / "dir.png").mkdir()
    (tmp_path / "file").write_text("x")
    os.mkfifo(tmp_path / "fifo.png")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    cases = {tmp_path / "dir.png": "existing folder", tmp_path / "file" / "a.png": "file, not a folder",
             tmp_path / "fifo.png": "not a regular file", tmp_path / ("n" * 300 + ".png"): "longer than 255"}
    if os.geteuid() != 0:
        cases[ro / "a.png"] = "not writable"
    for path, words in cases.items():
        with pytest.raises(GenerationError) as err:
            check_outputs([path])
        assert words in err.value.message, (path, err.value.message)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert check_outputs(output_paths(tmp_path / "new" / "deeper" / "x.png", 2))  # created when writing
    assert check_outputs([tmp_path / "file.png"])
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing created by the check


def test_an_output_that_is_one_of_the_inputs_is_refused_before_any_work(tmp_path):
    """`-o` naming the --init-image (or --control-image) would overwrite the user's picture with the
    result; no image is worth that, and nothing says the user meant it."""
    from component_files import write_png_image

    init = write_png_image(tmp_path / "photo.png", 64, 64)
    before = init.read_bytes()
    env = cli_env(tmp_path / "cache", tmp_path)
    model = tmp_path / "m.safetensors"
    model.write_bytes(b"\xff" * 64)
    for flag, output, extra in (("--init-image", init, []), ("--init-image", tmp_path / "." / "photo.png", []),
                                ("--control-image", init, ["--control-net", str(model)])):
        res = run_cli(["generate", "--runtime", tmp_path, "-m", model, "-p", "x", "-W", "64", "-H", "64", flag, init,
                       *extra, "-o", output, "--json"], env)
        line = json.loads(res.stdout.splitlines()[-1])
        assert res.returncode == 2 and line["code"] == "output-path", (flag, line)
        assert flag in line["message"] and "photo.png" in line["message"], line
    assert init.read_bytes() == before


def test_cli_refuses_bad_values_before_any_work(tmp_path):
    """No runtime, no model needed: every refusal comes first, as a typed error, no traceback."""
    env = cli_env(tmp_path / "cache", tmp_path)
    (tmp_path / "outdir.png").mkdir()
    model = tmp_path / "m.safetensors"
    model.write_bytes(b"\xff" * 64)
    cases = [  # a bad request value is a usage error (2), like a bad option; so is an unusable output path (issue 25; was 1)
        (["-p", "x", "-o", tmp_path / "outdir.png"], 2, "existing folder"),
        (["-p", "x", "-o", tmp_path], 2, "existing folder"),  # the folder, not its .png name, is what is wrong
        (["-p", "x", "-o", tmp_path / "x.jpg"], 2, "must be a .png file"),
        (["-p", "x", "-o", tmp_path / "x-%d.jpg", "-b", "2"], 2, "must be a .png file"),
        (["-p", "x", "-o", ""], 2, "the output path is empty"),
        (["-p", "x" * (MAX_PROMPT_CHARS + 1)], 2, "characters long"),
        (["-p", "(cat:.)"], 2, "attention weight"),
        (["-p", "x", "--threads", "5000"], 2, "from 1 to 512"),
        (["-p", "x", "--threads", "9" * 5000], 2, "--threads"),
        (["-p", "x", "--cfg-scale", "nan"], 2, "cfg scale"),
        (["-p", "x", "--vae-tile-size", "99999999999"], 2, "--vae-tile-size must be"),
        (["-p", "x", "--weight-type", "q9"], 2, "--weight-type must be auto or one of"),
        (["-p", "x", "--width", "abc"], 2, "invalid int value"),
    ]
    for extra, code, words in cases:
        res = run_cli(["generate", "--runtime", tmp_path, "-m", model, *extra], env)
        assert res.returncode == code, (extra[-1], res.returncode, res.stderr[-500:])
        assert words in res.stderr and "Traceback" not in res.stderr, (words, res.stderr[-500:])
        assert len(res.stderr) < 3000
        assert "fix the file" not in res.stderr, "a flag is not a config file"
        if "-o" in extra:  # an output path is a usage error of its own kind (docs/json.md)
            line = json.loads(run_cli(["generate", "--runtime", tmp_path, "-m", model, *extra, "--json"],
                                      env).stdout.splitlines()[-1])
            assert line["code"] == "output-path", (extra, line)
    assert not (tmp_path / "home").exists()


# -- memory estimate -----------------------------------------------------------------------------------
def test_memory_estimate_matches_the_calibration():
    """The formula against the peaks measured on the CPU build (see engine.memory.estimate): within 25 MiB
    above 128 px, and never below what was measured."""
    measured = {(256, False, 32, True): 425, (384, False, 32, True): 956, (384, True, 8, True): 106,
                (384, True, 32, True): 431, (384, True, 16, False): 204}
    for (side, tiling, tile, flash), mib in measured.items():
        options = EngineOptions(vae_tiling=tiling, vae_tile_size=tile, flash_attention=flash)
        est = memory.activations(side, side, options) / 2 ** 20
        assert mib <= est <= mib + 40, (side, tiling, tile, flash, est, mib)


def test_memory_check_refuses_with_the_numbers_and_what_to_lower():
    gib = 2 ** 30
    req = GenerateRequest(prompt="x", width=4096, height=4096, batch_count=2)
    opts = EngineOptions()
    need = memory.estimate(2 * gib, req, opts)
    assert need.ram > 100 * gib  # the VAE decodes 16.8 Mpx at ~6.6 KiB each
    with pytest.raises(InsufficientMemoryError) as err:
        memory.check(need, req, opts, ram_available=22 * gib)
    msg, hint = err.value.message, err.value.hint
    assert "4096x4096 x2" in msg and "22.0 GiB is available" in msg and "model 2.0 GiB" in msg
    assert "fits" in hint and "VAE tiling" in hint and "smaller batch" in hint and "memory_check" in hint
    side = int(hint.split("about ")[1].split("x")[0])
    fits = GenerateRequest(prompt="x", width=side, height=side, batch_count=2)
    memory.check(memory.estimate(2 * gib, fits, opts), fits, opts, ram_available=22 * gib)
    tiled = EngineOptions(vae_tiling=True)
    memory.check(memory.estimate(2 * gib, req, tiled), req, tiled, ram_available=22 * gib)  # tiles fit
    memory.check(need, req, opts, ram_available=None)  # unknown memory: not checked
    gpu = memory.estimate(2 * gib, req, opts, gpu=True)
    with pytest.raises(InsufficientMemoryError, match="GPU memory"):
        memory.check(gpu, req, opts, ram_available=64 * gib, vram_free=24 * gib)


def test_a_4096_image_is_refused_before_any_worker_starts(tmp_path, cpu_runtime, probe_model, monkeypatch):
    machine = MachineMemory(ram_available=22 * 2 ** 30)  # this machine's size, on any machine
    req = GenerateRequest(prompt="x", width=4096, height=4096, steps=1)
    started = []
    monkeypatch.setattr(generation.Supervisor, "start", lambda self: started.append(1))
    with pytest.raises(InsufficientMemoryError) as err:  # untiled, as set (auto would tile it: test_memory_plan)
        generation.generate(cpu_runtime, probe_model.path, req, tmp_path / "big.png", options=EngineOptions(vae_tiling=False),
                            machine=machine)
    assert "needs about" in err.value.message and not started and not (tmp_path / "big.png").exists()
    with pytest.raises(InvalidRequestError, match="--memory-check must be true or false"):
        apply_overrides(EngineOptions(), {"memory_check": "no"})
    assert not apply_overrides(EngineOptions(), {"memory_check": False}).memory_check


def test_free_gpu_memory_reported_by_the_worker_is_checked_before_the_job():
    """On a GPU runtime the worker reports the device's free memory once the model is loaded; the
    working memory (plus the offloaded UNet) is checked against it before the job is sent."""
    gib = 2 ** 30
    req = GenerateRequest(prompt="x", width=2048, height=2048)
    opts = EngineOptions()
    need = memory.estimate(2 * gib, req, opts, gpu=True)

    class FakeSupervisor:
        last_status = WorkerStatus(phase="ready", pid=1, device=DeviceInfo(name="GPU0", kind="gpu", memory_free=8 * gib))

    with pytest.raises(InsufficientMemoryError) as err:
        generation._check_device_memory(FakeSupervisor(), need, req, opts)  # type: ignore[arg-type]
    assert "GPU memory" in err.value.message and "8.0 GiB is available" in err.value.message
    FakeSupervisor.last_status.device.memory_free = 64 * gib
    generation._check_device_memory(FakeSupervisor(), need, req, opts)  # type: ignore[arg-type]
    FakeSupervisor.last_status.device = DeviceInfo(name="CPU", kind="cpu", memory_free=1)
    generation._check_device_memory(FakeSupervisor(), need, req, opts)  # type: ignore[arg-type]  # CPU: RAM was checked
