"""The probe model: architecture, value rules, determinism, cache behaviour, and the real file."""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from accelstack.engine.errors import ProbeModelError
from accelstack.engine.probes.architecture import sd1_tensors, value_rule
from accelstack.engine.probes.layout import PREFIXES, probe_weights, split_parts
from accelstack.engine.probes.model import MARKER, OWNER, PARTS, WEIGHTS, ensure_probe_model, pools_file_name, probe_dir_name
from accelstack.engine.probes.weights import (
    Pools,
    base_pool,
    encode,
    pack_pools,
    scales_in_order,
    unpack_pools,
    write_part,
    write_parts,
)
from accelstack.errors import Action

REPO_ROOT = Path(__file__).resolve().parents[3]
REFERENCE = Path(__file__).resolve().parents[4] / "shared" / "reference" / "sd1-diffusers-tensors.json"

TINY = {
    "text_encoder": {"text_model.embeddings.token_embedding.weight": (50, 8), "text_model.final_layer_norm.weight": (8,),
                     "text_model.final_layer_norm.bias": (8,)},
    "unet": {"conv_in.weight": (16, 4, 3, 3), "conv_in.bias": (16,), "big.weight": (1_100_000, 2)},
    "vae": {"decoder.conv_out.weight": (3, 16, 3, 3), "decoder.conv_out.bias": (3,)},
}


def read_safetensors(path: Path):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        if info["dtype"] == "F8_E5M2":  # the high byte of an f16
            values = (np.frombuffer(data[b:e], dtype=np.uint8).astype("<u2") << 8).view("<f2")
        else:
            values = np.frombuffer(data[b:e], dtype="<f2")
        out[name] = values.reshape(info["shape"])
    return header, out, n


def read_probe(folder: Path):
    """A probe folder's one file: its header, ``{part: {name: values}}`` and the header's length."""
    header, tensors, n = read_safetensors(Path(folder) / WEIGHTS)
    return header, split_parts(tensors), n


@pytest.mark.skipif(not REFERENCE.is_file(), reason="shared reference tensor list not present")
def test_architecture_matches_the_reference_tensor_list():
    ref = json.loads(REFERENCE.read_text())
    mine = sd1_tensors()
    assert set(mine) == set(ref["tensors"]) == set(PARTS)
    for part, tensors in ref["tensors"].items():
        assert {k: tuple(v) for k, v in tensors.items()} == mine[part], part


def test_parameter_counts_are_sd1():
    counts = {part: sum(math.prod(s) for s in t.values()) for part, t in sd1_tensors().items()}
    assert counts == {"text_encoder": 123_060_480, "unet": 859_520_964, "vae": 83_653_863}


def test_value_rules():
    assert value_rule("x.norm1.weight", (320,)) == ("const", 1.0)
    assert value_rule("x.norm1.bias", (320,)) == ("const", 0.0)
    assert value_rule("text_model.embeddings.token_embedding.weight", (49408, 768)) == ("random", 0.02)
    kind, std = value_rule("conv.weight", (320, 640, 3, 3))
    assert kind == "random" and std == pytest.approx(1 / math.sqrt(640 * 9))


def test_pool_is_standardized_bounded_and_seeded():
    a = base_pool(7, size=200_003)
    assert abs(a.mean()) < 0.02 and abs(a.std() - 1) < 0.02 and np.abs(a).max() <= 6
    assert np.array_equal(a, base_pool(7, size=200_003))
    assert not np.array_equal(a, base_pool(8, size=200_003))
    # exact integer/float arithmetic: the bytes are part of the format (FORMAT_VERSION)
    assert hashlib.sha256(base_pool(1234, size=1000).tobytes()).hexdigest()[:16] == GOLDEN_POOL


# Pinned: if these change, FORMAT_VERSION must change too (cached probes would differ).
GOLDEN_POOL = "2f598e8bcef65e39"


def test_golden_pool_values_are_stable():
    assert base_pool(1234, size=4).tolist() == [0.8063497543334961, 1.3127301335334778, 0.7072187066078186,
                                                0.010830521583557129]


def test_pools_encoded_ahead_on_a_helper_thread_write_the_same_bytes(tmp_path):
    """Synthesis encodes the scaled pools on a helper thread while it writes (Pools.prefetch): the
    files are byte for byte those of encoding each pool when first needed, in both dtypes."""
    for dtype in ("F16", "F8_E5M2"):
        files = {}
        for way in ("serial", "prefetched"):
            pools = Pools(9, dtype)
            if way == "prefetched":
                pools.prefetch(scales_in_order(TINY))
            try:
                for part, tensors in TINY.items():
                    path = tmp_path / dtype / way / f"{part}.safetensors"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    write_part(path, tensors, pools, {"part": part}, lambda n: None)
                    files.setdefault(part, []).append(path.read_bytes())
            finally:
                pools.close()
        assert all(serial == prefetched for serial, prefetched in files.values())
    assert len(scales_in_order(TINY)) == 4  # the embedding, two convolutions and the 2-wide matrix


def test_a_failed_writer_cancels_the_encodings_left():
    pools = Pools(9, "F8_E5M2")
    pools.prefetch([0.1 * (i + 1) for i in range(40)])
    queued = list(pools._pending.values())
    pools.close()  # what _synthesize does when a write fails: nothing waits for the other 39
    assert not pools._pending
    # one helper thread, about 15 ms per pool: most had not started, and those are cancelled, not run
    assert sum(f.cancelled() for f in queued) >= 20
    assert len(bytes(pools.get(0.5))) == 2 * 1_048_573  # still usable: encoded on demand


def test_tiny_probe_is_deterministic_follows_rules_and_is_cached(tmp_path):
    events = []
    first = ensure_probe_model(5, cache_root=tmp_path / "a", architecture=TINY, progress=events.append)
    again = ensure_probe_model(5, cache_root=tmp_path / "a", architecture=TINY)
    other = ensure_probe_model(5, cache_root=tmp_path / "b", architecture=TINY)
    seed6 = ensure_probe_model(6, cache_root=tmp_path / "b", architecture=TINY)
    assert not first.cached and again.cached and again.path == first.path
    assert [e.kind for e in events][0] == "start" and events[-1].kind == "end" and events[-1].ok
    assert sorted(p.name for p in Path(first.path).iterdir()) == sorted([MARKER, OWNER, WEIGHTS])
    a = (Path(first.path) / WEIGHTS).read_bytes()
    assert a == (Path(other.path) / WEIGHTS).read_bytes(), "same seed, same bytes"
    assert a != (Path(seed6.path) / WEIGHTS).read_bytes(), "another seed, other bytes"
    header, parts, n = read_probe(Path(first.path))
    assert (8 + n) % 8 == 0
    assert header["__metadata__"]["seed"] == "5"
    assert set(header) - {"__metadata__"} == {PREFIXES[part] + name for part in TINY for name in TINY[part]}
    tensors, te = parts["unet"], parts["text_encoder"]
    assert tensors["conv_in.bias"].tolist() == [0.0] * 16
    big = tensors["big.weight"].astype(np.float64)
    assert np.isfinite(big).all()
    assert big.std() == pytest.approx(1 / math.sqrt(2), rel=0.05)
    # windows start at unrelated offsets: the two halves of a >pool tensor are not copies
    flat = big.ravel()
    assert not np.array_equal(flat[:1000], flat[1_048_573:1_048_573 + 1000])
    assert te["text_model.final_layer_norm.weight"].tolist() == [1.0] * 8
    assert te["text_model.embeddings.token_embedding.weight"].std() == pytest.approx(0.02, rel=0.3)


def test_synthesis_progress_is_in_bytes_so_it_is_shown_as_a_size(tmp_path):
    """The first-run screen showed "probe model (seed 1234): started (1066235307)": the events
    counted bytes without saying so, so the renderer printed the raw number (issue 25)."""
    from accelstack.commands.progress import ProgressRenderer

    events = []
    ensure_probe_model(7, cache_root=tmp_path, architecture=TINY, progress=events.append)
    counted = [e for e in events if e.kind in ("start", "advance")]
    assert counted and all((e.extra or {}).get("unit") == "B" for e in counted), counted
    out = io.StringIO()
    r = ProgressRenderer("lines", stream=out)
    for e in events:
        r(e)
    r.close()
    started = next(line for line in out.getvalue().splitlines() if "started" in line)
    assert re.search(r"started \([0-9.]+ (B|KiB|MiB|GiB)\)", started), started


def test_incomplete_kept_folder_is_rebuilt(tmp_path):
    model = ensure_probe_model(3, cache_root=tmp_path, architecture=TINY, keep=True)
    assert not model.temporary and Path(model.path).name == probe_dir_name(3, TINY)
    unet = Path(model.path) / WEIGHTS
    good = unet.read_bytes()
    unet.write_bytes(good[: len(good) // 2])  # a crash mid-write, or a damaged cache
    rebuilt = ensure_probe_model(3, cache_root=tmp_path, architecture=TINY, keep=True)
    assert not rebuilt.cached and unet.read_bytes() == good
    (Path(model.path) / MARKER).unlink()  # nothing says it is accelstack's any more: never replaced (issue 47)
    again = ensure_probe_model(3, cache_root=tmp_path, architecture=TINY, keep=True)
    assert not again.cached and again.temporary and unet.read_bytes() == good
    again.release()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")], "no temporary folders left"


def test_damaged_temporary_probe_is_made_again(tmp_path):
    model = ensure_probe_model(3, cache_root=tmp_path, architecture=TINY)
    unet = Path(model.path) / WEIGHTS
    unet.write_bytes(unet.read_bytes()[:10])
    again = ensure_probe_model(3, cache_root=tmp_path, architecture=TINY)
    assert not again.cached and again.path != model.path and not Path(model.path).exists()
    again.release()
    assert list(tmp_path.iterdir()) == []


def test_a_kept_probe_is_written_once_per_cache_and_used_by_every_call(tmp_path):
    kept = ensure_probe_model(4, cache_root=tmp_path, architecture=TINY, keep=True)
    assert not ensure_probe_model(4, cache_root=tmp_path, architecture=TINY, keep=True).seconds
    used = ensure_probe_model(4, cache_root=tmp_path, architecture=TINY)  # the default: temporary, unless kept
    assert used.cached and used.path == kept.path and not used.temporary
    used.release()  # never removes a kept probe
    assert Path(kept.path, MARKER).is_file()


_CHILD = """
import json, os, sys
from accelstack.engine.probes.model import ensure_probe_model
arch = json.loads(sys.argv[2])
p = ensure_probe_model(9, cache_root=sys.argv[1], architecture={k: {n: tuple(s) for n, s in v.items()} for k, v in arch.items()})
print(p.path, flush=True)
if sys.argv[3] == "killed":
    os._exit(0)  # no atexit: as if the process were killed
"""


def _child(root: Path, how: str) -> Path:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(root), json.dumps(TINY), how], capture_output=True,
                         text=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    return Path(out.stdout.strip())


def test_temporary_probe_is_removed_when_its_process_ends_and_a_killed_ones_swept(tmp_path):
    made = _child(tmp_path, "exits")
    assert made.parent == tmp_path and made.name.startswith(".tmp-")
    assert not made.exists() and list(tmp_path.iterdir()) == [], "nothing stays on disk"
    left = _child(tmp_path, "killed")
    assert left.is_dir() and json.loads((left / OWNER).read_text())["pid"] > 0
    mine = ensure_probe_model(9, cache_root=tmp_path, architecture=TINY)  # the next call sweeps it
    assert not left.exists() and mine.temporary
    mine.release()
    assert list(tmp_path.iterdir()) == []


def test_f8_e5m2_is_the_rounded_high_byte_of_f16():
    assert encode([1.0, -2.0, 0.0, 1.875], "F8_E5M2").tolist() == [0x3C, 0xC0, 0x00, 0x40]  # 1.875: tie to even
    values = np.linspace(-3, 3, 1001)
    back = (encode(values, "F8_E5M2").astype("<u2") << 8).view("<f2").astype(np.float64)
    nonzero = np.abs(values) > 1e-3
    assert np.all(np.abs(back - values)[nonzero] <= np.abs(values)[nonzero] * 0.125 + 1e-9)  # 2 mantissa bits


def test_bad_seed_and_architecture_are_rejected(tmp_path):
    with pytest.raises(ProbeModelError, match="seed"):
        ensure_probe_model(-1, cache_root=tmp_path)
    with pytest.raises(ProbeModelError, match="parts"):
        ensure_probe_model(1, cache_root=tmp_path, architecture={"unet": {}})


def test_unwritable_cache_says_what_to_do(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ProbeModelError) as err:
        ensure_probe_model(1, cache_root=blocker / "probe", architecture=TINY)
    assert err.value.action == Action.FREE_DISK and "writable" in err.value.hint


def test_default_dir_name_is_keyed_by_seed_and_format():
    assert probe_dir_name(1234) == "sd1-f3-s1234"
    assert probe_dir_name(1234, TINY).startswith("custom-")


def test_one_file_holds_each_part_with_the_bytes_of_a_file_of_its_own(tmp_path):
    """The parts are prefixed in one file (stable-diffusion.cpp's own diffusers prefixes), and a
    part's bytes do not depend on it: the probe in memory is the one the three-file layout gave."""
    pools = Pools(9, "F8_E5M2")
    write_parts(tmp_path / "one.safetensors", {PREFIXES[p]: TINY[p] for p in PARTS}, pools, {}, lambda n: None)
    _, one, _ = read_safetensors(tmp_path / "one.safetensors")
    for part in PARTS:
        write_part(tmp_path / f"{part}.safetensors", TINY[part], pools, {}, lambda n: None)
        _, alone, _ = read_safetensors(tmp_path / f"{part}.safetensors")
        assert {k: v.tobytes() for k, v in split_parts(one)[part].items()} == {k: v.tobytes() for k, v in alone.items()}
    with pytest.raises(ValueError, match="same prefixed name"):
        write_parts(tmp_path / "dup.safetensors", {"a.": {"b.c": (1,)}, "a.b.": {"c": (1,)}}, pools, {}, lambda n: None)


def test_probe_weights_names_only_a_complete_probe(tmp_path):
    model = ensure_probe_model(3, cache_root=tmp_path, architecture=TINY)
    assert probe_weights(model.path) == model.model == str(Path(model.path) / WEIGHTS)
    assert probe_weights(model.model) == model.model
    assert probe_weights(str(tmp_path)) is None
    (tmp_path / "x.safetensors").write_bytes(b"")
    assert probe_weights(str(tmp_path / "x.safetensors")) is None
    (Path(model.path) / MARKER).unlink()
    assert probe_weights(model.path) is None
    model.release()


def test_the_encoded_pools_are_kept_and_give_the_same_bytes(tmp_path, monkeypatch):
    """The pools file (26 MB for SD 1.x) skips encoding on the next synthesis; what it makes is
    byte for byte what encoding gives, and a damaged or foreign file is ignored and replaced."""
    import accelstack.engine.probes.model as pm

    monkeypatch.setattr(pm, "sd1_tensors", lambda: TINY)  # the default architecture's path, small
    first = ensure_probe_model(7, cache_root=tmp_path)
    pools_file = tmp_path / pools_file_name(7)
    made = pools_file.read_bytes()
    expected = (Path(first.path) / WEIGHTS).read_bytes()
    first.release()
    assert unpack_pools(made, 7, "F8_E5M2", scales_in_order(TINY)) is not None

    calls = []
    monkeypatch.setattr(Pools, "prefetch", lambda self, stds: calls.append(stds))  # encoding would show here
    again = ensure_probe_model(7, cache_root=tmp_path)
    assert (Path(again.path) / WEIGHTS).read_bytes() == expected and calls == []
    again.release()
    monkeypatch.undo()
    monkeypatch.setattr(pm, "sd1_tensors", lambda: TINY)

    damaged = bytearray(made)
    damaged[-1] ^= 0xFF
    nested = b"[" * 30000 + b"]" * 30000  # a header no JSON parser should recurse through
    hostile = made[:len(b"accelstack probe pools 1\n")] + struct.pack("<I", len(nested)) + nested
    for bad in (bytes(damaged), made[:-5], b"junk", pack_pools(Pools(8, "F8_E5M2"), scales_in_order(TINY)), hostile):
        pools_file.write_bytes(bad)
        redo = ensure_probe_model(7, cache_root=tmp_path)
        assert (Path(redo.path) / WEIGHTS).read_bytes() == expected
        assert pools_file.read_bytes() == made, "replaced by the right pools"
        redo.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == [pools_file.name]
    pools_file.unlink()
    os.mkfifo(pools_file)  # not a file: never opened for a blocking read, replaced by the real pools
    redo = ensure_probe_model(7, cache_root=tmp_path)
    assert (Path(redo.path) / WEIGHTS).read_bytes() == expected and pools_file.read_bytes() == made
    redo.release()


def test_a_custom_architecture_keeps_no_pools(tmp_path):
    ensure_probe_model(3, cache_root=tmp_path, architecture=TINY).release()
    assert list(tmp_path.iterdir()) == []


def test_on_synthesis_names_the_file_before_it_is_written(tmp_path):
    """verify starts its worker there: the path exists only once the file is whole."""
    seen = []
    made = ensure_probe_model(2, cache_root=tmp_path, architecture=TINY,
                              on_synthesis=lambda path: seen.append((path, os.path.exists(path))))
    assert seen == [(made.model, False)] and os.path.getsize(made.model) > 0
    ensure_probe_model(2, cache_root=tmp_path, architecture=TINY, on_synthesis=seen.append)  # reused: no call
    assert len(seen) == 1
    made.release()


def test_full_probe_model_headers(probe_model):
    """The real probe: every tensor of the reference present, f16, with the right byte ranges."""
    assert probe_model.parameters == 1_066_235_307
    arch = sd1_tensors()
    path = Path(probe_model.model)
    assert probe_weights(probe_model.path) == probe_weights(str(path)) == str(path)
    raw = path.open("rb").read(8)
    (n,) = struct.unpack("<Q", raw)
    with path.open("rb") as fh:
        fh.seek(8)
        header = json.loads(fh.read(n))
    header.pop("__metadata__")
    shapes = split_parts({k: tuple(v["shape"]) for k, v in header.items()})
    assert shapes == arch
    assert {v["dtype"] for v in header.values()} == {"F8_E5M2"}
    end = max(v["data_offsets"][1] for v in header.values())
    assert path.stat().st_size == 8 + n + end


def test_verify_generates_with_a_probe_it_synthesizes_and_leaves_nothing_on_disk(cpu_runtime, tmp_path):
    """The check is as strong as before (the full SD 1.x architecture, loaded by stable-diffusion.cpp,
    generating) while no probe stays on disk: not in the probe cache, not under any cache directory.
    What stays is the file of encoded value pools (27 MB, far under the 700 MB the issue allows)."""
    from cli_helpers import result_of, run_cli

    probe_cache = tmp_path / "probe"
    env = {"ACCELSTACK_PROBE_CACHE": str(probe_cache), "ACCELSTACK_CACHE": str(tmp_path / "cache"),
           "ACCELSTACK_HOME": str(tmp_path / "home"), "ACCELSTACK_CONFIG": str(tmp_path / "none.yaml")}
    rc, out, err = run_cli(["verify", "--runtime", str(cpu_runtime.path), "--json"], env=env)
    assert rc == 0, out + err
    report = result_of(out)
    assert report["verdict"] == "PASS" and report["probe_seconds"] > 0
    assert Path(report["probe_path"]).parent == probe_cache and Path(report["probe_path"]).name.startswith(".tmp-sd1-f3-")
    kept = list(probe_cache.iterdir())
    assert [p.name for p in kept] == [pools_file_name(1234)], "the probe is removed when verify ends"
    assert kept[0].stat().st_size < 30_000_000
    assert not [p for p in tmp_path.rglob("*.safetensors")], "no probe kept under any cache directory"
