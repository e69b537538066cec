"""Records of probe images (``accelstack.engine.probes.record``): what verify's ``deterministic``
check compares with instead of a second generation, and how a damaged or planted record is ignored.
The end-to-end use, on the real CPU runtime, is in test_engine_verify.py."""
from __future__ import annotations

import dataclasses
import json
import os

import pytest

from accelstack import fsio
from accelstack.engine.config import EngineOptions
from accelstack.engine.probes.record import (
    MAX_RECORD_BYTES,
    image_digest,
    recall,
    record_key,
    record_path,
    remember,
)
from accelstack.engine.worker.protocol import DeviceInfo, GenerateRequest

REQ = GenerateRequest(prompt="accelstack probe", width=64, height=64, steps=1, cfg_scale=7.0, sampler="euler",
                      scheduler="discrete", seed=42)
DEV = DeviceInfo(name="Vulkan0", description="NVIDIA GeForce RTX 4090", kind="gpu", memory_total=24 << 30,
                 memory_free=20 << 30)
PROBE = {"format": 3, "seed": 1234, "dtype": "F8_E5M2", "parameters": 1066235307}


def _key(**changes):
    args = dict(backend="vulkan", runtime_version="0.4.7 abc123", system_info="AVX2 = 1", device=DEV,
                options=EngineOptions(), env={"GGML_VK_VISIBLE_DEVICES": "0", "HOME": "/root"}, request=REQ, probe=PROBE)
    args.update(changes)
    return record_key(**args)


def test_a_record_round_trips_and_names_its_key(tmp_path):
    key, digest = _key(), image_digest(b"\x01\x02\x03" * 100)
    path = remember(tmp_path / "verify", key, digest)
    assert path == record_path(tmp_path / "verify", key) and path.is_file()
    found = recall(tmp_path / "verify", key)
    assert found is not None and found.digest == digest and found.key == key and found.when > 0
    assert json.loads(path.read_text())["sha256"] == digest
    assert [p.name for p in (tmp_path / "verify").iterdir()] == [path.name]  # no temporary file left


def test_the_key_changes_with_everything_the_image_depends_on():
    base = _key()
    changed = [
        _key(backend="cuda"), _key(runtime_version="0.4.8 def456"), _key(system_info="AVX2 = 0"),
        _key(device=dataclasses.replace(DEV, description="AMD Radeon RX 7900 XTX")), _key(device=None),
        _key(options=EngineOptions(threads=3)), _key(options=EngineOptions(flash_attention=False)),
        _key(env={"GGML_VK_VISIBLE_DEVICES": "1"}), _key(request=dataclasses.replace(REQ, seed=43)),
        _key(request=dataclasses.replace(REQ, cfg_scale=1.0)), _key(probe={**PROBE, "seed": 1}),
        _key(probe={**PROBE, "format": 4}),
    ]
    assert base not in changed and len(set(changed)) == len(changed)
    # what does not change the image does not change the key: free memory, unrelated variables
    assert _key(device=dataclasses.replace(DEV, memory_free=1)) == base
    assert _key(env={"GGML_VK_VISIBLE_DEVICES": "0", "HOME": "/elsewhere", "TERM": "xterm"}) == base


@pytest.mark.parametrize("content", [
    b"", b"not json", b"[1, 2]", b"{}", b'{"format": 1}',
    b"[" * 5000 + b"]" * 5000,  # deeper than accelstack's documents nest
    b'{"format": 99, "key": "K", "sha256": "' + b"a" * 64 + b'", "when": 1}',  # another format
    b'{"format": 1, "key": "other", "sha256": "' + b"a" * 64 + b'", "when": 1}',  # another key's record
    b'{"format": 1, "key": "K", "sha256": "' + b"A" * 64 + b'", "when": 1}',  # not a lower-case digest
    b'{"format": 1, "key": "K", "sha256": "abc", "when": 1}',
    b'{"format": 1, "key": "K", "sha256": "' + b"a" * 64 + b'", "when": true}',
    b'{"format": 1, "key": "K", "sha256": "' + b"a" * 64 + b'", "when": 1e300}',  # no date to show
    b'{"format": 1, "key": "K", "sha256": "' + b"a" * 64 + b'", "when": -1}',
    b'{"format": 1, "key": "K", "sha256": "' + b"a" * 64 + b'", "when": NaN}',
    b'{"format": 1, "key": "K", "sha256": "' + b"a" * 64 + b'", "when": 1, "pad": "' + b"x" * MAX_RECORD_BYTES + b'"}',
])
def test_a_damaged_or_foreign_record_is_ignored(tmp_path, content):
    key = _key()
    path = record_path(tmp_path, key)
    path.write_bytes(content.replace(b'"K"', json.dumps(key).encode()))
    assert recall(tmp_path, key) is None


def test_a_link_or_a_fifo_is_not_read(tmp_path):
    key = _key()
    real = tmp_path / "elsewhere.json"
    remember(tmp_path / "a", key, "b" * 64)
    record_path(tmp_path / "a", key).rename(real)
    (tmp_path / "b").mkdir()
    record_path(tmp_path / "b", key).symlink_to(real)
    assert recall(tmp_path / "b", key) is None  # a record is never followed out of its folder
    (tmp_path / "c").mkdir()
    os.mkfifo(record_path(tmp_path / "c", key))
    assert recall(tmp_path / "c", key) is None  # returns at once: no writer is waited for


def test_remember_replaces_a_record_and_never_writes_through_a_link(tmp_path):
    key = _key()
    remember(tmp_path, key, "a" * 64)
    remember(tmp_path, key, "b" * 64)
    found = recall(tmp_path, key)
    assert found is not None and found.digest == "b" * 64
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    path = record_path(tmp_path, key)
    path.unlink()
    path.symlink_to(victim)
    assert remember(tmp_path, key, "c" * 64) == path
    assert victim.read_text() == "mine" and not path.is_symlink()  # the link was replaced, not written through


def test_keep_file_never_removes_what_it_did_not_create(tmp_path):
    # Something already has a temporary file's name (a link planted at the name an earlier writer used,
    # a file left by a process with the same pid): records and pools are written through
    # fsio.try_write_bytes, whose temporary file is a new one with a random name (O_EXCL), so nothing is
    # written through the link, and it is left in place.
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    target = tmp_path / "verify" / "image-x.json"
    target.parent.mkdir()
    squatter = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    squatter.symlink_to(victim)
    assert fsio.try_write_bytes(target, b"data") is True and target.read_bytes() == b"data"
    assert squatter.is_symlink() and victim.read_text() == "mine"
    squatter.unlink()
    assert fsio.try_write_bytes(target, b"data") is True and target.read_bytes() == b"data"
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]


def test_a_cache_that_cannot_be_written_is_not_an_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert remember(blocker / "verify", _key(), "a" * 64) is None
