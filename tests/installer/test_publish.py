"""The publisher workflow through the CLI: build (cached), keygen, manifest build, verify."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from accelstack.manifests.schema import load_manifest

from installer_helpers import cli_env, result_of, run_cli


def test_build_keygen_manifest_build_verify(ggml_cpu_build, tmp_path):
    # the session's build cache (the wheel sits in <cache>/<key>/, or deeper once repackaged), so the
    # build below is a cache hit
    slot = next(d for d in Path(ggml_cpu_build.wheel).parents if d.name == ggml_cpu_build.key)
    env = cli_env(tmp_path / "home", tmp_path / "cache", {"ACCELSTACK_BUILD_CACHE": str(slot.parent)})
    site = tmp_path / "site"
    proc = run_cli(["build", "ggml", "--backend", "cpu", "--out", str(site / "cpu"), "--json"], env)
    assert proc.returncode == 0, proc.stderr
    built = result_of(proc)
    assert built["cache_hit"] is True and built["sha256"] == ggml_cpu_build.sha256
    assert "-DGGML_NATIVE=OFF" in built["cmake_args"] and "py3-none" in built["wheel"]

    assert run_cli(["manifest", "keygen", "--out", str(tmp_path / "keys" / "rel")], env).returncode == 0
    proc = run_cli(["manifest", "build", str(site), "--base-url", "https://example.org/acc", "--key",
                    str(tmp_path / "keys" / "rel.key"), "--source", "release", "--version", "7", "--json"], env)
    assert proc.returncode == 0, proc.stderr
    out = result_of(proc)
    assert out["signed"] is True and out["version"] == 7
    assert len(out["targets"]) == 1 and out["targets"][0].endswith("-cpu")

    manifest = load_manifest((site / "ggml-manifest.json").read_bytes())
    target = manifest.targets[0]
    assert target.backend == "cpu"
    assert set(target.requires.cpu_features) >= {"avx2", "fma", "f16c"}
    art = target.artifacts[0]
    assert art.sha256 == ggml_cpu_build.sha256 and art.size == ggml_cpu_build.size
    assert art.urls == [f"https://example.org/acc/cpu/{art.name}"]

    proc = run_cli(["manifest", "verify", str(site / "ggml-manifest.json"), "--key", str(tmp_path / "keys" / "rel.pub"),
                    "--only-keys"], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_manifest_build_of_an_empty_directory_says_what_to_do(tmp_path):
    env = cli_env(tmp_path / "home", tmp_path / "cache")
    (tmp_path / "empty").mkdir()
    proc = run_cli(["manifest", "build", str(tmp_path / "empty"), "--base-url", "https://x", "--version", "1"], env)
    assert proc.returncode != 0
    assert "no builds found" in proc.stderr and "build at least one variant" in proc.stderr


def _repack(src: Path, dest: Path) -> None:
    """The same wheel written again with other compression: same files, other bytes (as a signing or
    repackaging step after the build would leave it)."""
    import zipfile

    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info), compress_type=zipfile.ZIP_DEFLATED, compresslevel=1)


def test_manifest_build_hashes_the_wheel_it_publishes_not_the_build_record(ggml_cpu_build, tmp_path):
    import dataclasses
    import hashlib

    env = cli_env(tmp_path / "home", tmp_path / "cache")
    site = tmp_path / "site" / "cpu"
    site.mkdir(parents=True)
    wheel = site / Path(ggml_cpu_build.wheel).name
    _repack(Path(ggml_cpu_build.wheel), wheel)
    (site / (wheel.name + ".build.json")).write_text(json.dumps(dataclasses.asdict(ggml_cpu_build)))
    data = wheel.read_bytes()
    actual = hashlib.sha256(data).hexdigest()
    assert actual != ggml_cpu_build.sha256  # the record is stale

    assert run_cli(["manifest", "keygen", "--out", str(tmp_path / "keys" / "rel")], env).returncode == 0
    proc = run_cli(["manifest", "build", str(site.parent), "--base-url", "https://example.org/acc", "--key",
                    str(tmp_path / "keys" / "rel.key"), "--version", "3"], env)
    assert proc.returncode == 0, proc.stderr
    assert "changed since its build record" in proc.stderr  # the publisher is told
    art = load_manifest((site.parent / "ggml-manifest.json").read_bytes()).targets[0].artifacts[0]
    assert (art.sha256, art.size) == (actual, len(data))

    # unsigned again: the stale signature goes, it would not match the new manifest
    proc = run_cli(["manifest", "build", str(site.parent), "--base-url", "https://example.org/acc", "--version", "4"], env)
    assert proc.returncode == 0, proc.stderr
    assert not (site.parent / "ggml-manifest.json.sig").exists()


def test_manifest_build_refuses_a_record_that_is_not_a_build(ggml_cpu_build, tmp_path):
    env = cli_env(tmp_path / "home", tmp_path / "cache")
    site = tmp_path / "site"
    site.mkdir()
    wheel = site / Path(ggml_cpu_build.wheel).name
    wheel.write_bytes(b"PK")
    (site / (wheel.name + ".build.json")).write_text("[" * 10_000)
    proc = run_cli(["manifest", "build", str(site), "--base-url", "https://x", "--version", "1"], env)
    assert proc.returncode != 0 and "is not a build record" in proc.stderr


def test_targets_name_the_os_and_arch_of_each_build_not_of_the_publishing_machine(ggml_cpu_build, tmp_path):
    """The release workflow builds on four kinds of runner and writes the manifest on one."""
    import dataclasses

    from accelstack.publisher.publish import build_manifest

    tags = {"win_amd64": ("windows", "x86_64", "cpu"), "macosx_14_0_arm64": ("macos", "arm64", "metal"),
            "linux_aarch64": ("linux", "arm64", "vulkan"), "manylinux_2_35_x86_64": ("linux", "x86_64", "cuda")}
    for tag, (_os, _arch, variant) in tags.items():
        wheel = tmp_path / "site" / tag / f"stable_diffusion_cpp_python-0.4.7-py3-none-{tag}.whl"
        wheel.parent.mkdir(parents=True)
        wheel.write_bytes(tag.encode())
        record = dataclasses.replace(ggml_cpu_build, variant=variant, platform_tag=tag, properties={"backend": variant})
        (wheel.parent / (wheel.name + ".build.json")).write_text(json.dumps(dataclasses.asdict(record)))
    changed: list = []
    doc = build_manifest(tmp_path / "site", "https://example.org/r", source="release", version=1, changed=changed)
    got = {(t["os"], t["arch"], t["backend"]): t for t in doc["targets"]}
    assert set(got) == set(tags.values()) and len(changed) == 4
    assert "glibc" not in got[("windows", "x86_64", "cpu")]["requires"]
    assert got[("macos", "arm64", "metal")]["id"] == "macos-arm64-metal"


def test_an_arm64_build_of_the_cpu_variant_does_not_require_x86_instructions(ggml_cpu_build, tmp_path):
    import dataclasses

    from accelstack.publisher.publish import build_manifest

    for tag in ("linux_aarch64", "linux_x86_64"):
        wheel = tmp_path / "site" / tag / "cpu" / f"stable_diffusion_cpp_python-0.4.7-py3-none-{tag}.whl"
        wheel.parent.mkdir(parents=True)
        wheel.write_bytes(tag.encode())
        record = dataclasses.replace(ggml_cpu_build, platform_tag=tag)  # cpu_features avx2, fma, f16c
        (wheel.parent / (wheel.name + ".build.json")).write_text(json.dumps(dataclasses.asdict(record)))
    doc = build_manifest(tmp_path / "site", "https://x", source="release", version=1)
    got = {t["arch"]: t["requires"].get("cpu_features") for t in doc["targets"]}
    assert got["arm64"] is None and set(got["x86_64"]) >= {"avx2", "fma", "f16c"}


def test_two_builds_of_one_variant_are_told_apart_by_their_directory_and_flat_urls(ggml_cpu_build, tmp_path):
    import dataclasses

    from accelstack.publisher.publish import PublishError, build_manifest

    site = tmp_path / "site"
    for label in ("cuda12", "cuda13"):
        wheel = site / "linux-x86_64" / label / "stable_diffusion_cpp_python-0.4.7-py3-none-linux_x86_64.whl"
        wheel.parent.mkdir(parents=True)
        wheel.write_bytes(label.encode())
        record = dataclasses.replace(ggml_cpu_build, variant="cuda", properties={"backend": "cuda"})
        (wheel.parent / (wheel.name + ".build.json")).write_text(json.dumps(dataclasses.asdict(record)))
    doc = build_manifest(site, "https://github.com/o/r/releases/download/t1", source="release", version=1, flat=True)
    assert sorted(t["id"] for t in doc["targets"]) == ["linux-x86_64-cuda12", "linux-x86_64-cuda13"]
    assert doc["targets"][0]["artifacts"][0]["url"] == ("https://github.com/o/r/releases/download/t1/"
                                                        "linux-x86_64--cuda12--stable_diffusion_cpp_python-0.4.7-py3-none-linux_x86_64.whl")
    for label in ("cuda12", "cuda13"):  # neither directory names a label: both would be "cuda"
        (site / "linux-x86_64" / label).rename(site / "linux-x86_64" / f"other{label}")
    with pytest.raises(PublishError, match="would both be target"):
        build_manifest(site, "https://x", source="release", version=1)


def test_manifest_build_flat_puts_each_upload_at_top_level(ggml_cpu_build, tmp_path):
    import dataclasses

    env = cli_env(tmp_path / "home", tmp_path / "cache")
    site = tmp_path / "site"
    wheel = site / "linux-x86_64" / "cpu" / Path(ggml_cpu_build.wheel).name
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"wheel bytes")
    (wheel.parent / (wheel.name + ".build.json")).write_text(json.dumps(dataclasses.asdict(ggml_cpu_build)))
    proc = run_cli(["manifest", "build", str(site), "--base-url", "https://x/r", "--version", "1", "--flat", "--json"], env)
    assert proc.returncode == 0, proc.stderr
    assets = result_of(proc)["assets"]
    assert [Path(a).parent for a in assets] == [site, site]
    assert (site / f"linux-x86_64--cpu--{wheel.name}").read_bytes() == b"wheel bytes"
