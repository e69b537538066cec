"""Issue 25: the same kind of failure has the same exit code on every command (docs/json.md):
a missing input file, an unwritable output, a bad value are usage errors (2); a size this
machine's memory cannot hold is "cannot be done on this machine" (3), with hints naming flags."""
from __future__ import annotations

from pathlib import Path

import pytest

from accelstack.engine.config import EngineOptions
from accelstack.engine.errors import InsufficientMemoryError
from accelstack.engine.memory import estimate as memory
from accelstack.engine.worker.protocol import GenerateRequest
from accelstack.errors import NotPossibleHere

from cli_helpers import error_of, run_cli

MISSING = "/nonexistent-accelstack-input/x"
CASES = [
    (["generate", "--model", MISSING + ".safetensors", "-p", "x"], "does not exist"),
    (["generate", "-m", "MODEL", "-p", "x", "--runtime", MISSING], "--runtime"),
    (["generate", "-m", "MODEL", "-p", "x", "--config", MISSING], "does not exist"),
    (["generate", "-m", "MODEL", "-p", "x", "-W", "-5"], "width"),
    (["generate", "-m", "MODEL", "-p", "x", "-o", "OUTDIR"], "existing folder"),
    (["plan", "--hardware", MISSING + ".json"], "cannot read"),
    (["install", "--hardware", MISSING + ".json"], "cannot read"),
    (["install", "--bundle", MISSING + ".zip"], "cannot open the bundle"),
    (["verify", "--width", "-5"], "unrecognized arguments"),
    (["verify", "--runtime", MISSING], "--runtime"),
    (["verify", "--cpu-runtime", MISSING], "--cpu-runtime"),
    (["verify", "--tolerance", "-1"], "--tolerance"),
    (["verify", "--tolerance", "nan"], "--tolerance"),
    (["verify", "--threads", "x"], "--threads"),
    (["verify", "--config", MISSING], "does not exist"),
    (["verify", "-o", "OUTDIR"], "existing folder"),
    (["manifest", "verify", MISSING + ".json"], "cannot read manifest"),
    (["channel", "add", "x", "https://127.0.0.1:9/m.json", "--key", MISSING + ".pub", "--no-check"], "public key"),
    (["detect", "--replay", MISSING], "not a capture"),
    (["plan", "--replay", MISSING], "not a capture"),
    (["install", "--dry-run", "--trusted-key", MISSING + ".pub"], "--trusted-key"),
    (["install", "--dry-run", "--trusted-key", "not-a-key"], "--trusted-key"),
]


@pytest.mark.parametrize("argv,words", CASES, ids=[" ".join(a for a in c[0] if a not in ("-m", "MODEL", "-p", "x")) for c in CASES])
def test_missing_inputs_and_bad_values_are_usage_errors(tmp_path, argv, words):
    state = tmp_path / "state"
    env = {"ACCELSTACK_HOME": str(state / "home"), "ACCELSTACK_CACHE": str(state / "cache"),
           "ACCELSTACK_PROBE_CACHE": str(state / "probe"), "ACCELSTACK_BUILD_CACHE": str(state / "builds"),
           "ACCELSTACK_OFFLINE": "1", "ACCELSTACK_DEBUG": ""}
    model = tmp_path / "m.safetensors"
    model.write_bytes(b"\xff" * 64)
    (tmp_path / "out.png").mkdir()
    argv = [str(model) if a == "MODEL" else str(tmp_path / "out.png") if a == "OUTDIR" else a for a in argv]
    rc, out, err = run_cli([*argv, "--json"], env, timeout=120)
    assert rc == 2, (argv, rc, out[-1500:], err[-1500:])
    e = error_of(out)  # exactly one final JSON line, the error, last
    assert words in e["message"], e
    assert "Traceback" not in err
    rc, out, err = run_cli(argv, env, timeout=120)
    assert rc == 2 and "Traceback" not in err, (argv, rc, err[-1500:])
    assert not (state / "builds").exists() and not (state / "probe").exists()  # refused before any work


def test_not_enough_memory_is_cannot_be_done_here_with_flags_in_the_hint():
    gib = 2 ** 30
    req = GenerateRequest(prompt="x", width=4096, height=4096, batch_count=2)
    opts = EngineOptions(flash_attention=False)
    with pytest.raises(InsufficientMemoryError) as err:
        memory.check(memory.estimate(2 * gib, req, opts), req, opts, ram_available=22 * gib)
    e = err.value
    assert e.exit_code == 3 and isinstance(e, NotPossibleHere)
    for flag in ("--width", "--height", "--vae-tiling", "--flash-attention", "--batch-count", "--no-memory-check"):
        assert flag in e.hint, (flag, e.hint)
    assert "engine option" not in e.hint
    gpu_opts = EngineOptions(offload_to_cpu=False)
    with pytest.raises(InsufficientMemoryError) as err:
        memory.check(memory.estimate(2 * gib, req, gpu_opts, gpu=True), req, gpu_opts, ram_available=64 * gib,
                     vram_free=4 * gib)
    assert err.value.exit_code == 3 and "--offload-to-cpu" in err.value.hint


def test_docs_list_the_exit_codes_the_cli_uses():
    text = (Path(__file__).resolve().parents[1] / "docs" / "json.md").read_text()
    table = text.split("## Exit codes", 1)[1].split("##", 1)[0]
    for code in ("| 0 |", "| 1 |", "| 2 |", "| 3 |", "| 130 |", "| 141 |", "| 143 |"):
        assert code in table, code
    assert "missing input file" in table and "not enough memory" in table
