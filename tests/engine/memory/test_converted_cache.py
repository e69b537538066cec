"""The converted-weights cache (issue 45): a model converted on load is written once and reused; an entry
replaced by a link, a FIFO or a truncated file is never trusted, and made again; only what carries the
cache's mark is ever removed (a person's file with an entry's name stays, issue 47); a conversion that
fails (a full disk) leaves nothing behind; the folder is bounded; `cache purge` removes only what it made."""
from __future__ import annotations

import os
from pathlib import Path

import model_specs as m

from accelstack.engine.memory.converted import ConvertedCache


def _source(tmp_path: Path) -> Path:
    return m.write_safetensors(tmp_path / "model.safetensors", {"a.weight": ((64, 64), "F16")})


def _converter(calls: list):
    def convert(out: Path) -> bool:
        calls.append(out)
        m.write_gguf(out, {"a.weight": ((64, 64), "Q8_0")})
        return True
    return convert


def test_converted_once_then_reused(tmp_path):
    src, calls = _source(tmp_path), []
    cache = ConvertedCache(str(tmp_path / "converted"))
    assert cache.lookup(src, "q8_0") is None
    made = cache.store(src, "q8_0", _converter(calls))
    assert made is not None and cache.lookup(src, "q8_0") == made and len(calls) == 1
    assert cache.lookup(src, "q4_k") is None  # another type, another entry
    [entry] = cache.entries()
    assert entry.weight_type == "q8_0" and entry.source == os.path.realpath(src) and entry.bytes == made.stat().st_size
    src.write_bytes(src.read_bytes())  # the source changed (a new mtime): not the converted file of this one
    os.utime(src, ns=(1, 1))
    assert cache.lookup(src, "q8_0") is None


def _big_source(tmp_path: Path) -> Path:
    return m.write_safetensors(tmp_path / "big.safetensors", {"a.weight": ((256, 256), "F16")})


def _big_converter(out: Path) -> bool:
    m.write_gguf(out, {"a.weight": ((256, 256), "Q8_0")})  # ~70 KB: more than the head its record hashes
    return True


def test_an_entry_that_was_tampered_with_is_not_trusted(tmp_path):
    """A damaged entry is never trusted and is made again; what still carries the cache's mark (its record, a
    file whose head is the recorded one) is removed, anything else (a link, a FIFO, a file cut inside its head,
    not told from a person's) stays where it is, and the new entry is made beside it."""
    src = _big_source(tmp_path)
    outside = tmp_path / "precious.gguf"
    outside.write_bytes(b"user data")
    for damage in ("link", "fifo", "truncated", "truncated into its head", "no record", "record lies"):
        cache = ConvertedCache(str(tmp_path / damage))
        made = cache.store(src, "q8_0", _big_converter)
        assert made is not None and cache.lookup(src, "q8_0") == made
        record = made.with_suffix(".json")
        if damage == "link":
            made.unlink()
            made.symlink_to(outside)
        elif damage == "fifo":
            made.unlink()
            os.mkfifo(made)
        elif damage.startswith("truncated"):
            with open(made, "r+b") as fh:
                fh.truncate(made.stat().st_size // 2 if damage == "truncated" else 100)
        elif damage == "no record":
            record.unlink()
        else:
            record.write_text(record.read_text().replace('"q8_0"', '"q4_k"'))
        assert cache.lookup(src, "q8_0") is None, damage  # never trusted
        ours = damage in ("truncated", "record lies")
        assert os.path.lexists(made) is not ours, damage  # removed only when it carries the mark
        if damage in ("link", "fifo", "truncated into its head", "no record"):
            assert not os.path.lexists(record), damage  # the record is the cache's own: it goes
        assert outside.read_bytes() == b"user data"  # a link is never followed
        again = cache.store(src, "q8_0", _big_converter)
        assert again is not None and cache.lookup(src, "q8_0") == again, damage  # made again
        assert (again == made) is ours, damage  # in its place, or beside what stays


def test_a_persons_file_with_an_entrys_name_is_never_deleted(tmp_path):
    """``<key>.gguf`` and ``<key>.json`` that the cache did not write (a person's files in a folder the cache
    was pointed at) are never removed nor overwritten, by lookup, store, the bound or ``cache purge``."""
    from accelstack.core.caches import purge
    from accelstack.settings import Settings

    settings = Settings.resolve(cache=tmp_path / "cache", home=tmp_path / "home", env={})
    root = settings.cache / "converted"
    root.mkdir(parents=True)
    src = _source(tmp_path)
    cache = ConvertedCache(str(root))
    key = cache.key(src, "q8_0")
    theirs = {root / f"{key}.gguf": b"GGUF a person's model", root / f"{key}.json": b'{"notes": "mine"}'}
    for path, data in theirs.items():
        path.write_bytes(data)
    assert cache.lookup(src, "q8_0") is None
    made = cache.store(src, "q8_0", _converter([]))
    assert made is not None and made.name not in {p.name for p in theirs} and cache.lookup(src, "q8_0") == made
    cache.max_bytes = 0
    cache.bound()
    purge(["converted"], settings)
    assert all(path.read_bytes() == data for path, data in theirs.items())
    assert sorted(p.name for p in root.iterdir()) == sorted(p.name for p in theirs)


def test_a_failed_conversion_leaves_nothing(tmp_path):
    src = _source(tmp_path)
    cache = ConvertedCache(str(tmp_path / "converted"))

    def full_disk(out: Path) -> bool:
        out.write_bytes(b"GGUF half")
        return False  # stable-diffusion.cpp's convert returned false (no space left)

    assert cache.store(src, "q8_0", full_disk) is None
    assert list((tmp_path / "converted").iterdir()) == [] and cache.lookup(src, "q8_0") is None


def test_the_folder_is_bounded(tmp_path):
    root = tmp_path / "converted"
    first, second = _source(tmp_path), m.write_safetensors(tmp_path / "other.safetensors", {"b.weight": ((64, 64), "F16")})
    cache = ConvertedCache(str(root))
    a = cache.store(first, "q8_0", _converter([]))
    assert a is not None
    cache.max_bytes = a.stat().st_size  # room for one entry
    b = cache.store(second, "q8_0", _converter([]))
    assert b is not None and cache.lookup(second, "q8_0") == b and cache.lookup(first, "q8_0") is None
    assert not hasattr(cache, "purge")  # `accelstack cache purge converted` purges, by the marks (core.caches)


def test_a_second_generate_loads_the_converted_model_from_the_cache(tmp_path, cpu_runtime, probe_model):
    """The real CPU build: the first generate with --weight-type q8_0 converts the probe once, into the cache
    (stable-diffusion.cpp's own convert); the second loads that file: the entry is not written again."""
    from accelstack.engine import generation
    from accelstack.engine.config import EngineOptions
    from accelstack.engine.worker.protocol import GenerateRequest

    root = tmp_path / "converted"
    options = EngineOptions(weight_type="q8_0", converted_dir=str(root)).concrete()
    req = GenerateRequest(prompt="a red cube", width=64, height=64, steps=1, seed=7)
    first = generation.generate(cpu_runtime, probe_model.path, req, tmp_path / "a.png", options=options)
    [entry] = ConvertedCache(str(root)).entries()
    assert entry.weight_type == "q8_0" and entry.source.endswith("probe.safetensors") and entry.bytes > 2 ** 20
    made = os.stat(entry.path)
    second = generation.generate(cpu_runtime, probe_model.path, req, tmp_path / "b.png", options=options)
    again = os.stat(entry.path)
    assert (again.st_ino, again.st_mtime_ns) == (made.st_ino, made.st_mtime_ns)  # loaded, not converted again
    assert len(ConvertedCache(str(root)).entries()) == 1 and first.images and second.images


def test_accelstack_cache_lists_and_purges_the_converted_models(tmp_path):
    from accelstack.core.caches import cache_infos, purge
    from accelstack.settings import Settings

    settings = Settings.resolve(cache=tmp_path / "cache", home=tmp_path / "home", env={})
    root = settings.cache / "converted"
    src = _source(tmp_path)
    made = ConvertedCache(str(root)).store(src, "q8_0", _converter([]))
    assert made is not None
    (root / ("0" * 32 + ".gguf")).write_bytes(b"GGUF a user's file, named like ours, without a record")
    (root / ("1" * 32 + ".gguf")).symlink_to(src)
    [info] = cache_infos(settings, ["converted"])
    assert sorted(e.kind for e in info.entries) == ["converted model", "converted model's record"]
    assert info.size >= made.stat().st_size and len(info.other) == 2
    report = purge(["converted"], settings)
    assert sorted(Path(p).name for p in report.removed) == sorted([made.name, made.with_suffix(".json").name])
    assert sorted(p.name for p in root.iterdir()) == ["0" * 32 + ".gguf", "1" * 32 + ".gguf"] and src.exists()
