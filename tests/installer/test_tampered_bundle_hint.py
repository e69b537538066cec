"""Issue 42, item 12: a tampered bundle's hint said "run the same command again", which reads the same
bytes again. The real CLI installs a bundle one of whose artifacts was altered after it was made."""
from __future__ import annotations

from test_bundle import _bundle, _home, _pub, _rewrite

from installer_helpers import error_of, run_cli


def test_a_tampered_bundle_says_copy_it_again_not_run_the_same_command(site, tmp_path, signing_key):
    bundle = _bundle(site, tmp_path, signing_key)

    def flip_artifact(name, data):
        return data[:100] + bytes([data[100] ^ 1]) + data[101:] if name.startswith("artifacts/") else data

    bad = _rewrite(bundle, tmp_path / "bad-artifact.tar", flip_artifact)
    env = _home(tmp_path, "offline")
    env["ACCELSTACK_OFFLINE"] = "1"
    pub = _pub(tmp_path / "release.pub", signing_key[1])
    proc = run_cli(["install", "--bundle", str(bad), "--trusted-key", str(pub), "--json"], env)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    err = error_of(proc)
    assert err["error"] == "HashMismatchError" and err["action"] == "fix-input" and "run" not in err, err
    assert "run the same command again" not in err["hint"] and "try again" not in err["hint"], err
    assert f"the bundle {bad} was changed or damaged after it was made" in err["hint"], err
    proc = run_cli(["install", "--bundle", str(bad), "--trusted-key", str(pub)], env)
    assert proc.returncode == 1 and "run the same command again" not in proc.stderr, proc.stderr
