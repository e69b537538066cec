"""`accelstack gc` and `accelstack cache list` measure a cache one way: what accelstack wrote
there (its entries), never a lock file or a file of the user's that happens to lie in it."""
from __future__ import annotations

import re
from pathlib import Path

from accelstack.publisher.build_cache import make_slot
from accelstack.serde import size_text

from cli_helpers import result_of, run_cli


def test_gc_and_cache_list_say_the_same_size_of_the_builds_cache(tmp_path):
    builds = tmp_path / "builds"
    env = {"ACCELSTACK_CACHE": str(tmp_path / "cache"), "ACCELSTACK_HOME": str(tmp_path / "home"),
           "ACCELSTACK_BUILD_CACHE": str(builds), "ACCELSTACK_PROBE_CACHE": str(tmp_path / "probe")}
    slot = make_slot(builds / ("0123456789" * 2))
    (slot / "wheel.whl").write_bytes(b"\0" * (3 << 20))
    (builds / f"{slot.name}.lock").write_bytes(b"")
    (builds / "notes.bin").write_bytes(b"\1" * (5 << 20))  # the user's: not in the cache's size, never purged

    rc, out, err = run_cli(["cache", "list", "--json"], env=env)
    assert rc == 0, err
    listed = {c["name"]: c for c in result_of(out)["caches"]}["builds"]
    assert [e["name"] for e in listed["entries"]] == [slot.name] and listed["other"] == ["notes.bin"]

    rc, out, err = run_cli(["gc"], env=env)
    assert rc == 0, err
    said = re.search(r"builds cache ([\d.]+ \w+) \(", out + err)
    assert said is not None, out + err
    assert said[1] == size_text(listed["size"]), f"gc says {said[1]}, cache list {size_text(listed['size'])}"
    assert Path(builds / "notes.bin").is_file()
