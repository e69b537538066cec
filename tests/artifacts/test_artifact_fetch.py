"""fetch() against a real loopback HTTP server with injected faults.

Every failure test also checks that nothing partial is ever at the final blob path, and the
resume tests check from the server's byte counters that only the missing bytes were sent.
"""
from __future__ import annotations

import hashlib
import importlib
import os
import random
import stat

import pytest

from accelstack.artifacts import (
    ArtifactError,
    ArtifactRef,
    Cache,
    DiskSpaceError,
    FetchError,
    HashMismatchError,
    InsecureURLError,
    OfflineError,
    RetryPolicy,
    SizeMismatchError,
    fetch,
    fetch_one,
)
from accelstack.errors import Action
from accelstack.settings import Settings

from artifact_helpers import (
    content_length,
    drip,
    drop,
    extra,
    no_range,
    payload,
    rate,
    ref_for,
    status,
    wrong_bytes,
)

batch_module = importlib.import_module("accelstack.artifacts.batch")  # the module, not the function
partfile_module = importlib.import_module("accelstack.artifacts.partfile")

SIZE = 300_000


def _fetch(refs, cache, transport, retry, **kw):
    return fetch(refs, cache=cache, offline=False, transport=transport, retry=retry, **kw)


def assert_nothing_final(cache: Cache, ref) -> None:
    assert not cache.blob_path(ref.sha256).exists(), "a blob reached its final path without being verified"


# -- the plain path ------------------------------------------------------------------------------
def test_fetch_places_verified_read_only_blob(server, cache, transport, retry, events):
    data = payload(SIZE)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    paths = _fetch([ref], cache, transport, retry, progress=events)
    path = paths[ref.sha256]
    assert path == cache.root / "blobs" / "sha256" / ref.sha256
    assert path.read_bytes() == data
    assert not stat.S_IMODE(path.stat().st_mode) & 0o222, "blobs are read-only"
    assert not cache.part_path(ref.sha256).exists()
    assert [h.range_start for h in server.hits("/a.bin")] == [None]
    assert server.sent("/a.bin") == SIZE
    # events: batch start, file start at 0, advances ending at SIZE, file end ok, batch end ok
    start = events.of("a.bin", "start")[0]
    assert (start.done, start.total, start.extra["resumed"]) == (0, SIZE, 0)
    assert events.of("a.bin", "advance")[-1].done == SIZE
    assert events.of("a.bin", "end")[0].ok is True
    batch = events.of("")
    assert batch[0].kind == "start" and batch[0].total == SIZE
    assert batch[-1].kind == "end" and batch[-1].ok is True


def test_cached_blob_is_not_downloaded_again(server, cache, transport, retry):
    data = payload(SIZE)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    _fetch([ref], cache, transport, retry)
    _fetch([ref], cache, transport, retry)
    assert len(server.hits("/a.bin")) == 1


def test_corrupted_cached_blob_is_fetched_again(server, cache, transport, retry):
    data = payload(SIZE)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    path = fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry)
    os.chmod(path, 0o644)
    with open(path, "r+b") as fh:
        fh.write(b"\0\0\0\0")
    assert fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry).read_bytes() == data
    assert len(server.hits("/a.bin")) == 2


def test_default_cache_is_the_settings_cache(server, transport, retry, tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELSTACK_CACHE", str(tmp_path / "envcache"))
    data = payload(1000)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    path = fetch_one(ref, cache=Settings.resolve().cache, offline=False, transport=transport, retry=retry)
    assert path == tmp_path / "envcache" / "blobs" / "sha256" / ref.sha256


def test_empty_file(server, cache, transport, retry):
    ref = ref_for("empty", b"", server.serve("/empty", b""))
    assert fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry).read_bytes() == b""


def test_same_blob_twice_in_a_batch_downloads_once(server, cache, transport, retry):
    data = payload(SIZE)
    url = server.serve("/a.bin", data)
    a = ref_for("a.bin", data, url)
    b = ref_for("copy-of-a.bin", data, url)
    paths = _fetch([a, b], cache, transport, retry)
    assert list(paths) == [a.sha256]
    assert len(server.hits("/a.bin")) == 1


def test_several_files_concurrently(server, cache, transport, retry, events):
    refs = []
    for i in range(6):
        data = payload(50_000 + i, seed=i)
        refs.append(ref_for(f"f{i}", data, server.serve(f"/f{i}", data)))
    paths = _fetch(refs, cache, transport, retry, max_workers=3, progress=events)
    for ref in refs:
        assert paths[ref.sha256].read_bytes() == payload(ref.size, seed=int(ref.name[1:]))
        assert events.of(ref.name, "end")[0].ok
    assert events.of("")[0].total == sum(r.size for r in refs)


# -- faults --------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_drops_at_random_offsets_resume_with_only_missing_bytes(server, cache, transport, retry, seed):
    data = payload(SIZE, seed=seed)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    offsets = sorted(random.Random(seed).sample(range(1, SIZE), 3))
    server.fault("/a.bin", *(drop(at) for at in offsets))
    path = fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry)
    assert path.read_bytes() == data
    hits = server.hits("/a.bin")
    assert [h.range_start for h in hits] == [None] + offsets
    assert server.sent("/a.bin") == SIZE, "resume must fetch only the missing bytes"


def test_500_then_success_retries_with_backoff(server, cache, transport, retry, events, caplog):
    data = payload(SIZE)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    server.fault("/a.bin", status(500), status(503))
    with caplog.at_level("INFO", logger="accelstack.artifacts"):
        assert fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry, progress=events).read_bytes() == data
    assert [h.status for h in server.hits("/a.bin")] == [500, 503, 200]
    assert any("retrying" in e.message for e in events.of("a.bin", "message"))
    retries = [r for r in caplog.records if r.name == "accelstack.artifacts.download" and "retry" in r.getMessage()]
    assert len(retries) == 2 and "HTTP 500" in retries[0].getMessage()


def test_persistent_500_gives_up_after_retries(server, cache, transport, retry):
    data = payload(SIZE)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    server.fault("/a.bin", status(500), always=True)
    with pytest.raises(FetchError, match="HTTP 500"):
        fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry)
    assert len(server.hits("/a.bin")) == retry.retries + 1
    assert_nothing_final(cache, ref)


@pytest.mark.parametrize("code", [404, 403])
def test_404_and_403_are_not_retried_and_next_mirror_is_used(server, cache, transport, retry, code, caplog):
    data = payload(SIZE)
    good = server.serve("/good.bin", data)
    server.serve("/bad.bin", data)
    server.fault("/bad.bin", status(code), always=True)
    ref = ref_for("a.bin", data, server.url("/bad.bin"), good)
    with caplog.at_level("WARNING", logger="accelstack.artifacts"):
        assert fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry).read_bytes() == data
    assert any("next mirror" in r.getMessage() and str(code) in r.getMessage() for r in caplog.records)
    assert len(server.hits("/bad.bin")) == 1, "no retry on 404/403"
    assert len(server.hits("/good.bin")) == 1


def test_404_on_the_only_mirror_is_a_clear_error(server, cache, transport, retry):
    data = payload(SIZE)
    ref = ref_for("a.bin", data, server.url("/missing.bin"))
    with pytest.raises(FetchError, match="404") as info:
        fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry)
    assert info.value.status == 404
    assert len(server.hits("/missing.bin")) == 1
    assert_nothing_final(cache, ref)


def test_wrong_bytes_fail_with_both_hashes_and_delete_the_part(server, cache, transport, retry):
    data = payload(SIZE)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    server.fault("/a.bin", wrong_bytes(), always=True)
    with pytest.raises(HashMismatchError) as info:
        fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry)
    bad = hashlib.sha256(bytes([data[0] ^ 0xFF]) + data[1:]).hexdigest()
    assert ref.sha256 in str(info.value) and bad in str(info.value)
    assert (info.value.expected, info.value.actual) == (ref.sha256, bad)
    assert not cache.part_path(ref.sha256).exists()
    assert_nothing_final(cache, ref)
    assert len(server.hits("/a.bin")) == 1, "a mismatch is not retried on the same mirror"


def test_wrong_bytes_then_good_mirror(server, cache, transport, retry):
    data = payload(SIZE)
    server.serve("/evil.bin", data)
    server.fault("/evil.bin", wrong_bytes(), always=True)
    ref = ref_for("a.bin", data, server.url("/evil.bin"), server.serve("/good.bin", data))
    assert fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry).read_bytes() == data


def test_all_mirrors_wrong_names_both_hashes(server, cache, transport, retry):
    data = payload(SIZE)
    for p in ("/m1", "/m2"):
        server.serve(p, data)
        server.fault(p, wrong_bytes(), always=True)
    ref = ref_for("a.bin", data, server.url("/m1"), server.url("/m2"))
    with pytest.raises(HashMismatchError) as info:
        fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry)
    assert ref.sha256 in info.value.message and info.value.actual in info.value.message
    assert_nothing_final(cache, ref)


def test_content_length_larger_than_declared_is_refused_before_writing(server, cache, transport, retry):
    data = payload(SIZE)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    server.fault("/a.bin", content_length(SIZE + 10), always=True)
    with pytest.raises(SizeMismatchError, match=f"{SIZE + 10}"):
        fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry)
    assert cache.part_size(ref.sha256) == 0
    assert_nothing_final(cache, ref)


def test_content_length_shorter_than_body_then_resume(server, cache, transport, retry):
    # The server announces (and so effectively sends) fewer bytes than the file has: a mirror
    # serving another file. With a second, good mirror the download completes from it.
    data = payload(SIZE)
    server.serve("/short.bin", data)
    server.fault("/short.bin", content_length(SIZE // 2), always=True)
    ref = ref_for("a.bin", data, server.url("/short.bin"), server.serve("/good.bin", data))
    assert fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry).read_bytes() == data
    assert len(server.hits("/short.bin")) == 1


def test_truncated_body_with_correct_length_is_resumed(server, cache, transport, retry):
    data = payload(SIZE)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    server.fault("/a.bin", drop(SIZE - 1))
    assert fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry).read_bytes() == data
    assert server.sent("/a.bin") == SIZE


def test_more_bytes_than_declared_are_never_written(server, cache, transport, retry, monkeypatch):
    data = payload(SIZE)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    server.fault("/a.bin", extra(5000), always=True)  # no Content-Length, too many bytes
    biggest = []
    real_write = partfile_module.PartFile.write

    def spy(self, chunk, *args, **kwargs):
        real_write(self, chunk, *args, **kwargs)
        biggest.append(self.offset)

    monkeypatch.setattr(partfile_module.PartFile, "write", spy)
    with pytest.raises(SizeMismatchError, match="more than the declared"):
        fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry)
    assert max(biggest, default=0) <= SIZE
    assert not cache.part_path(ref.sha256).exists() or cache.part_size(ref.sha256) == 0
    assert_nothing_final(cache, ref)


def test_server_without_range_support_restarts_cleanly(server, cache, transport, retry, events):
    data = payload(SIZE)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    server.fault("/a.bin", drop(SIZE // 3), no_range())
    assert fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry, progress=events).read_bytes() == data
    hits = server.hits("/a.bin")
    assert [h.range_start for h in hits] == [None, SIZE // 3]
    assert [h.status for h in hits] == [200, 200]
    assert server.sent("/a.bin") == SIZE // 3 + SIZE
    # the progress went back to zero when the server restarted from scratch
    assert 0 in [e.done for e in events.of("a.bin", "advance")]


def test_slow_drip_trips_the_read_timeout_and_resumes(server, cache, transport, retry):
    data = payload(SIZE)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    server.fault("/a.bin", drip(at=100_000, stall=6.0))  # > the 2 s read timeout
    assert fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry).read_bytes() == data
    hits = server.hits("/a.bin")
    assert [h.range_start for h in hits] == [None, 100_000]
    assert server.sent("/a.bin") == SIZE


def test_redirect_is_followed(server, cache, transport, retry):
    data = payload(SIZE)
    server.serve("/real.bin", data)
    ref = ref_for("a.bin", data, server.redirect("/moved.bin", "/real.bin"))
    assert fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry).read_bytes() == data


def test_redirect_loop_is_a_clear_error_without_retries(server, cache, transport, retry):
    data = payload(SIZE)
    server.redirect("/loop1", "/loop2")
    server.redirect("/loop2", "/loop1")
    ref = ref_for("a.bin", data, server.url("/loop1"))
    with pytest.raises(FetchError, match="redirect loop"):
        fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry)
    assert len(server.hits("/loop1")) == 1 and len(server.hits("/loop2")) == 1
    assert_nothing_final(cache, ref)


def test_redirect_to_plain_http_elsewhere_is_refused(server, cache, transport, retry):
    data = payload(SIZE)
    ref = ref_for("a.bin", data, server.redirect("/x", "http://example.com/a.bin"))
    with pytest.raises(InsecureURLError):
        fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry)


def test_connection_refused_is_retried_then_next_mirror(server, cache, transport, retry):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{s.getsockname()[1]}/a.bin"
    s.close()
    data = payload(SIZE)
    ref = ref_for("a.bin", data, dead, server.serve("/a.bin", data))
    assert fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry).read_bytes() == data


# -- resume across runs ------------------------------------------------------------------------
def test_resume_across_runs_fetches_only_the_missing_bytes(server, cache, transport, events):
    data = payload(SIZE)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    # the connection drops, and the retry finds the server down: this run gives up
    server.fault("/a.bin", drop(120_000), status(503))
    with pytest.raises(FetchError, match="HTTP 503"):
        fetch_one(ref, cache=cache, offline=False, transport=transport, retry=RetryPolicy(retries=0, backoff_base=0.001))
    assert cache.part_size(ref.sha256) == 120_000
    assert_nothing_final(cache, ref)
    # next run
    assert fetch_one(ref, cache=cache, offline=False, transport=transport, progress=events).read_bytes() == data
    hits = server.hits("/a.bin")
    assert hits[-1].range_start == 120_000 and hits[-1].sent == SIZE - 120_000
    assert server.sent("/a.bin") == SIZE
    start = events.of("a.bin", "start")[0]
    assert start.done == 120_000 and start.extra["resumed"] == 120_000


def test_corrupt_partial_from_an_earlier_run_is_restarted(server, cache, transport, retry):
    data = payload(SIZE)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    cache.ensure()
    cache.part_path(ref.sha256).write_bytes(b"garbage" * 1000)  # not a prefix of the file
    assert fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry).read_bytes() == data
    assert [h.range_start for h in server.hits("/a.bin")] == [7000, None]


def test_complete_partial_is_placed_without_network(server, cache, transport, retry):
    data = payload(SIZE)
    ref = ref_for("a.bin", data, server.url("/nowhere"))
    cache.ensure()
    cache.part_path(ref.sha256).write_bytes(data)
    assert fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry).read_bytes() == data
    assert server.hits("/nowhere") == []


def test_resume_from_one_mirror_and_finish_on_another(server, cache, transport, retry):
    data = payload(SIZE)
    server.serve("/m1", data)
    server.fault("/m1", drop(100_000))
    server.fault("/m1", status(404), status(404), status(404), status(404))
    ref = ref_for("a.bin", data, server.url("/m1"), server.serve("/m2", data))
    assert fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry).read_bytes() == data
    assert server.hits("/m2")[0].range_start == 100_000
    assert server.sent("/m1") + server.sent("/m2") == SIZE


# -- policy ------------------------------------------------------------------------------------
def test_only_https_loopback_http_and_file_urls(cache, transport, retry, tmp_path):
    data = b"x" * 10
    for url in ("http://example.com/a", "ftp://example.com/a", "http://10.0.0.1/a", "gopher://x", "a/relative"):
        with pytest.raises(InsecureURLError):
            fetch_one(ref_for("a", data, url), cache=cache, offline=False, transport=transport, retry=retry)
    from accelstack.artifacts import check_url

    for url in ("https://example.com/a", "http://127.0.0.1:8/a", "http://localhost/a", "http://[::1]/a",
                "file:///tmp/a"):
        check_url(url)


def test_insecure_mirror_is_refused_before_any_download(server, cache, transport, retry):
    data = payload(SIZE)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data), "http://example.com/a.bin")
    with pytest.raises(InsecureURLError):
        fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry)
    assert server.hits("/a.bin") == []


def test_file_url_and_its_resume(cache, transport, retry, tmp_path):
    data = payload(SIZE)
    src = tmp_path / "mirror" / "a.bin"
    src.parent.mkdir()
    src.write_bytes(data)
    ref = ref_for("a.bin", data, src.as_uri())
    cache.ensure()
    cache.part_path(ref.sha256).write_bytes(data[:1234])
    assert fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry).read_bytes() == data


def test_offline_serves_from_cache_or_fails_clearly(server, cache, transport, retry, monkeypatch):
    data = payload(SIZE)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    with pytest.raises(OfflineError, match="a.bin"):
        fetch_one(ref, cache=cache, transport=transport, retry=retry, offline=True)
    assert server.hits("/a.bin") == []
    fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry)
    monkeypatch.setenv("ACCELSTACK_OFFLINE", "1")
    offline = Settings.resolve().offline
    assert fetch_one(ref, cache=cache, offline=offline, transport=transport, retry=retry).read_bytes() == data
    other = ref_for("b.bin", b"other", server.serve("/b.bin", b"other"))
    with pytest.raises(OfflineError, match="b.bin") as info:
        fetch_one(other, cache=cache, offline=offline, transport=transport, retry=retry)
    assert info.value.action is Action.GO_ONLINE and "offline mode" in info.value.hint
    assert "ACCELSTACK" not in info.value.hint and "--" not in info.value.hint
    assert len(server.hits("/a.bin")) == 1 and server.hits("/b.bin") == []


def test_disk_space_is_checked_for_the_whole_batch_first(server, cache, transport, retry, monkeypatch):
    import psutil

    refs = [ref_for(f"f{i}", payload(100_000, seed=i), server.serve(f"/f{i}", payload(100_000, seed=i)))
            for i in range(3)]
    real = psutil.disk_usage

    def tiny(path):
        usage = real(path)
        return usage._replace(free=250_000)

    monkeypatch.setattr(psutil, "disk_usage", tiny)
    monkeypatch.setattr(batch_module, "DISK_HEADROOM", 0)
    with pytest.raises(DiskSpaceError, match="300000 bytes") as info:
        _fetch(refs, cache, transport, retry)
    assert info.value.action is Action.FREE_DISK and "free at least" in info.value.hint
    assert "ACCELSTACK" not in info.value.hint
    assert all(server.hits(f"/f{i}") == [] for i in range(3))


def test_bad_refs_are_refused(cache, transport, retry):
    with pytest.raises(ArtifactError, match="sha256"):
        fetch_one(ArtifactRef("a", "ABC", 1, ["https://example.com/a"]), cache=cache, offline=False, transport=transport,
                  retry=retry)
    with pytest.raises(FetchError, match="no URL"):
        fetch_one(ref_for("a", b"x"), cache=cache, offline=False, transport=transport, retry=retry)


def test_several_failures_are_reported_together(server, cache, transport, retry):
    good = payload(1000)
    refs = [
        ref_for("good", good, server.serve("/good", good)),
        ref_for("gone1", b"1", server.url("/gone1")),
        ref_for("gone2", b"2", server.url("/gone2")),
    ]
    with pytest.raises(FetchError, match="2 files could not be fetched.*gone1.*gone2"):
        _fetch(refs, cache, transport, retry, max_workers=3)
    assert cache.blob_path(refs[0].sha256).exists(), "the good file is kept for next time"


# -- the hash-behind thread (used for big files) ----------------------------------------------------
@pytest.fixture
def hash_behind(monkeypatch):
    monkeypatch.setattr(partfile_module, "HASH_BEHIND_MIN", 0)


def test_hash_behind_with_drops_restart_and_mismatch(server, cache, transport, retry, hash_behind):
    data = payload(SIZE)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    server.fault("/a.bin", drop(50_000), drop(150_000), no_range())
    assert fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry).read_bytes() == data
    assert [h.range_start for h in server.hits("/a.bin")] == [None, 50_000, 150_000]
    other = payload(SIZE, seed=9)
    bad = ref_for("b.bin", other, server.serve("/b.bin", other))
    server.fault("/b.bin", wrong_bytes(), always=True)
    with pytest.raises(HashMismatchError):
        fetch_one(bad, cache=cache, offline=False, transport=transport, retry=retry)
    assert_nothing_final(cache, bad)
    # a resumed part is hashed first, then the hash-behind thread continues from that state
    third = payload(SIZE, seed=10)
    ref3 = ref_for("c.bin", third, server.serve("/c.bin", third))
    cache.part_path(ref3.sha256).write_bytes(third[:77_777])
    assert fetch_one(ref3, cache=cache, offline=False, transport=transport, retry=retry).read_bytes() == third
    assert server.sent("/c.bin") == SIZE - 77_777
    import threading

    assert not [t for t in threading.enumerate() if t.name == "accelstack-sha256"], "hash threads are joined"


def test_ctrl_c_stops_workers_quickly_and_keeps_parts_for_resume(server, cache, retry):
    import signal
    import threading
    import time

    from accelstack.artifacts import Transport

    from artifact_helpers import gate

    release = threading.Event()
    refs = []
    for i in range(2):
        data = payload(SIZE, seed=20 + i)
        refs.append(ref_for(f"f{i}", data, server.serve(f"/f{i}", data)))
        server.fault(f"/f{i}", gate(100_000, release))

    def interrupt_when_both_are_stuck():
        while not release.is_set():  # however slow the machine, both downloads reach the gate
            if all(server.hits(f"/f{i}") and server.hits(f"/f{i}")[0].sent >= 100_000 for i in range(2)):
                time.sleep(0.5)  # both stuck at the gate, their bytes on the way to the .part files
                # a real SIGINT, as Ctrl-C sends: it wakes a main thread blocked in a wait, which
                # _thread.interrupt_main (a flag checked between bytecodes) does not
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.01)

    watchdog = threading.Timer(300, release.set)  # a broken abort fails this test instead of hanging it
    threading.Thread(target=interrupt_when_both_are_stuck, daemon=True).start()
    watchdog.start()
    # no read timeout, no minimum rate: while the server holds the gate, only the abort can wake the workers
    slow = Transport(read_timeout=3600, min_rate=0)
    try:
        with pytest.raises(KeyboardInterrupt):
            fetch(refs, cache=cache, offline=False, transport=slow, retry=retry, max_workers=2)
        assert not release.is_set(), "the workers waited for the server instead of stopping at Ctrl-C"
    finally:
        watchdog.cancel()
        release.set()
    # the parts keep what had arrived (all 100,000 bytes on a quiet machine; on a loaded one the client may
    # still have been reading the last of them), and the next run resumes from there
    kept = {ref.sha256: cache.part_size(ref.sha256) for ref in refs}
    for ref in refs:
        assert_nothing_final(cache, ref)
        assert kept[ref.sha256] <= 100_000, kept
    assert any(kept.values()), f"partial files are kept for the next run: {kept}"
    paths = fetch(refs, cache=cache, offline=False, transport=slow, retry=retry)
    for i, ref in enumerate(refs):
        assert paths[ref.sha256].read_bytes() == payload(SIZE, seed=20 + i)
        assert server.hits(f"/f{i}")[-1].range_start == (kept[ref.sha256] or None), (kept, server.hits(f"/f{i}"))


# -- hash formats (issue 10) ---------------------------------------------------------------------
@pytest.mark.parametrize("shape", [
    lambda h: h + "\n",  # "$" accepted a trailing newline: the download then failed "expected X, got X"
    lambda h: " " + h,
    lambda h: h + " ",
    lambda h: h.upper(),
    lambda h: h[:63] + "\u0661",
])
def test_a_sha256_not_exactly_64_lowercase_hex_is_refused_before_any_file_is_made(server, cache, transport, retry, shape):
    data = payload(1000)
    good = ref_for("a.bin", data, server.serve("/a.bin", data))
    ref = ArtifactRef(good.name, shape(good.sha256), good.size, good.urls)
    with pytest.raises(ArtifactError, match="64 lowercase hex"):
        fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry)
    assert server.hits("/a.bin") == []
    left = sorted(p.name for p in cache.root.rglob("*") if p.is_file()) if cache.root.exists() else []
    assert left == [], f"stray files in the cache: {left}"


def test_a_hash_mismatch_leaves_only_the_blobs_own_lock_file(server, cache, transport, retry):
    data = payload(1000)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    server.fault("/a.bin", wrong_bytes(), always=True)
    with pytest.raises(HashMismatchError):
        fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry)
    # The per-blob lock file is by design (see artifacts.cache); nothing else stays, nothing misnamed.
    assert sorted(p.name for p in cache.blob_dir.iterdir()) == [ref.sha256 + ".lock"]


def test_local_documents_are_capped_and_must_be_regular_files(tmp_path):
    from accelstack.artifacts.documents import MAX_DOCUMENT, fetch_document

    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_DOCUMENT + 1))
    with pytest.raises(FetchError, match="larger than"):
        fetch_document(str(big))
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / "manifest.json"
        os.mkfifo(fifo)  # reading it would wait forever for a writer
        with pytest.raises(FetchError, match="not a regular file"):
            fetch_document(str(fifo))
    with pytest.raises(FetchError, match="not a regular file|Is a directory"):
        fetch_document(str(tmp_path))


def test_a_throttled_link_streams_with_rate_limited_progress(server, cache, transport, retry):
    """Over a slow link the file arrives in many small reads; progress is still at most one
    ``advance`` per PROGRESS_INTERVAL (plus the final one), and the bytes are exact."""
    import time

    from accelstack.artifacts.download import PROGRESS_INTERVAL

    data = payload(SIZE)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    server.fault("/a.bin", rate(600_000))  # ~0.5 s for the file
    stamps = []

    def progress(event):
        if event.task == "a.bin" and event.kind == "advance":
            stamps.append((time.monotonic(), event.done))

    assert fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry, progress=progress).read_bytes() == data
    assert stamps[-1][1] == SIZE and [d for _t, d in stamps] == sorted(d for _t, d in stamps)
    gaps = [b[0] - a[0] for a, b in zip(stamps[:-2], stamps[1:-1])]
    assert all(g >= PROGRESS_INTERVAL * 0.99 for g in gaps), gaps
    assert len(stamps) >= 2 and server.sent("/a.bin") == SIZE
