"""End to end with the real CPU build: publish on 127.0.0.1, install, repair, upgrade, rollback, gc, uninstall."""
from __future__ import annotations

import json
from pathlib import Path

from accelstack.installer.home import Home

from installer_helpers import cli_env, error_of, result_of, run_cli


def _install(env, url, key, *extra):
    return run_cli(["install", "--json", "--no-build", "--manifest", url, "--trusted-key", key, *extra], env)


def test_install_repair_upgrade_rollback(site, tmp_path):
    home, cache = tmp_path / "home", tmp_path / "cache"
    env = cli_env(home, cache)
    key = site["public_key"]

    proc = _install(env, site["v1"], key)
    assert proc.returncode == 0, proc.stderr
    first = result_of(proc)
    assert first["changed"] is True
    rid1 = first["runtime"]
    h = Home(home)
    assert h.read_active().active["ggml"] == rid1
    receipt = h.read_receipt(rid1)
    runtime = h.runtime_path(receipt)
    assert not Path(receipt.path).is_absolute()  # a moved home keeps working
    assert (runtime / "stable_diffusion_cpp" / "__init__.py").is_file()
    assert receipt.manifest_source == "test-channel" and receipt.manifest_version == 1
    assert receipt.verification.ok is True and receipt.verification.check == "verify"
    assert len(receipt.files) > 5 and all(len(f.sha256) == 64 for f in receipt.files)
    assert not any(h.staging.iterdir())

    # a healthy re-run changes nothing
    again = result_of(_install(env, site["v1"], key))
    assert again["changed"] is False and again["runtime"] == rid1

    # repair: one file deleted, the native library corrupted
    lib = next(f.path for f in receipt.files if f.path.endswith(".so") or ".so." in f.path)
    (runtime / "stable_diffusion_cpp" / "__init__.py").unlink()
    with open(runtime / lib, "r+b") as fh:
        fh.seek(4096)
        fh.write(b"\0garbage\0" * 10)
    proc = run_cli(["repair", "--json"], env)
    assert proc.returncode == 0, proc.stderr
    rep = result_of(proc)
    assert rep["missing"] == ["stable_diffusion_cpp/__init__.py"]
    assert rep["corrupt"] == [lib]
    assert sorted(rep["fixed"]) == sorted([lib, "stable_diffusion_cpp/__init__.py"])
    assert result_of(run_cli(["repair", "--json"], env))["fixed"] == []

    # upgrade to manifest v2: side by side, then switch
    proc = run_cli(["upgrade", "--json", "--no-build", "--manifest", site["v2"], "--trusted-key", key], env)
    assert proc.returncode == 0, proc.stderr
    up = result_of(proc)
    rid2 = up["runtime"]
    assert rid2 != rid1 and up["previous"] == rid1
    assert (h.runtime_path(h.read_receipt(rid2)) / "stable_diffusion_cpp" / "_release.txt").read_text() == "v2\n"
    assert runtime.is_dir()  # the old one stays for rollback

    status = result_of(run_cli(["status", "--json"], env))["stacks"]
    ggml = next(s for s in status if s["stack"] == "ggml")
    assert ggml["active"] == rid2 and ggml["previous"] == rid1 and ggml["hardware_matches"] is True

    back = result_of(run_cli(["rollback", "--json"], env))
    assert back["active"]["ggml"] == rid1 and back["previous"]["ggml"] == rid2

    gc = result_of(run_cli(["gc", "--json"], env))
    assert gc["runtimes_removed"] == []  # active and previous are both kept

    removed = result_of(run_cli(["uninstall", "--yes", "--json"], env))
    assert sorted(removed["removed"]) == sorted([rid1, rid2]) and removed["bytes_freed"] > 0
    assert h.read_active().active == {}


def test_unsigned_and_tampered_manifests_are_refused(site, tmp_path):
    env = cli_env(tmp_path / "home", tmp_path / "cache")
    key = site["public_key"]
    manifest = site["root"] / "v1" / "ggml-manifest.json"

    sig = manifest.with_name(manifest.name + ".sig")
    sig_bytes = sig.read_bytes()
    sig.unlink()
    proc = _install(env, site["v1"], key)
    assert proc.returncode != 0
    assert "sign" in error_of(proc)["message"].lower()
    assert not (tmp_path / "home" / "runtimes" / "ggml").exists() or not any((tmp_path / "home" / "runtimes" / "ggml").iterdir())

    sig.write_bytes(sig_bytes)
    doc = json.loads(manifest.read_text())
    doc["targets"][0]["artifacts"][0]["url"] = "http://127.0.0.1:9/evil.whl"
    manifest.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    proc = _install(env, site["v1"], key)
    assert proc.returncode != 0
    assert "signature" in error_of(proc)["message"].lower()

    # a local mirror the user controls: explicitly accepted unsigned, and then the bad URL fails cleanly
    proc = _install(env, site["v1"], key, "--insecure-unsigned")
    assert proc.returncode != 0
    assert "127.0.0.1:9" in error_of(proc)["message"]
    assert Home(tmp_path / "home").read_active().active == {}


def test_manifest_rollback_is_refused(site, tmp_path):
    env = cli_env(tmp_path / "home", tmp_path / "cache")
    key = site["public_key"]
    assert _install(env, site["v2"], key).returncode == 0
    proc = _install(env, site["v1"], key)
    assert proc.returncode != 0
    assert "older than version 2" in error_of(proc)["message"]
