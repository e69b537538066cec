"""Issue 29: after `cache purge all`, `repair` restores a locally built runtime the way install made
it, by building it again (the purge's help promises a later repair "downloads, builds ... again
what it needs"), instead of failing because the wheel's ``file:`` URL in the build cache is gone.

The builder is injected (``Services(builder=...)``), as an app may: it hands back the real CPU build
the test session compiled, so the rebuild is observed without a four-minute compile; the purge, the
install, the damage and the repair are real.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, List, Tuple

import pytest

import accelstack
from accelstack import Services
from accelstack.artifacts.errors import OfflineError
from accelstack.core import import_verifier
from accelstack.core.caches import CACHES, purge
from accelstack.errors import AccelstackError
from accelstack.settings import Settings


def _settings(tmp_path: Path, **kw: Any) -> Settings:
    return Settings.resolve(home=tmp_path / "home", cache=tmp_path / "cache", build_cache=tmp_path / "builds",
                            config_dir=tmp_path / "config", manifests=[], **kw)


class Builder:
    """Each call 'compiles' by copying the session's real CPU wheel to a fresh folder, as a rebuild
    writes a new wheel; it records the variant and architectures it was asked for."""

    def __init__(self, build: Any, root: Path) -> None:
        self.build, self.root, self.asked = build, root, []  # type: Tuple[Any, Path, List[Tuple[str, Any]]]

    def __call__(self, variant: str, settings: Settings, **kw: Any) -> Any:
        self.asked.append((variant, kw.get("cuda_archs")))
        out = self.root / f"build-{len(self.asked)}"
        out.mkdir(parents=True)
        wheel = out / Path(self.build.wheel).name
        shutil.copyfile(self.build.wheel, wheel)
        return type(self.build)(**{**self.build.__dict__, "wheel": str(wheel)})


def _install_and_damage(tmp_path: Path, builder: Builder, s: Settings) -> Tuple[Any, Path]:
    summary = accelstack.install(settings=s, services=Services(builder=builder), verifier=import_verifier())
    assert summary.built_locally and summary.receipt is not None
    root = s.home / summary.receipt.path
    lib = max((root / f.path for f in summary.receipt.files), key=lambda p: p.stat().st_size)  # the native library
    with open(lib, "r+b") as f:
        f.seek(4096)
        f.write(b"\0\0\0\0")
    shutil.rmtree(builder.root)  # the wheel the receipt's file: URL names is gone, as after a purge
    purge(list(CACHES), s)  # what `cache purge all` removes
    return summary, lib


def test_repair_after_cache_purge_all_rebuilds_a_locally_built_runtime(ggml_cpu_build, tmp_path):
    s = _settings(tmp_path)
    builder = Builder(ggml_cpu_build, tmp_path / "built")
    summary, lib = _install_and_damage(tmp_path, builder, s)
    rel = lib.relative_to(s.home / summary.receipt.path).as_posix()
    events: List[Any] = []
    report = accelstack.repair(settings=s, services=Services(builder=builder), verifier=import_verifier(),
                               on_progress=events.append)
    assert rel in report.fixed and not report.unrepairable, report
    assert len(builder.asked) == 2 and builder.asked[1] == builder.asked[0]  # the same variant, the same architectures
    assert any("building it again" in (e.message or "") for e in events), [e.message for e in events]
    assert report.verification.ok


def test_repair_offline_after_a_purge_says_the_source_is_needed(ggml_cpu_build, tmp_path):
    s = _settings(tmp_path)
    builder = Builder(ggml_cpu_build, tmp_path / "built")
    _install_and_damage(tmp_path, builder, s)
    offline = _settings(tmp_path, offline=True)
    with pytest.raises(AccelstackError) as err:
        accelstack.repair(settings=offline, services=Services(builder=builder), verifier=import_verifier())
    assert len(builder.asked) == 1  # nothing was built: the source is not in the (purged) build cache
    assert "offline" in err.value.message and "stable-diffusion-cpp-python" in err.value.message, err.value.message
    assert not isinstance(err.value, OfflineError) or err.value.hint
