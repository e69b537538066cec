"""`accelstack doctor`, through the real command: every section, where each path came from, a broken
installation reported (never a failure), nothing written, and the --bundle archive for bug reports."""
from __future__ import annotations

import json
import tarfile
import zipfile
from pathlib import Path
from typing import Dict

from cli_helpers import result_of, run_cli

SECTIONS = {"accelstack", "paths", "channels", "trusted_keys", "runtimes", "caches", "toolchain", "can_build",
            "hardware", "hardware_problems", "problems", "seconds", "ok"}


def _env(tmp_path: Path) -> Dict[str, str]:
    return {"ACCELSTACK_CACHE": str(tmp_path / "cache"), "ACCELSTACK_HOME": str(tmp_path / "home"),
            "ACCELSTACK_CONFIG_DIR": str(tmp_path / "config"), "ACCELSTACK_CONFIG": str(tmp_path / "config" / "c.yaml"),
            "ACCELSTACK_BUILD_CACHE": "", "ACCELSTACK_PROBE_CACHE": str(tmp_path / "probe")}


def _snapshot(root: Path) -> Dict[str, int]:
    return {str(p.relative_to(root)): p.lstat().st_mtime_ns for p in sorted(root.rglob("*"))}


def test_report_has_every_section_and_where_each_path_came_from(tmp_path):
    rc, out, err = run_cli(["doctor", "--json"], env=_env(tmp_path))
    assert rc == 0, err
    res = result_of(out)
    report = res["report"]
    assert set(report) == SECTIONS and res["bundle"] is None
    assert report["accelstack"]["version"] and report["accelstack"]["python"]
    paths = {p["name"]: p for p in report["paths"]}
    assert paths["home"] == {"name": "home", "path": str(tmp_path / "home"), "origin": "ACCELSTACK_HOME", "exists": False}
    assert paths["cache"]["origin"] == "ACCELSTACK_CACHE"
    assert paths["probe_cache"]["origin"] == "ACCELSTACK_PROBE_CACHE"
    assert paths["build_cache"]["path"] == str(tmp_path / "cache" / "builds")  # empty variable: the default
    assert paths["build_cache"]["origin"].startswith("default")
    assert paths["state"]["path"] == str(tmp_path / "home" / "state")
    tools = {t["name"]: t for t in report["toolchain"]}
    assert set(tools) >= {"cmake", "c++ compiler", "ninja", "git", "nvcc", "glslc", "vulkaninfo", "pip"}
    assert tools["pip"]["found"] and tools["pip"]["version"].startswith("pip ")
    assert all(isinstance(v, list) for v in report["can_build"].values()) and "cpu" in report["can_build"]
    assert {c["name"] for c in report["caches"]} == {"downloads", "builds", "probe", "verify", "detect", "service", "converted"}
    assert report["hardware"]["cpu"] and report["problems"] == [] and report["runtimes"] == []
    assert not (tmp_path / "home").exists() and not (tmp_path / "cache").exists(), "doctor creates nothing"


def test_an_argument_beats_the_variable(tmp_path):
    rc, out, err = run_cli(["doctor", "--home", str(tmp_path / "other"), "--json"], env=_env(tmp_path))
    assert rc == 0, err
    paths = {p["name"]: p for p in result_of(out)["report"]["paths"]}
    assert paths["home"]["origin"] == "argument" and paths["home"]["path"] == str(tmp_path / "other")


def test_a_broken_installation_is_reported_not_fatal_and_left_untouched(tmp_path):
    from accelstack.installer.home import Home
    from accelstack.installer.records import Receipt
    from accelstack.manifests.plan import Plan

    home = Home(tmp_path / "home")
    home.ensure()
    rt = home.runtimes("ggml") / "ggml-cpu-1"
    home.write_receipt(Receipt(id="ggml-cpu-1", stack="ggml", backend="cpu", path=home.relative(rt),
                               plan=Plan(stack="ggml", summary="cpu build", backend="cpu"),
                               manifest_source="https://example.invalid/m.json", manifest_version=7))
    home.set_active("ggml", "ggml-cpu-1")  # its runtime directory was never made: files gone
    (home.receipts / "garbage.json").write_text("{not json")
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "channels.json").write_text("[1, 2")  # an unreadable channels file
    before = _snapshot(tmp_path)
    rc, out, err = run_cli(["doctor", "--json"], env=_env(tmp_path))
    assert rc == 0, err
    report = result_of(out)["report"]
    assert not report["ok"]
    ggml = next(r for r in report["runtimes"] if r["stack"] == "ggml")
    assert ggml["active"] == "ggml-cpu-1" and ggml["healthy"] is False and ggml["backend"] == "cpu"
    assert ggml["manifest_source"] == "https://example.invalid/m.json" and ggml["manifest_version"] == 7
    assert any("files are gone" in m for m in ggml["problems"])
    assert any("garbage" in m for m in ggml["problems"]), "the unreadable receipt is named"
    assert any(p.startswith("channels:") for p in report["problems"])
    assert _snapshot(tmp_path) == before, "doctor only reads"
    rc, out, err = run_cli(["doctor"], env=_env(tmp_path))
    assert rc == 0, err
    assert "NOT HEALTHY" in out and "could not read:" in out and "PROBLEMS FOUND" in out


def test_bundle_zip_holds_the_report_and_a_replayable_capture(tmp_path):
    bundle = tmp_path / "out" / "report.zip"
    rc, out, err = run_cli(["doctor", "--bundle", str(bundle), "--json"], env=_env(tmp_path))
    assert rc == 0, err
    res = result_of(out)
    assert res["bundle"] == str(bundle.resolve())
    with zipfile.ZipFile(bundle) as zf:
        names = set(zf.namelist())
        assert {"doctor.json", "doctor.txt", "capture/capture.json"} <= names
        assert json.loads(zf.read("doctor.json"))["paths"] == res["report"]["paths"]
        zf.extractall(tmp_path / "unpacked")
    assert not [p for p in bundle.parent.iterdir() if p.name != "report.zip"], "no temporary file left"
    rc, out, err = run_cli(["detect", "--replay", str(tmp_path / "unpacked" / "capture"), "--json"], env=_env(tmp_path))
    assert rc == 0, err
    assert result_of(out)["cpu"] == res["report"]["hardware"]["cpu"]


def test_bundle_tar_gz_and_the_text_says_where(tmp_path):
    bundle = tmp_path / "report.tar.gz"
    rc, out, err = run_cli(["doctor", "--bundle", str(bundle)], env=_env(tmp_path))
    assert rc == 0, err
    assert f"bundle written to {bundle.resolve()}" in out
    with tarfile.open(bundle) as tar:
        assert {"doctor.json", "doctor.txt", "capture/capture.json"} <= set(tar.getnames())


def test_help_has_a_description_and_examples():
    rc, out, _ = run_cli(["doctor", "--help"])
    assert rc == 0 and "examples:" in out and "--bundle" in out and "bug report" in out


def test_a_bad_variable_is_reported_and_the_rest_still_read(tmp_path):
    env = {**_env(tmp_path), "ACCELSTACK_OFFLINE": "maybe"}
    rc, out, err = run_cli(["doctor", "--json"], env=env)
    assert rc == 0, err
    report = result_of(out)["report"]
    assert any("ACCELSTACK_OFFLINE" in p for p in report["problems"]) and not report["ok"]
    paths = {p["name"]: p for p in report["paths"]}
    assert paths["home"]["path"] == str(tmp_path / "home") and paths["home"]["origin"] == "ACCELSTACK_HOME"
    assert report["toolchain"] and report["hardware"]


def test_a_bundle_that_cannot_be_written_is_a_usage_error(tmp_path):
    rc, out, _ = run_cli(["doctor", "--bundle", str(tmp_path), "--json"], env=_env(tmp_path))
    assert rc == 2 and "is a directory" in json.loads(out.strip().splitlines()[-1])["message"]
    blocker = tmp_path / "file"
    blocker.write_text("")
    rc, out, _ = run_cli(["doctor", "--bundle", str(blocker / "r.zip"), "--json"], env=_env(tmp_path))
    assert rc == 2 and "cannot write the bundle" in json.loads(out.strip().splitlines()[-1])["message"]


# What nvcc 12.4 prints for --version (CUDA 12.4.1), word for word: its second line is the copyright.
NVCC_VERSION = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2024 NVIDIA Corporation
Built on Thu_Mar_28_02:18:24_PDT_2024
Cuda compilation tools, release 12.4, V12.4.131
Build cuda_12.4.r12.4/compiler.34097967_0
"""


def test_nvcc_s_version_is_its_release_line_not_its_copyright(tmp_path):
    import os

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    nvcc = bin_dir / "nvcc"
    nvcc.write_text("#!/bin/sh\ncat <<'EOF'\n" + NVCC_VERSION + "EOF\n")
    nvcc.chmod(0o755)
    env = {**_env(tmp_path), "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    rc, out, err = run_cli(["doctor", "--json"], env=env)
    assert rc == 0, err
    tools = {t["name"]: t for t in result_of(out)["report"]["toolchain"]}
    assert tools["nvcc"]["path"] == str(nvcc)
    assert tools["nvcc"]["version"] == "Cuda compilation tools, release 12.4, V12.4.131"
    rc, out, err = run_cli(["doctor"], env=env)
    assert "release 12.4, V12.4.131" in out and "Copyright" not in out


def test_the_config_path_is_the_one_the_settings_use(tmp_path):
    env = {**_env(tmp_path), "ACCELSTACK_CONFIG": "relative.yaml"}
    rc, out, err = run_cli(["doctor", "--json"], env=env, cwd=tmp_path)
    assert rc == 0, err
    paths = {p["name"]: p for p in result_of(out)["report"]["paths"]}
    assert paths["config_file"]["path"] == str(tmp_path / "relative.yaml")  # where it is, not as typed
    assert paths["config_file"]["origin"] == "ACCELSTACK_CONFIG"
    assert paths["config_dir"] == {"name": "config_dir", "path": str(tmp_path / "config"), "origin": "ACCELSTACK_CONFIG_DIR",
                                   "exists": False}


def test_a_bundle_name_that_is_not_an_archive_s_is_refused_before_any_work(tmp_path):
    for name in ("report.txt", "report", "report.zip.bak"):
        rc, out, err = run_cli(["doctor", "--bundle", str(tmp_path / name), "--json"], env=_env(tmp_path))
        e = json.loads(out.strip().splitlines()[-1])
        assert rc == 2 and e["event"] == "error" and ".zip" in e["message"], (name, out)
        assert not (tmp_path / name).exists()
    rc, out, err = run_cli(["doctor", "--bundle", str(tmp_path / "r.txt")], env=_env(tmp_path))
    assert rc == 2 and "must end in .zip" in err and not out
    rc, out, _ = run_cli(["doctor", "--help"], env=_env(tmp_path))
    assert "another name is refused" in " ".join(out.split())
    bundle = tmp_path / "Report.ZIP"
    rc, out, err = run_cli(["doctor", "--bundle", str(bundle), "--json"], env=_env(tmp_path))
    assert rc == 0 and zipfile.is_zipfile(bundle), err
