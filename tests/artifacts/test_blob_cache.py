"""The verified-blob record: a cached blob is re-hashed only when its size, mtime or inode
changed since its last check; ``deep=True`` (repair, verify --deep) re-hashes every one."""
from __future__ import annotations

import json
import os
import stat

import pytest

import accelstack.artifacts.cache as cache_module
from accelstack.artifacts import fetch_one

from artifact_helpers import payload, ref_for


@pytest.fixture
def hashes(monkeypatch):
    """The paths the cache hashes, in order."""
    seen = []
    real = cache_module.hash_file

    def spy(path, limit=None):
        seen.append(str(path))
        return real(path, limit)

    monkeypatch.setattr(cache_module, "hash_file", spy)
    return seen


def _tamper(path, data: bytes, *, keep_mtime: bool) -> None:
    """Rewrite the blob in place (same inode, same size), optionally putting its mtime back."""
    before = os.stat(path)
    os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
    with open(path, "r+b") as fh:
        fh.write(data)
    os.chmod(path, 0o444)
    if keep_mtime:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert after.st_ino == before.st_ino and after.st_size == before.st_size


def test_a_blob_is_hashed_once_more_after_download_then_trusted_by_its_record(server, cache, transport, retry, hashes):
    data = payload(200_000)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    blob = fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry)
    # placed without a flush: a record that names the blob (accelstack's, for gc and purge), not yet trusted
    assert json.loads(cache.stamp_path(ref.sha256).read_text()) == {"sha256": ref.sha256}
    assert fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry) == blob
    assert hashes == [str(blob)]  # the first reuse reads it from disk, then records it
    record = json.loads(cache.stamp_path(ref.sha256).read_text())
    st = blob.stat()
    assert record == {"sha256": ref.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino,
                      "device": st.st_dev}
    for _ in range(3):
        assert fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry) == blob
    assert len(hashes) == 1 and len(server.hits("/a.bin")) == 1
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # touched: checked again
    fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry)
    assert len(hashes) == 2


def test_a_flushed_download_is_recorded_at_once(server, cache, transport, retry, hashes):
    data = payload(100_000, seed=1)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry, fsync=True)
    assert cache.stamp_path(ref.sha256).exists()
    fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry)
    assert hashes == []


def test_a_rewritten_blob_with_a_new_mtime_is_caught_and_fetched_again(server, cache, transport, retry):
    data = payload(100_000, seed=2)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    blob = fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry, fsync=True)
    os.utime(blob, ns=(0, 1_000_000_000))  # an mtime the rewrite below certainly changes
    cache.valid(ref.sha256, ref.size)  # re-recorded with that mtime
    _tamper(blob, b"X" * 10, keep_mtime=False)
    assert fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry).read_bytes() == data
    assert len(server.hits("/a.bin")) == 2


def test_same_size_tamper_with_restored_mtime_needs_deep(server, cache, transport, retry, hashes):
    """The record catches accidents, not a deliberate edit that puts the mtime back: that is what
    deep mode (repair, verify --deep) is for."""
    data = payload(100_000, seed=3)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    blob = fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry, fsync=True)
    _tamper(blob, b"evil", keep_mtime=True)
    # normal mode trusts the matching record: no read, no download
    assert fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry).read_bytes()[:4] == b"evil"
    assert hashes == [] and len(server.hits("/a.bin")) == 1
    assert cache.valid(ref.sha256, ref.size) is True
    # deep mode hashes it, finds the damage, and fetches the file again
    assert cache.valid(ref.sha256, ref.size, deep=True) is False
    assert not cache.stamp_path(ref.sha256).exists()
    assert fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry, deep=True, fsync=True).read_bytes() == data
    assert len(server.hits("/a.bin")) == 2
    # offline, deep mode reports the damage instead of serving it
    _tamper(blob, b"evil", keep_mtime=True)
    from accelstack.artifacts import OfflineError

    with pytest.raises(OfflineError):
        fetch_one(ref, cache=cache, offline=True, deep=True)
    # and the record went with it: normal mode now hashes it too, and refuses it
    assert not cache.stamp_path(ref.sha256).exists()
    with pytest.raises(OfflineError):
        fetch_one(ref, cache=cache, offline=True)


@pytest.mark.parametrize("record", [
    "not json", "[" * 5000, json.dumps({"sha256": "0" * 64}), "x" * 5000, "fifo", "other inode",
])
def test_a_record_that_does_not_match_or_parse_means_hashing(server, cache, transport, retry, hashes, record):
    data = payload(50_000, seed=4)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    blob = fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry, fsync=True)
    path = cache.stamp_path(ref.sha256)
    path.unlink()
    if record == "fifo":
        if not hasattr(os, "mkfifo"):
            pytest.skip("no FIFOs here")
        os.mkfifo(path)  # must not block the reader
    elif record == "other inode":  # the blob was replaced by a copy (a restore from backup)
        cache.valid(ref.sha256, ref.size)
        copy = blob.with_name("copy")
        copy.write_bytes(blob.read_bytes())
        os.utime(copy, ns=(blob.stat().st_atime_ns, blob.stat().st_mtime_ns))
        os.chmod(blob, 0o644)
        os.replace(copy, blob)
        hashes.clear()
    else:
        path.write_text(record)
    assert cache.valid(ref.sha256, ref.size) is True
    assert hashes == [str(blob)]
    assert len(server.hits("/a.bin")) == 1
