"""The core takes its collaborators as arguments (issue 24): an app or a test installs with its own
fetcher and builder, without a loopback server and without monkeypatching anything."""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest

import accelstack
from accelstack import Services
from accelstack.artifacts.errors import FetchError
from accelstack.core import import_verifier
from accelstack.refs import ArtifactRef
from accelstack.settings import Settings

from installer_helpers import publish  # the same published layout the HTTP tests serve

BASE = "https://builds.example.invalid"  # never resolved: every byte comes from the fetcher below


class DiskFetcher:
    """Serves a published site from a directory: what an app with its own transport would pass."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.calls: List[str] = []

    def _path(self, url: str) -> Path:
        assert url.startswith(BASE + "/"), url
        return self.root / url[len(BASE) + 1:]

    def document(self, url: str) -> bytes:
        self.calls.append(url)
        p = self._path(url)
        if not p.is_file():
            raise FetchError(f"{url}: not found")
        return p.read_bytes()

    def optional_document(self, url: str) -> Optional[bytes]:
        self.calls.append(url)
        p = self._path(url)
        return p.read_bytes() if p.is_file() else None

    def files(self, refs: Sequence[ArtifactRef], *, progress=None, deep: bool = False,
              offline: Optional[bool] = None) -> Dict[str, Path]:
        out = {}
        for ref in refs:
            self.calls.append(ref.urls[0])
            p = self._path(ref.urls[0])
            assert hashlib.sha256(p.read_bytes()).hexdigest() == ref.sha256
            out[ref.sha256] = p
        return out


@pytest.fixture
def disk_site(tmp_path, ggml_cpu_build, signing_key):
    private_pem, public_b64 = signing_key
    root = tmp_path / "site"
    publish(ggml_cpu_build, Path(ggml_cpu_build.wheel), root, "v1", 1, private_pem, BASE)
    return root, public_b64


def test_an_injected_fetcher_installs_with_no_server(disk_site, tmp_path):
    root, key = disk_site
    s = Settings.resolve(home=tmp_path / "home", cache=tmp_path / "cache", manifests=[f"{BASE}/v1/ggml-manifest.json"],
                         trusted_keys=[key], allow_build=False)
    fetcher = DiskFetcher(root)
    summary = accelstack.install(settings=s, services=Services(fetcher=fetcher), verifier=import_verifier())
    assert summary.changed and summary.receipt is not None and summary.receipt.verification.ok
    assert accelstack.status(settings=s, check_upgrades=False)[0].active == summary.runtime
    assert f"{BASE}/v1/ggml-manifest.json" in fetcher.calls and f"{BASE}/v1/ggml-manifest.json.sig" in fetcher.calls
    assert any(c.endswith(".whl") for c in fetcher.calls)
    # the same install again: a no-op
    again = accelstack.install(settings=s, services=Services(fetcher=fetcher),
                               verifier=import_verifier())
    assert not again.changed and again.runtime == summary.runtime


def test_an_injected_builder_is_what_a_local_build_runs(ggml_cpu_build, tmp_path):
    """No channel and nothing published: the plan needs a build, and the builder given is called
    (here it hands back the cached CPU build) instead of compiling."""
    s = Settings.resolve(home=tmp_path / "home", cache=tmp_path / "cache", build_cache=tmp_path / "builds",
                         config_dir=tmp_path / "config")
    asked: List[str] = []
    built = tmp_path / "built"
    built.mkdir()
    wheel = built / Path(ggml_cpu_build.wheel).name
    shutil.copyfile(ggml_cpu_build.wheel, wheel)

    def builder(variant: str, settings: Settings, **kw):
        asked.append(variant)
        assert settings.build_cache == s.build_cache
        return type(ggml_cpu_build)(**{**ggml_cpu_build.__dict__, "wheel": str(wheel)})

    summary = accelstack.install(settings=s, services=Services(builder=builder), verifier=import_verifier())
    assert asked and asked[0].startswith("cpu")
    assert summary.built_locally and summary.receipt is not None


class LyingFetcher(DiskFetcher):
    """An app's fetcher that returns, for the wheel, a file other than the one the signed manifest names:
    ``how`` says which (other bytes of the same size, a truncated copy, a link to the real file, a FIFO)."""

    def __init__(self, root: Path, how: str) -> None:
        super().__init__(root)
        self.how = how

    def files(self, refs: Sequence[ArtifactRef], *, progress=None, deep: bool = False,
              offline: Optional[bool] = None) -> Dict[str, Path]:
        import os

        out = {}
        for ref in refs:
            real = self._path(ref.urls[0])
            fake = self.root / f"fetched-{self.how}-{ref.name}"
            if self.how == "other-bytes":
                data = bytearray(real.read_bytes())
                data[len(data) // 2] ^= 0xFF
                fake.write_bytes(bytes(data))
            elif self.how == "truncated":
                fake.write_bytes(real.read_bytes()[:-1])
            elif self.how == "link":
                fake.symlink_to(real)
            elif self.how == "fifo":
                os.mkfifo(fake)
            out[ref.sha256] = fake
        return out


@pytest.mark.parametrize("how,code", [("other-bytes", "hash-mismatch"), ("truncated", "size-mismatch"),
                                      ("link", "not-a-file"), ("fifo", "not-a-file")])
def test_the_core_checks_again_every_file_an_injected_fetcher_returns(disk_site, tmp_path, how, code):
    """python-tuf's Updater re-verifies whatever its fetcher returns: a fetcher is a way to the bytes, never
    a source of trust. The installer used the fetcher's paths as they were; now the core checks each file's
    type, size and sha256 against the signed manifest first, and nothing is installed."""
    root, key = disk_site
    s = Settings.resolve(home=tmp_path / "home", cache=tmp_path / "cache", manifests=[f"{BASE}/v1/ggml-manifest.json"],
                         trusted_keys=[key], allow_build=False)
    with pytest.raises(FetchError) as info:
        accelstack.install(settings=s, services=Services(fetcher=LyingFetcher(root, how)), verifier=import_verifier())
    assert info.value.code == code, (info.value.code, info.value.message)
    assert "the fetcher returned" in info.value.message
    assert not accelstack.status(settings=s, check_upgrades=False)[0].active
    assert not (tmp_path / "home" / "runtimes").exists() or not list((tmp_path / "home" / "runtimes").rglob("*.whl"))
