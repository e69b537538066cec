"""Issue 42, item 12: a multi-family verify's summary showed the first family's numbers (load, step, image,
probe) as the whole run's. The real CLI on the CPU build with two families."""
from __future__ import annotations

import json

from engine_helpers import cli_env, run_cli


def test_a_two_family_verify_sums_the_run_and_leaves_one_familys_figures_to_its_line(cpu_runtime, tmp_path):
    cache = tmp_path / "cache"
    args = ["verify", "--runtime", cpu_runtime.path, "--family", "flux", "--family", "chroma"]
    res = run_cli([*args, "--json"], cli_env(cache, tmp_path))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    report = json.loads(res.stdout.strip().splitlines()[-1])["result"]
    fams = report["details"]["families"]
    assert report["load_seconds"] == round(sum(f["load_seconds"] for f in fams.values()), 4), report["load_seconds"]
    assert report["generate_seconds"] == round(sum(f["generate_seconds"] for f in fams.values()), 4)
    assert report["step_seconds"] is None and report["its_per_second"] is None  # no one figure for two families
    assert report["image"] == "" and all(f["image"] for f in fams.values())

    res = run_cli(args, cli_env(cache, tmp_path))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    lines = res.stdout.splitlines()
    load = next(line for line in lines if line.startswith("  load "))
    assert load.endswith("s in all (each family's below)"), load
    assert not any(line.startswith(("  step ", "  image ")) for line in lines), lines  # a family's, not the run's
    assert sum(1 for line in lines if " image " in line and "verify-cpu-" in line) == 2, lines
