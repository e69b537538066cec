"""The install and maintenance commands do what they say (issue 14), checked through the real CLI.

A small but valid wheel stands in for the stable-diffusion.cpp build, published with a signed
manifest on a loopback server, so these run in seconds without a compiler: what is tested here is
what the commands do and say (dry run, refusals, provenance, uninstall, Ctrl-C), not the engine.
Installs that need a passing check go through the library with a check that passes; the CLI then
reads the home they leave.
"""
from __future__ import annotations

import hashlib
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest

import accelstack
from accelstack.core.installing import install
from accelstack.installer.home import Home
from accelstack.manifests.signing import generate_keypair
from accelstack.publisher.build_cache import BuildResult
from accelstack.serde import size_text
from accelstack.settings import Settings
from accelstack.verdict import VerifyReport

from cli_helpers import REPO, error_of, events_of, finish_pty, result_of, run_cli
from installer_helpers import write_wheel


def _installer_fixtures():
    """The loopback server and ``publish`` of this directory's conftest (a module named
    ``conftest`` is ambiguous on sys.path, so it is loaded by its path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("installer_conftest", Path(__file__).with_name("conftest.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Server, module.publish


Server, publish = _installer_fixtures()

CAPTURES = REPO / "tests" / "fixtures" / "captures"
CPU_ONLY = CAPTURES / "linux-cpu-pentium-e5700-no-avx"  # no GPU at all, no AVX
NVIDIA = CAPTURES / "linux-nvidia-rtx4070-550"
VERSION = "0.4.7"
BUILD_LINE = "would build cpu from source (~4 min, needs cmake and a C++ compiler)"



def make_wheel(directory: Path, marker: str, padding: int = 0) -> Path:
    """A valid wheel of the right name for this interpreter and machine (RECORD checked by the
    installer); ``padding`` bytes of incompressible data make its download take a while."""
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    name = f"stable_diffusion_cpp_python-{VERSION}-{tag}-{tag}-linux_{platform.machine()}.whl"
    info = f"stable_diffusion_cpp_python-{VERSION}.dist-info"
    files: Dict[str, bytes] = {
        "stable_diffusion_cpp/__init__.py": f"MARK = {marker!r}\n".encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: stable-diffusion-cpp-python\nVersion: {VERSION}\n".encode(),
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}-{tag}-linux_{platform.machine()}\n".encode(),
    }
    if padding:
        files["stable_diffusion_cpp/padding.bin"] = os.urandom(padding)
    return write_wheel(directory / name, files)


@pytest.fixture
def fake_site(tmp_path):
    """v1 and v2 manifests (one small wheel each), and a v3 whose wheel is 24 MB, on 127.0.0.1."""
    root = tmp_path / "site"
    root.mkdir()
    server = Server(root)
    private_pem, public_b64 = generate_keypair()
    out: Dict[str, object] = {"server": server, "public_key": public_b64}
    for version, padding in ((1, 0), (2, 0), (3, 24 << 20)):
        wheel = make_wheel(tmp_path / "wheels" / f"v{version}", f"v{version}", padding)
        data = wheel.read_bytes()
        build = BuildResult(variant="cpu", wheel=str(wheel), sha256=hashlib.sha256(data).hexdigest(), size=len(data),
                            cmake_args=[], source_sha256="0" * 64, key=f"test-{version}", platform_tag=f"linux_{platform.machine()}")
        publish(build, wheel, root, f"v{version}", version, private_pem, server.url)
        out[f"v{version}"] = f"{server.url}/v{version}/ggml-manifest.json"
    yield out
    server.close()


def _env(tmp_path: Path) -> Dict[str, str]:
    """Home, caches and config all under ``tmp_path/state``, so a snapshot of it sees every write."""
    state = tmp_path / "state"
    return {"ACCELSTACK_HOME": str(state / "home"), "ACCELSTACK_CACHE": str(state / "cache"),
            "ACCELSTACK_BUILD_CACHE": str(state / "builds"), "ACCELSTACK_PROBE_CACHE": str(state / "probe"),
            "ACCELSTACK_CONFIG": str(state / "config" / "config.yaml"), "ACCELSTACK_CONFIG_DIR": str(state / "config"),
            "ACCELSTACK_OFFLINE": "", "ACCELSTACK_BACKEND": ""}


def _settings(tmp_path: Path, site, manifest: str = "v1") -> Settings:
    e = _env(tmp_path)
    return Settings.resolve(home=e["ACCELSTACK_HOME"], cache=e["ACCELSTACK_CACHE"], build_cache=e["ACCELSTACK_BUILD_CACHE"],
                            probe_cache=e["ACCELSTACK_PROBE_CACHE"], manifests=[site[manifest]],
                            trusted_keys=[site["public_key"]], allow_build=False)


def _passing(staged, progress) -> VerifyReport:
    """A check that passes: the commands' behaviour is under test here, not the engine."""
    return VerifyReport(ok=True, reason="", runtime=str(staged.path), backend=staged.backend, check="test")


def _install(tmp_path: Path, site, manifest: str = "v1", force: bool = False):
    from accelstack.core.planning import load_manifests

    s = _settings(tmp_path, site, manifest)
    trusted = load_manifests(s, record=True)
    return install(None, stack="ggml", settings=s, verifier=_passing, force=force, trusted=trusted)


def snapshot(root: Path) -> List[str]:
    """Every path under ``root`` with its size and mtime: a dry run must change none of it."""
    out = []
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out.append(f"{p.relative_to(root)} {st.st_size} {st.st_mtime_ns}")
    return out


# -- 2. a dry run has no side effects ------------------------------------------------------------
def test_dry_run_that_would_build_touches_nothing_and_says_so(tmp_path):
    (tmp_path / "state").mkdir()
    before = snapshot(tmp_path)
    env = _env(tmp_path)
    rc, out, err = run_cli(["install", "--dry-run", "--json", "--replay", CPU_ONLY], env)
    assert rc == 0, err
    res = result_of(out)
    assert res["dry_run"] is True and res["changed"] is False and res["would_build"] == "cpu-noavx2"
    assert res["would"][0].startswith("would build cpu-noavx2 from source (~4 min, needs cmake and a C++ compiler)")
    rc, out, err = run_cli(["install", "--dry-run"], env)  # this machine, text
    assert rc == 0, err
    assert "dry run (nothing was changed)" in out and "would build cpu" in out and "from source (~4 min" in out
    assert snapshot(tmp_path) == before  # no home, no lock, no cache, no config, no build


def test_dry_run_says_when_the_build_cache_already_has_the_build(tmp_path):
    import json

    from accelstack.publisher.build import build_options
    from accelstack.publisher.build_cache import cache_key
    from accelstack.publisher.sdist import sdist_name

    env = _env(tmp_path)
    builds = Path(env["ACCELSTACK_BUILD_CACHE"])
    (builds / "sdist").mkdir(parents=True)
    sdist = builds / "sdist" / sdist_name()
    sdist.write_bytes(b"a stand-in source distribution")
    options, _ = build_options("cpu-noavx2", cuda_env={})
    slot = builds / cache_key(hashlib.sha256(sdist.read_bytes()).hexdigest(), "cpu-noavx2", options)
    slot.mkdir()
    wheel = make_wheel(slot, "cached")
    (slot / "build.json").write_text(json.dumps({"wheel": str(wheel)}))
    before = snapshot(tmp_path)
    rc, out, err = run_cli(["install", "--dry-run", "--json", "--replay", CPU_ONLY], env)
    assert rc == 0, err
    assert result_of(out)["would"][0] == f"would reuse the cpu-noavx2 build already in the build cache (no compile): {wheel}"
    assert snapshot(tmp_path) == before


def _cached_stand_in_build(builds: Path, variant: str) -> Path:
    """A build cache holding a finished build of ``variant`` as ``build_ggml`` leaves one (its record,
    the wheel's remembered digest): a local build is then a cache hit, as on any machine after the
    first install. The wheel is a stand-in, so the install that uses it is given a passing check."""
    from accelstack.publisher.build import build_options
    from accelstack.publisher.build_cache import cache_key, cached_sha256, make_slot, write_record
    from accelstack.publisher.sdist import sdist_name
    from accelstack.publisher.variants import properties_for
    from accelstack.publisher.wheel_repack import PACKAGING_VERSION

    (builds / "sdist").mkdir(parents=True)
    sdist = builds / "sdist" / sdist_name()
    sdist.write_bytes(b"a stand-in source distribution")
    options, toolkit = build_options(variant, cuda_env={})
    source = cached_sha256(sdist)
    slot = make_slot(builds / cache_key(source, variant, options, toolkit))
    wheel = make_wheel(slot / f"lean{PACKAGING_VERSION}", "cached")
    data = wheel.read_bytes()
    write_record(slot / "build.json", BuildResult(
        variant=variant, wheel=str(wheel), sha256=cached_sha256(wheel), size=len(data), cmake_args=options,
        source_sha256=source, key=slot.name, platform_tag=f"linux_{platform.machine()}", packaging=PACKAGING_VERSION,
        properties=properties_for(variant, options)),
        root=builds)
    return wheel


def test_dry_run_after_a_local_build_install_says_nothing_to_do_as_the_install_does(tmp_path):
    """Issue 42, item 3: on a healthy install of a build made here (no channel has one for this machine),
    `install --dry-run` listed a reuse of the build and an install, while `install` did nothing."""
    from accelstack.core.local_build import local_variant
    from accelstack.core.reports import report_for

    env = _env(tmp_path)
    s = Settings.resolve(home=env["ACCELSTACK_HOME"], cache=env["ACCELSTACK_CACHE"], build_cache=env["ACCELSTACK_BUILD_CACHE"],
                         probe_cache=env["ACCELSTACK_PROBE_CACHE"], config_dir=env["ACCELSTACK_CONFIG_DIR"],
                         config_file=env["ACCELSTACK_CONFIG"], allow_build=True)
    report = report_for(s)  # this machine: no channel is configured, so its build is made here
    variant = local_variant(accelstack.plan(report, "ggml", settings=s), report)
    _cached_stand_in_build(Path(env["ACCELSTACK_BUILD_CACHE"]), variant)
    first = install(None, stack="ggml", settings=s, report=report, verifier=_passing)
    assert first.changed and first.built_locally, first
    before = snapshot(tmp_path / "state")
    rc, out, err = run_cli(["install", "--dry-run", "--json"], env)
    assert rc == 0, err
    res = result_of(out)
    assert res["would"] == [f"nothing to do: runtime {first.runtime} is already installed and active (--force reinstalls it)"], res
    assert res["runtime"] == first.runtime and not res["would_build"]
    assert snapshot(tmp_path / "state") == before
    rc, out, err = run_cli(["install", "--dry-run"], env)
    assert rc == 0 and "nothing to do" in out and "would install" not in out and "would reuse" not in out, out
    rc, out, err = run_cli(["install", "--json"], env)  # the real run: the same decision
    assert rc == 0, err
    real = result_of(out)
    assert real["changed"] is False and real["runtime"] == first.runtime, real

    rc, out, err = run_cli(["install", "--dry-run", "--force", "--json"], env)
    assert rc == 0, err  # --force: the reuse, then the reinstall the real run would do
    would = result_of(out)["would"]
    assert would[0].startswith(f"would reuse the {variant} build already in the build cache (no compile)"), would
    assert would[-1].startswith(f"would reinstall runtime {first.runtime}"), would


def test_dry_run_names_the_build_line_of_the_issue(tmp_path):
    from accelstack.core.local_build import build_sentence

    assert build_sentence("cpu").startswith(BUILD_LINE)


def test_dry_run_with_a_manifest_reads_it_but_writes_nothing(tmp_path, fake_site):
    (tmp_path / "state").mkdir()
    before = snapshot(tmp_path / "state")
    rc, out, err = run_cli(["install", "--dry-run", "--json", "--manifest", fake_site["v1"],
                            "--trusted-key", fake_site["public_key"], "--no-build"], _env(tmp_path))
    assert rc == 0, err
    res = result_of(out)
    assert res["dry_run"] and res["runtime"].startswith("linux-") and not res["would_build"]
    assert any(w.startswith("would download stable_diffusion_cpp_python-") for w in res["would"])
    assert snapshot(tmp_path / "state") == before


def test_dry_run_after_an_install_says_nothing_to_do_and_still_writes_nothing(tmp_path, fake_site):
    first = _install(tmp_path, fake_site)
    before = snapshot(tmp_path / "state")
    rc, out, err = run_cli(["install", "--dry-run", "--manifest", fake_site["v1"], "--trusted-key", fake_site["public_key"]],
                           _env(tmp_path))
    assert rc == 0, err
    assert f"nothing to do: runtime {first.runtime} is already installed and active" in out
    rc, out, err = run_cli(["install", "--dry-run", "--json", "--manifest", fake_site["v2"], "--trusted-key", fake_site["public_key"]],
                           _env(tmp_path))
    res = result_of(out)
    assert rc == 0 and res["previous"] == first.runtime and f"{first.runtime} stays for `rollback`" in res["would"][-1]
    assert snapshot(tmp_path / "state") == before


# -- 3. an impossible forced backend is refused first ------------------------------------------------
@pytest.mark.parametrize("dry", [True, False])
def test_forced_backend_this_machine_cannot_run_is_refused_before_anything(tmp_path, dry):
    (tmp_path / "state").mkdir()
    before = snapshot(tmp_path)
    args = ["install", "--backend", "cuda", "--json", "--replay", CPU_ONLY] + (["--dry-run"] if dry else [])
    rc, out, err = run_cli(args, _env(tmp_path))
    assert rc == 3, (out, err)
    e = error_of(out)
    assert e["error"] == "NotPossibleHere" and e["code"] == "not-possible-here"
    assert "cuda" in e["message"] and "this machine runs: cpu" in e["hint"]
    assert snapshot(tmp_path) == before  # refused before the home, the cache or a build


def test_forced_backend_refusal_comes_before_the_manifest_is_fetched(tmp_path, fake_site):
    server = fake_site["server"]
    server.close()  # a fetch would fail with a network error, not exit 3
    rc, out, err = run_cli(["install", "--backend", "cuda", "--json", "--replay", CPU_ONLY, "--manifest", fake_site["v1"],
                            "--trusted-key", fake_site["public_key"]], _env(tmp_path))
    assert rc == 3 and error_of(out)["code"] == "not-possible-here"


def test_a_forced_backend_the_machine_can_run_is_not_refused(tmp_path):
    rc, out, err = run_cli(["install", "--backend", "cuda", "--dry-run", "--json", "--replay", NVIDIA], _env(tmp_path))
    assert rc == 0, (out, err)
    res = result_of(out)
    # driver 550 runs CUDA up to 12.4: the CUDA 12 build, for the RTX 4070's sm_89 only
    assert res["would_build"] == "cuda12" and res["would"][0].startswith("would build cuda12 from source for sm_89")


# -- 4 and 5: --force, provenance in status -----------------------------------------------------------
def test_force_reinstall_does_not_name_itself_previous(tmp_path, fake_site):
    from accelstack.commands.install import _install_text

    first = _install(tmp_path, fake_site)
    again = _install(tmp_path, fake_site, force=True)
    assert again.runtime == first.runtime and again.changed and again.reinstalled
    assert again.previous == ""
    text = _install_text(again)
    assert "reinstalled runtime" in text and "previous:" not in text
    h = Home(Path(_env(tmp_path)["ACCELSTACK_HOME"]))
    assert h.read_active().previous.get("ggml", "") != first.runtime
    upgraded = _install(tmp_path, fake_site, "v2")
    assert upgraded.previous == first.runtime and not upgraded.reinstalled


def test_status_says_where_each_runtime_came_from(tmp_path, fake_site):
    first = _install(tmp_path, fake_site)
    env = _env(tmp_path)
    rc, out, err = run_cli(["status", "--json", "--offline"], env)
    assert rc == 0, err
    res = result_of(out)
    assert res["home"] == env["ACCELSTACK_HOME"]
    ggml = next(s for s in res["stacks"] if s["stack"] == "ggml")
    r = ggml["receipt"]
    assert ggml["active"] == first.runtime
    assert r["manifest_source"] == "test-channel" and r["manifest_version"] == 1
    assert r["channel"] == "" and r["manifest_url"] == fake_site["v1"]  # a --manifest URL: no channel name to show
    assert r["package"] == "stable-diffusion-cpp-python" and r["package_version"] == VERSION
    origin = f"manifest test-channel v1 ({fake_site['v1']}), stable-diffusion-cpp-python {VERSION}"
    assert r["origin"] == origin
    rc, out, err = run_cli(["status", "--offline"], env)
    assert rc == 0 and f"from: {origin}" in out


def test_status_names_the_channel_a_runtime_came_from(tmp_path, fake_site):
    env = _env(tmp_path)
    key = tmp_path / "publisher.pub"
    key.write_text(str(fake_site["public_key"]) + "\n")
    rc, out, err = run_cli(["channel", "add", "stable", fake_site["v2"], "--key", key], env)
    assert rc == 0, (out, err)
    s = Settings.resolve(home=env["ACCELSTACK_HOME"], cache=env["ACCELSTACK_CACHE"], probe_cache=env["ACCELSTACK_PROBE_CACHE"],
                         build_cache=env["ACCELSTACK_BUILD_CACHE"], config_dir=env["ACCELSTACK_CONFIG_DIR"],
                         config_file=env["ACCELSTACK_CONFIG"], allow_build=False)
    summary = install(None, stack="ggml", settings=s, verifier=_passing)
    assert summary.receipt.channel == "stable"
    rc, out, err = run_cli(["status", "--offline"], env)
    assert rc == 0 and f"from: channel stable, manifest test-channel v2, stable-diffusion-cpp-python {VERSION}" in out


# -- 6. uninstall lists, sizes, asks ------------------------------------------------------------------
def test_uninstall_without_terminal_or_yes_is_a_usage_error_and_removes_nothing(tmp_path, fake_site):
    first = _install(tmp_path, fake_site)
    env = _env(tmp_path)
    before = snapshot(tmp_path / "state")
    rc, out, err = run_cli(["uninstall", "--json"], env)
    assert rc == 2
    e = error_of(out)
    assert e["error"] == "UsageError" and "--yes" in e["hint"]
    rc, out, err = run_cli(["uninstall"], env)
    assert rc == 2 and "pass --yes" in err
    assert snapshot(tmp_path / "state") == before
    assert Home(Path(env["ACCELSTACK_HOME"])).read_active().active["ggml"] == first.runtime


def test_uninstall_yes_lists_what_it_removed_and_what_the_caches_keep(tmp_path, fake_site):
    first = _install(tmp_path, fake_site)
    second = _install(tmp_path, fake_site, "v2")
    env = _env(tmp_path)
    rc, out, err = run_cli(["uninstall", "--yes"], env)
    assert rc == 0, err
    assert "uninstall removes 2 ggml runtimes, freeing" in out
    assert first.runtime in out and second.runtime in out
    assert "these stay (`accelstack cache purge` removes them):" in out and "downloads cache" in out
    _install(tmp_path, fake_site, "v2")  # v1 again would be a manifest rollback
    rc, out, err = run_cli(["uninstall", "--yes", "--json"], env)
    res = result_of(out)
    assert rc == 0 and res["removed"] == [second.runtime] and res["bytes_freed"] > 0
    assert {k["name"] for k in res["kept"]} == {"downloads", "builds", "probe", "verify"}
    downloads = next(k for k in res["kept"] if k["name"] == "downloads")
    assert downloads["bytes"] > 0  # the wheels stay in the download cache: said, not hidden
    rc, out, err = run_cli(["uninstall", "--json"], env)  # nothing left: nothing to confirm
    assert rc == 0 and result_of(out)["removed"] == []


def test_uninstall_on_a_terminal_asks_and_no_keeps_everything(tmp_path, fake_site):
    import pty

    first = _install(tmp_path, fake_site)
    env = {**os.environ, **_env(tmp_path), "PYTHONPATH": str(REPO)}
    for answer, removed in ((b"n\n", False), (b"y\n", True)):
        pid, fd = pty.fork()
        if pid == 0:  # the child: stdin and stdout are the terminal
            os.execve(sys.executable, [sys.executable, "-m", "accelstack", "uninstall"], env)
        seen = b""
        deadline = time.time() + 60
        while b"[y/N]" not in seen and time.time() < deadline:
            seen += os.read(fd, 4096)
        assert b"uninstall removes 1 ggml runtime," in seen and first.runtime.encode() in seen
        os.write(fd, answer)
        status, more = finish_pty(pid, fd)
        seen += more
        assert os.WEXITSTATUS(status) == (0 if removed else 1), seen
        assert (b"removed 1 runtime," in seen) == removed and (b"nothing removed" in seen) != removed


def test_install_yes_is_accepted_but_not_advertised(tmp_path):
    rc, out, err = run_cli(["install", "--help"], _env(tmp_path))
    assert rc == 0 and "--yes" not in out
    rc, out, err = run_cli(["install", "--yes", "--dry-run", "--json", "--replay", CPU_ONLY], _env(tmp_path))
    assert rc == 0 and result_of(out)["dry_run"]


# -- 7. Ctrl-C says what state it left ------------------------------------------------------------------
def test_ctrl_c_during_a_download_keeps_the_part_and_says_so(tmp_path, fake_site):
    first = _install(tmp_path, fake_site)
    fake_site["server"].set_delay(0.05)  # 24 MB in 64 KiB chunks: about 20 s
    # no minimum rate: on a loaded machine the download must still be running when Ctrl-C comes
    env = {**os.environ, **_env(tmp_path), "PYTHONPATH": str(REPO), "ACCELSTACK_MIN_RATE": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "accelstack", "install", "--json", "--manifest", fake_site["v3"],
                             "--trusted-key", fake_site["public_key"]], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    blobs = Path(env["ACCELSTACK_CACHE"]) / "blobs" / "sha256"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        parts = list(blobs.glob("*.part")) if blobs.is_dir() else []
        if parts and parts[0].stat().st_size > 2_000_000:
            break
        time.sleep(0.1)
    assert proc.poll() is None, "the install ended before it could be interrupted: " + proc.stderr.read()[-2000:]
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    e = error_of(out)
    assert e["error"] == "Interrupted" and e["code"] == "interrupted"
    assert f"nothing changed, previous runtime {first.runtime} still active" in e["message"]
    assert "MiB kept, re-run to resume" in e["message"]
    kept = sum(p.stat().st_size for p in blobs.glob("*.part"))
    assert kept > 2_000_000 and f"downloaded {size_text(kept)} kept" in e["message"]
    assert Home(Path(env["ACCELSTACK_HOME"])).read_active().active["ggml"] == first.runtime
    events_of(out)  # the JSON Lines contract held through the interrupt


# -- 9, 10, 11: labels, help, index options --------------------------------------------------------------
def test_timings_are_labelled_for_what_they_measured():
    from accelstack.commands.install import _timings_text

    text = _timings_text({"build": 200.0, "download": 1.0, "stage": 0.5, "hash": 0.1, "verify": 20.0})
    assert text.startswith("build from source 200.0 s") and "verify (probe generation) 20.0 s" in text
    assert "plan" not in text


@pytest.mark.parametrize("command", ["install", "status", "repair", "upgrade", "rollback", "uninstall", "gc"])
def test_every_command_has_a_description_and_examples(command, tmp_path):
    rc, out, err = run_cli([command, "--help"], _env(tmp_path))
    assert rc == 0, err
    assert "\nexamples:\n  accelstack " + command in out
    head = out.split("\n\n")[1] if "\n\n" in out else ""
    assert len(head) > 40  # a description paragraph after the usage


@pytest.mark.parametrize("command", ["install", "upgrade", "repair"])
def test_index_url_options_reach_the_settings(command):
    from accelstack.cli import build_parser
    from accelstack.commands.install import _index_settings

    args = build_parser(command).parse_args([command, "--index-url", "https://mirror/simple", "--extra-index-url",
                                             "https://a/simple", "--extra-index-url", "https://b/simple"])
    assert _index_settings(args) == {"index_url": "https://mirror/simple",
                                     "extra_index_urls": ["https://a/simple", "https://b/simple"]}
    if "index_url" in {f.name for f in __import__("dataclasses").fields(Settings)}:
        s = Settings.resolve(**_index_settings(args))
        assert s.index_url == "https://mirror/simple" and s.extra_index_urls == ["https://a/simple", "https://b/simple"]


def test_first_run_script_verifies_once():
    script = "\n".join(line for line in (REPO / "scripts" / "first-run.sh").read_text().splitlines()
                         if not line.lstrip().startswith("#"))
    assert "accelstack install" in script and "accelstack verify" not in script
    assert "install --yes" not in script


def test_library_dry_run_returns_the_steps(tmp_path, fake_site):
    s = _settings(tmp_path, fake_site)
    summary = accelstack.core.install(None, stack="ggml", settings=s, dry_run=True)
    assert summary.dry_run and summary.would and not Path(s.home).exists() and not Path(s.cache).exists()


def test_torch_dry_run_shows_the_extra_index_and_touches_nothing(tmp_path):
    (tmp_path / "state").mkdir()
    before = snapshot(tmp_path)
    rc, out, err = run_cli(["install", "--stack", "torch", "--venv", tmp_path / "venv", "--dry-run", "--json",
                            "--extra-index-url", "https://mirror.example/simple", "--replay", CPU_ONLY], _env(tmp_path))
    assert rc == 0, (out, err)
    res = result_of(out)
    assert res["dry_run"] and res["would"][0] == f"would create the virtual environment {tmp_path / 'venv'}"
    assert any("--extra-index-url https://mirror.example/simple" in w for w in res["would"] if w.startswith("would run: "))
    assert snapshot(tmp_path) == before


# -- 1. one final line for every command -----------------------------------------------------------------
def test_every_maintenance_command_ends_with_one_result_or_error_line(tmp_path, fake_site):
    first = _install(tmp_path, fake_site)
    second = _install(tmp_path, fake_site, "v2")
    env = _env(tmp_path)
    rc, out, err = run_cli(["rollback", "--json"], env)
    assert rc == 0 and result_of(out)["active"]["ggml"] == first.runtime
    rc, out, err = run_cli(["gc", "--json"], env)
    assert rc == 0 and result_of(out)["runtimes_removed"] == []
    rc, out, err = run_cli(["status", "--json", "--offline"], env)
    assert rc == 0 and {s["stack"] for s in result_of(out)["stacks"]} >= {"ggml"}
    rc, out, err = run_cli(["uninstall", "--json", "--yes"], env)
    assert rc == 0 and sorted(result_of(out)["removed"]) == sorted([first.runtime, second.runtime])
    rc, out, err = run_cli(["repair", "--json"], env)  # nothing active any more
    assert rc == 1 and error_of(out)["action"] == "install"
    rc, out, err = run_cli(["rollback", "--json"], env)
    assert rc == 1 and error_of(out)["error"] == "StateError"
    rc, out, err = run_cli(["upgrade", "--json"], env)  # the remembered channel's v2: its stand-in wheel fails the real check
    assert rc == 1 and error_of(out)["code"] == "verify-failed"
    assert Home(Path(env["ACCELSTACK_HOME"])).read_active().active.get("ggml") is None  # nothing activated


def test_waiting_for_the_lock_is_said_and_ticks(tmp_path, fake_site):
    first = _install(tmp_path, fake_site)
    env = _env(tmp_path)
    home = Home(Path(env["ACCELSTACK_HOME"]))
    with home.lock("install (test holder)"):
        t = time.monotonic()
        rc, out, err = run_cli(["repair", "--json", "--wait", "2.5"], env)
        took = time.monotonic() - t
        assert rc == 1 and error_of(out)["code"] == "lock-held"
        waits = [e for e in events_of(out) if e.get("stage") == "lock"]
        assert waits[0]["kind"] == "start" and f"for process {os.getpid()} (install (test holder)" in waits[0]["message"]
        assert any(e["kind"] == "advance" for e in waits) and waits[-1]["kind"] == "end" and waits[-1]["ok"] is False
        assert took >= 2.5
        rc, out, err = run_cli(["repair", "--wait", "1.5"], env)  # a pipe: the wait is on stderr, as words
        assert rc == 1 and "waiting up to 2 s for process" in err
    assert home.read_active().active["ggml"] == first.runtime


def test_an_unknown_backend_is_a_usage_error_and_a_target_id_is_a_backend(tmp_path, fake_site):
    env = _env(tmp_path)
    rc, out, err = run_cli(["install", "--dry-run", "--json", "--backend", "bogus", "--replay", CPU_ONLY], env)
    assert rc == 2 and error_of(out)["error"] == "UsageError"
    keys = ["--manifest", fake_site["v1"], "--trusted-key", fake_site["public_key"]]
    rc, out, err = run_cli(["install", "--dry-run", "--json", "--backend", f"linux-{platform.machine()}-cpu", *keys], env)
    assert rc == 0, (out, err)
    assert result_of(out)["runtime"].startswith(f"linux-{platform.machine()}-cpu-")
    rc, out, err = run_cli(["install", "--dry-run", "--json", "--backend", "bogus", *keys], env)
    assert rc == 2 and f"linux-{platform.machine()}-cpu" in error_of(out)["hint"]
