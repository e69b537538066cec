"""Issue 42, item 4: `status` on a damaged state exits non-zero with advice that helps. It exited 0 with
`ok: true` on a runtime whose files were gone, and with a damaged active.json it invited `gc` for the only
runtime (which gc refuses to touch while it cannot read which one is active). A real install through the
real CLI, then damaged as a user's disk would be."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Tuple

from accelstack.installer.home import Home

from cli_helpers import final_of, result_of, run_cli


def _install(site, tmp_path: Path) -> Tuple[Dict[str, str], Home, str]:
    env = {"ACCELSTACK_HOME": str(tmp_path / "home"), "ACCELSTACK_CACHE": str(tmp_path / "cache"), "ACCELSTACK_OFFLINE": ""}
    rc, out, err = run_cli(["install", "--json", "--no-build", "--manifest", site["v1"], "--trusted-key", site["public_key"]], env)
    assert rc == 0, err[-2000:]
    return env, Home(tmp_path / "home"), result_of(out)["runtime"]


def test_status_on_a_damaged_runtime_or_active_json_exits_1_with_the_step_that_helps(site, tmp_path):
    env, home, rid = _install(site, tmp_path)
    rc, out, err = run_cli(["status", "--offline"], env)
    assert rc == 0, err  # healthy: exit 0

    receipt = home.read_receipt(rid)
    lib = next(f.path for f in receipt.files if ".so" in f.path)
    (home.runtime_path(receipt) / lib).unlink()
    rc, out, err = run_cli(["status", "--offline"], env)
    assert rc == 1, (out, err)
    assert "[damaged: run `accelstack repair`]" in out and "1 missing" in out, out
    rc, out, err = run_cli(["status", "--offline", "--json"], env)
    assert rc == 1
    final = final_of(out)
    assert final["event"] == "result" and final["ok"] is False, final
    ggml = next(s for s in final["result"]["stacks"] if s["stack"] == "ggml")
    assert ggml["healthy"] is False and any(p["action"] == "repair" for p in ggml["problems"])
    rc, out, err = run_cli(["repair", "--offline"], env)
    assert rc == 0, (out, err[-2000:])

    home.active_path.write_text("{ not json")
    rc, out, err = run_cli(["status", "--offline"], env)
    assert rc == 1, (out, err)
    assert "gc" not in out, out  # gc would not run, and the runtime is the one the user has
    assert f"installed: {rid} (`accelstack repair` restores which one is active)" in out, out
    assert "active.json is damaged" in out and "accelstack repair" in out, out
    rc, out, err = run_cli(["status", "--offline", "--json"], env)
    assert rc == 1 and final_of(out)["ok"] is False
