"""Issue 25: offline is offline (no sdist download, no manifest fetch), a cached local build installs
offline, a bundle install remembers its channel and key for `upgrade` and `status`, and a moved
build cache is still a cache."""
from __future__ import annotations

import http.server
import json
import shutil
import threading
from pathlib import Path

import pytest

import accelstack
from accelstack.artifacts.errors import OfflineError
from accelstack.core.bundles import create_bundle, install_bundle
from accelstack.core.verifiers import import_verifier
from accelstack.publisher.build import build_ggml
from accelstack.publisher.build_cache import read_record, write_record
from accelstack.settings import Channel, Settings

from installer_helpers import cli_env, result_of, run_cli


class _Recorder:
    """A loopback server that answers every request with 500 and records its path: an index
    or channel that an offline run must never ask."""

    def __init__(self) -> None:
        seen = self.seen = []

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                seen.append(self.path)
                self.send_error(500)

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def recorder():
    r = _Recorder()
    yield r
    r.close()


def _settings(tmp_path: Path, name: str = "a", **kw) -> Settings:
    return Settings.resolve(home=tmp_path / name / "home", cache=tmp_path / name / "cache",
                            config_dir=tmp_path / name / "config", **kw)


def test_offline_without_the_source_is_a_typed_error_before_any_download(tmp_path, recorder, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", recorder.url + "/simple")  # pip would ask here
    s = _settings(tmp_path, manifests=[], offline=True, build_cache=tmp_path / "builds")
    events = []
    with pytest.raises(OfflineError) as err:
        accelstack.install(None, settings=s, verifier=import_verifier(), on_progress=events.append)
    assert recorder.seen == []
    assert "stable-diffusion-cpp-python" in err.value.message and "offline" in err.value.message
    assert "bundle" in err.value.hint
    assert not (tmp_path / "builds" / "sdist").exists()
    assert not any("building" in (e.message or "") for e in events)


def test_a_cached_local_build_installs_offline(tmp_path, ggml_cpu_build, recorder, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", recorder.url + "/simple")
    s = _settings(tmp_path, manifests=[], offline=True)
    events = []
    summary = accelstack.install(None, settings=s, verifier=import_verifier(), on_progress=events.append)
    assert summary.built_locally and summary.changed and summary.receipt.manifest_source == "local-build"
    said = [e.message for e in events if e.message]
    assert not any("building one from source" in m or "building from source" in m for m in said), said
    assert any("build cache" in m for m in said), said
    assert recorder.seen == []
    assert "build" not in summary.timings and "build-cache" in summary.timings  # no "build from source 0.0 s"
    again = accelstack.install(None, settings=s, verifier=import_verifier(), on_progress=events.append)
    assert again.changed is False


def test_an_offline_install_reads_the_channel_manifest_it_verified_last_not_the_network(site, tmp_path, signing_key):
    channel = Channel("test-channel", site["v1"], keys=[signing_key[1]])
    online = _settings(tmp_path, channels=[channel], allow_build=False)
    first = accelstack.install(None, settings=online, verifier=import_verifier())
    assert first.changed
    site["server"].close()  # no network from here on
    offline = _settings(tmp_path, channels=[channel], allow_build=False, offline=True)
    again = accelstack.install(None, settings=offline, verifier=import_verifier())
    assert again.changed is False and again.runtime == first.runtime


def test_a_bundle_install_remembers_its_channel_and_key_for_offline_upgrade_and_status(site, tmp_path, signing_key):
    made = _settings(tmp_path, "maker", channels=[Channel("test-channel", site["v1"], keys=[signing_key[1]])])
    bundle = Path(create_bundle(tmp_path / "b.tar", settings=made, backends=["cpu"]).path)
    site["server"].close()  # no network from here on
    target = _settings(tmp_path, "target", offline=True, trusted_keys=[signing_key[1]])
    summary = install_bundle(bundle, settings=target, verifier=import_verifier())
    assert summary.changed

    env = cli_env(tmp_path / "target" / "home", tmp_path / "target" / "cache",
                  {"ACCELSTACK_CONFIG_DIR": str(tmp_path / "target" / "config"), "ACCELSTACK_OFFLINE": "1",
                   "PIP_INDEX_URL": "http://127.0.0.1:9/simple"})
    proc = run_cli(["upgrade", "--json"], env)  # no --trusted-key, no channel configured here
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = result_of(proc)
    assert out["changed"] is False and out["runtime"] == summary.runtime and out["built_locally"] is False
    assert "no channel" not in proc.stdout + proc.stderr
    status = result_of(run_cli(["status", "--json"], env))["stacks"]
    ggml = next(st for st in status if st["stack"] == "ggml")
    assert ggml["healthy"] is True and ggml["problems"] == [], ggml


def test_a_moved_build_cache_is_still_a_cache(tmp_path, ggml_cpu_build, monkeypatch):
    key = ggml_cpu_build.key
    old = next(p for p in Path(ggml_cpu_build.wheel).parents if p.name == key).parent
    moved = tmp_path / "moved-builds"
    (moved / "sdist").mkdir(parents=True)
    for f in (old / "sdist").glob("*.tar.gz*"):
        shutil.copy2(f, moved / "sdist" / f.name)
    shutil.copytree(old / ggml_cpu_build.key, moved / ggml_cpu_build.key)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # a miss fails at once instead of compiling
    s = _settings(tmp_path, build_cache=moved)
    again = build_ggml("cpu", s)
    inside = Path(ggml_cpu_build.wheel).relative_to(old)
    assert again.cache_hit and Path(again.wheel) == moved / inside
    # a record written now names its wheel relative to the cache root, so the next move keeps it too
    write_record(moved / again.key / "build.json", again, root=moved)
    assert not Path(json.loads((moved / again.key / "build.json").read_text())["wheel"]).is_absolute()
    fresh = tmp_path / "fresh-builds"
    shutil.move(str(moved), str(fresh))
    third = read_record(fresh / again.key / "build.json")
    assert third is not None and Path(third.wheel) == fresh / inside
