"""Issue 29: `cache purge builds` deletes only the build slots accelstack made, never a folder of
the user's that happens to have a build slot's name (20 hex digits)."""
from __future__ import annotations

import json

from accelstack.publisher.build_cache import SLOT_MARK, make_slot

from cli_helpers import result_of, run_cli


def test_purge_builds_leaves_a_users_folder_with_a_slot_like_name(tmp_path):
    builds = tmp_path / "my-projects"  # ACCELSTACK_BUILD_CACHE pointed at a folder of the user's
    mine = builds / "0123456789abcdef0123"
    (mine / "src").mkdir(parents=True)
    (mine / "src" / "main.c").write_text("int main(void) { return 0; }")
    (mine / "build.json").write_text(json.dumps({"name": "my project"}))  # a build.json of its own
    ours = make_slot(builds / "fedcba9876543210fedc")
    (ours / "build.log").write_text("a failed build's log")
    assert (ours / SLOT_MARK).is_file()
    env = {"ACCELSTACK_CACHE": str(tmp_path / "cache"), "ACCELSTACK_HOME": str(tmp_path / "home"),
           "ACCELSTACK_BUILD_CACHE": str(builds)}
    rc, out, err = run_cli(["cache", "list", "--json"], env=env)
    assert rc == 0, err
    caches = {c["name"]: c for c in result_of(out)["caches"]}
    assert mine.name in caches["builds"]["other"]
    rc, out, err = run_cli(["cache", "purge", "builds", "--yes", "--json"], env=env)
    assert rc == 0, err
    assert (mine / "src" / "main.c").read_text() == "int main(void) { return 0; }"
    assert not ours.exists()
    assert str(ours) in result_of(out)["removed"] and all(mine.name not in p for p in result_of(out)["removed"])
