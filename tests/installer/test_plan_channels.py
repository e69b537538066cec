"""Issue 25: `plan` reads the channels `install` reads, one "no channel" line per install, a refused
`install --backend bogus` creates nothing (not even the hardware probe's cache), `bundle create`
prints the whole offline command (its key too), and `channel add` tries the URL once."""
from __future__ import annotations

import re
import shlex
import socket
from pathlib import Path

from installer_helpers import cli_env, error_of, result_of, run_cli


def _pub(path: Path, public_b64: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# test key\n{public_b64}\n")
    return path


def _env(tmp_path: Path, name: str = "a", **extra: str) -> dict:
    return cli_env(tmp_path / name / "home", tmp_path / name / "cache",
                   {"ACCELSTACK_CONFIG_DIR": str(tmp_path / name / "config"), **extra})


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once closed


def test_plan_reads_the_configured_channels_as_install_does(site, tmp_path, signing_key):
    env = _env(tmp_path)
    pub = _pub(tmp_path / "release.pub", signing_key[1])
    assert run_cli(["channel", "add", "test-channel", site["v1"], "--key", str(pub)], env).returncode == 0
    planned = result_of(run_cli(["plan", "--json"], env))
    assert planned["status"] == "ready", planned["summary"]
    assert planned["artifacts"][0]["urls"][0].startswith(site["server"].url)
    would = result_of(run_cli(["install", "--dry-run", "--json"], env))
    assert would["plan"]["variant"] == planned["variant"]
    assert would["plan"]["artifacts"] == planned["artifacts"]


def test_one_no_channel_line_per_install(tmp_path):
    env = _env(tmp_path, ACCELSTACK_BUILD_CACHE=str(tmp_path / "builds"))
    proc = run_cli(["install", "--dry-run", "--offline"], env)
    assert proc.returncode == 0, proc.stderr
    assert (proc.stdout + proc.stderr).count("no channel is configured") == 1, proc.stdout + proc.stderr


def test_a_refused_backend_creates_nothing(tmp_path):
    """The name is checked before the hardware is probed: not even the probe's cache is written."""
    for argv, extra in ((["install", "--backend", "bogus", "--json"], {}),
                        (["install", "--json"], {"ACCELSTACK_BACKEND": "bogus"}),
                        (["install", "--stack", "torch", "--backend", "bogus", "--json"], {})):
        env = {**_env(tmp_path), **extra}
        proc = run_cli(argv, env)
        err = error_of(proc)
        assert proc.returncode == 2 and err["error"] == "UsageError", (argv, err)
        assert "'bogus'" in err["message"] and "cpu" in err["hint"], err
        made = [p for p in (tmp_path / "a").rglob("*") if p.is_file()] if (tmp_path / "a").exists() else []
        assert made == [], (argv, made)  # no home, no detection cache, nothing


def test_bundle_create_prints_the_whole_offline_install_command(site, tmp_path, signing_key):
    env = _env(tmp_path)
    pub = _pub(tmp_path / "release.pub", signing_key[1])
    assert run_cli(["channel", "add", "test-channel", site["v1"], "--key", str(pub)], env).returncode == 0
    bundle = tmp_path / "runtime.tar"
    proc = run_cli(["bundle", "create", "-o", str(bundle), "--backend", "cpu"], env)
    assert proc.returncode == 0, proc.stderr
    assert "(s)" not in proc.stdout and ", 1 target: " in proc.stdout, proc.stdout  # "1 target", not "target(s)"
    assert re.search(r"\(\d[\d.]* (B|KiB|MiB|GiB), sha256 ", proc.stdout), proc.stdout  # the size in binary units
    line = next(ln for ln in proc.stdout.splitlines() if "accelstack install --bundle" in ln)
    argv = shlex.split(line.split(":", 1)[1])
    assert argv[:4] == ["accelstack", "install", "--bundle", str(bundle)] and "--offline" in argv
    assert argv[argv.index("--trusted-key") + 1] == signing_key[1]
    made = result_of(run_cli(["bundle", "create", "-o", str(bundle), "--backend", "cpu", "--json"], env))
    assert made["trusted_keys"] == [signing_key[1]]


def test_channel_add_tries_the_url_once(site, tmp_path, signing_key):
    env = _env(tmp_path)
    pub = _pub(tmp_path / "release.pub", signing_key[1])
    dead = f"http://127.0.0.1:{_closed_port()}/ggml-manifest.json"
    proc = run_cli(["channel", "add", "gone", dead, "--key", str(pub), "--json"], env)
    err = error_of(proc)
    assert proc.returncode == 2 and "--no-check" in err["hint"], err
    assert "gone" not in [c["name"] for c in result_of(run_cli(["channel", "list", "--json"], env))["channels"]]
    proc = run_cli(["channel", "add", "gone", dead, "--key", str(pub), "--no-check", "--json"], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run_cli(["channel", "add", "test-channel", site["v1"], "--key", str(pub), "--json"], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = [c["name"] for c in result_of(run_cli(["channel", "list", "--json"], env))["channels"]]
    assert "gone" in names and "test-channel" in names
