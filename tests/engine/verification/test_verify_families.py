"""``verify --family F`` / ``--model PATH``: per-family probes on the real CPU runtime.

Each family's probe is synthesized here from a seed (no download), recognized as that family by our
``inspect_model`` and by stable-diffusion.cpp (its "Version:" log line), and generates a 64x64
one-step image that passes verify's checks. The folders follow the SD 1.x probe's rules: a kept
``<family>-f<format>-s<seed>`` entry, or one temporary folder per process with an owner, swept once
that process is gone.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from model_specs import sd2_original, sdxl_refiner, write_safetensors, z_image

from accelstack.engine.errors import InvalidRequestError
from accelstack.engine.models.inspection import inspect_model
from accelstack.engine.png import read_png
from accelstack.engine.probes.families import FAMILIES, check_families, probe_families_of
from accelstack.engine.probes.family_files import FAMILY_FORMAT_VERSION, ensure_family_probe, family_dir_name
from accelstack.engine.probes.model import DEFAULT_SEED, MARKER, OWNER, TEMP_PREFIX, WEIGHTS
from accelstack.engine.verification.probe_verify import family_output, verify

from cli_helpers import error_of, result_of
from engine_helpers import cli_env, run_cli

FAST_FAMILIES = ["flux", "chroma"]  # the non-SD1 probes: flux 2 s, chroma 10 s (two generations) on two cores


@pytest.mark.parametrize("family", FAST_FAMILIES)
def test_the_probe_is_its_family_for_inspect(family, tmp_path):
    probe = ensure_family_probe(family, 7, tmp_path, keep=True)
    assert Path(probe.path).name == f"{family}-f{FAMILY_FORMAT_VERSION}-s7" == family_dir_name(family, 7)
    found = inspect_model(probe.model)
    assert found.family == family, found.evidence
    assert found.role == "checkpoint"
    assert {p.component for p in found.parts} >= {"diffusion_model", "vae"}
    marker = json.loads((Path(probe.path) / MARKER).read_text())
    assert marker["family"] == family and marker["parameters"] == probe.parameters
    again = ensure_family_probe(family, 7, tmp_path, keep=True)
    assert again.cached and again.path == probe.path and again.size_bytes == probe.size_bytes


def test_flux_probe_is_flux_dev_with_clip_l_and_no_t5(tmp_path):
    probe = ensure_family_probe("flux", 7, tmp_path, keep=True)
    found = inspect_model(probe.model)
    assert (found.family, found.variant) == ("flux", "dev")
    assert {p.kind for p in found.parts} == {"flux", "flux-vae", "clip-l"}
    assert [c.kind for c in found.needs] == ["t5xxl"]  # stable-diffusion.cpp runs without it (zeros)
    assert probe.parameters < 140_000_000  # CLIP-L (123 M, fixed) is most of it


# The full-size or large probes, each once: (family, the kinds of its parts, the companions it still names,
# its parameter range, what stable-diffusion.cpp's "Version:" line calls it).
LARGE_PROBES = [
    # the smallest SDXL stable-diffusion.cpp loads: Vega's UNet 745 M + CLIP-G 694 M + CLIP-L 123 M
    ("sdxl", {"sdxl", "sd-vae", "clip-l", "clip-g"}, [], (1_500_000_000, 1_600_000_000), "SDXL (Vega)"),
    # the full SD 2.x UNet (1024-wide context, linear projections) 866 M + OpenCLIP-H 353 M
    ("sd2", {"sd2", "sd-vae", "openclip-h"}, [], (1_200_000_000, 1_250_000_000), "SD 2.x"),
    # one joint block 380 M + a one-layer Qwen2.5-VL text model at its real widths (778 M with the 152k x 3584
    # embedding) + Wan's decoder 73 M
    ("qwen-image", {"qwen-image", "wan-vae", "qwen2.5-vl-7b"}, [], (1_200_000_000, 1_250_000_000), "Qwen Image"),
    # SD3-medium's MMDiT (24 blocks, the least it builds) 2.08 G + CLIP-G + CLIP-L, no T5-XXL (zeros)
    ("sd3", {"sd3", "flux-vae", "clip-l", "clip-g"}, ["t5xxl"], (2_900_000_000, 2_910_000_000), "SD3.x"),
    # Z-Image's whole DiT (6.15 G, nothing read from the tensors) as Q4_0 + a one-layer Qwen3 (490 M, most of it
    # the 152k x 2560 embedding) + the quarter-width 16-channel decoder: a GGUF file of 3.7 GB
    ("z-image", {"z-image", "flux-vae", "qwen3-4b"}, [], (6_640_000_000, 6_660_000_000), "Z-Image"),
]


@pytest.mark.parametrize("family, kinds, needs, params, sdcpp", LARGE_PROBES, ids=[p[0] for p in LARGE_PROBES])
def test_a_large_probe_is_its_family_for_inspect_and_the_cpu_runtime(family, kinds, needs, params, sdcpp,
                                                                     cpu_runtime, family_probe, tmp_path):
    """Inspect names the probe its family with its parts, ``verify --model`` maps it to its own probe, the
    runtime logs the family's version, and it generates a non-constant 64x64 image. The probe inspected
    is the one verify generates with (its probe seed, DEFAULT_SEED: verify finds the kept probe in
    ``models`` as in a user's probe cache; with seed 7 here each probe was synthesized twice), and the
    probes other modules generate with too are the session's (tests/conftest.py, made once)."""
    t0 = time.perf_counter()
    probe = family_probe(family) if family in family_probe.families else ensure_family_probe(
        family, DEFAULT_SEED, tmp_path / "models", keep=True)
    synth = time.perf_counter() - t0
    models = Path(probe.path).parent
    found = inspect_model(probe.model)
    assert found.family == family and found.role == "checkpoint", found.evidence
    assert {p.kind for p in found.parts} == kinds and [c.kind for c in found.needs] == needs
    assert params[0] < probe.parameters < params[1]
    assert [(m.family, m.probe) for m in probe_families_of([probe.model])] == [(family, family)]
    t1 = time.perf_counter()
    report = verify(cpu_runtime, tmp_path / "verify-cpu.png", probe_cache=models, records=None,
                    families=[family], keep_probe=True)
    seconds = time.perf_counter() - t1
    assert report.ok, (report.reason, report.log_tail)
    assert report.probe_path == probe.path and not report.probe_temporary  # the probe inspected above, not another
    assert f"as {sdcpp} " in next(c for c in report.checks if c.name == f"{family}:family").detail
    assert report.image == str(tmp_path / f"verify-cpu-{family}.png")
    img = read_png(report.image)
    assert (img.width, img.height) == (64, 64) and len(set(img.pixels)) > 16
    one = report.details["families"][family]
    made = "made by an earlier test" if probe.cached else f"synthesis {synth:.1f} s"
    print(f"{family} probe: {made}, verify {seconds:.1f} s (load {one['load_seconds']} s, "
          f"generate {one['generate_seconds']} s), {probe.size_bytes / 1e9:.2f} GB")  # the figures the docs quote (-s)


@pytest.mark.parametrize("family", FAST_FAMILIES)
def test_verify_family_passes_on_the_cpu_runtime(family, cpu_runtime, tmp_path):
    out = tmp_path / "verify-cpu.png"
    t0 = time.perf_counter()
    report = verify(cpu_runtime, out, probe_cache=tmp_path / "probe", records=None, families=[family], keep_probe=False)
    seconds = time.perf_counter() - t0
    assert report.ok, (report.reason, report.log_tail)
    names = [c.name for c in report.checks]
    assert names == [f"{family}:{n}" for n in ("load", "family", "size", "pixels", "deterministic")]
    fam = next(c for c in report.checks if c.name == f"{family}:family")
    assert f"as {FAMILIES[family].sdcpp_version} " in fam.detail
    one = report.details["families"][family]
    assert one["ok"] and one["details"]["family"]["id"] == family
    assert report.image == str(family_output(out, family)) == str(tmp_path / f"verify-cpu-{family}.png")
    img = read_png(report.image)
    assert (img.width, img.height) == (64, 64) and len(set(img.pixels)) > 16
    assert f"accelstack {family} probe" in img.text["parameters"]
    assert not list((tmp_path / "probe").glob(f"{TEMP_PREFIX}*")), "the temporary probe is removed after"
    print(f"verify --family {family}: {seconds:.2f} s")  # the figure the closing note quotes (-s)


def test_verify_cli_family_flux_json(cpu_runtime, tmp_path):
    cache = tmp_path / "cache"
    res = run_cli(["verify", "--runtime", cpu_runtime.path, "--family", "flux", "--json"], cli_env(cache, tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    report = result_of(res.stdout)
    assert report["verdict"] == "PASS"
    assert [c["name"] for c in report["checks"]][:2] == ["flux:load", "flux:family"]
    assert report["details"]["families"]["flux"]["ok"]
    assert (cache / "verify" / "verify-cpu-flux.png").is_file()
    assert not list((cache / "probe").glob(f"{TEMP_PREFIX}*"))


def test_unknown_family_is_a_typed_error_naming_the_known_ones(cpu_runtime, tmp_path):
    with pytest.raises(InvalidRequestError) as err:
        verify(cpu_runtime, tmp_path / "v.png", probe_cache=tmp_path / "probe", records=None, families=["flux", "sdxxl"])
    assert "sdxxl" in err.value.message and all(f in err.value.hint for f in FAMILIES)
    assert not (tmp_path / "probe").exists(), "refused before any work"
    with pytest.raises(InvalidRequestError):
        check_families([])
    res = run_cli(["verify", "--runtime", cpu_runtime.path, "--family", "nope", "--json"], cli_env(tmp_path / "c", tmp_path))
    assert res.returncode == 2
    err_line = error_of(res.stdout)
    assert "nope" in err_line["message"] and "flux" in err_line["hint"]


def test_verify_model_names_the_files_family_probe(cpu_runtime, tmp_path):
    flux = ensure_family_probe("flux", 3, tmp_path / "models", keep=True)
    assert [(m.family, m.probe) for m in probe_families_of([flux.model])] == [("flux", "flux")]
    sd2 = write_safetensors(tmp_path / "sd2.safetensors", sd2_original())  # an SD 2.x checkpoint's original names
    assert [(m.family, m.probe) for m in probe_families_of([str(sd2)])] == [("sd2", "sd2")]
    zimage = write_safetensors(tmp_path / "z_image_turbo.safetensors", z_image())
    assert [(m.family, m.probe) for m in probe_families_of([str(zimage)])] == [("z-image", "z-image")]
    refiner = write_safetensors(tmp_path / "sd_xl_refiner_1.0.safetensors", sdxl_refiner())
    with pytest.raises(InvalidRequestError) as err:
        probe_families_of([flux.model, str(refiner)])
    assert "sd_xl_refiner_1.0.safetensors" in err.value.message and "no probe" in err.value.message
    res = run_cli(["verify", "--runtime", cpu_runtime.path, "--model", flux.model, "--json"],
                  cli_env(tmp_path / "cache", tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    report = result_of(res.stdout)
    assert report["models"][0]["probe"] == "flux" and "not loaded" in report["models"][0]["statement"]
    assert list(report["details"]["families"]) == ["flux"]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_family_folders_follow_the_probe_sweep_and_owner_rules(tmp_path):
    import socket

    root = tmp_path / "probe"
    root.mkdir()
    dead = root / f"{TEMP_PREFIX}{family_dir_name('flux', 5)}-dead"
    dead.mkdir()
    (dead / OWNER).write_text(json.dumps({"pid": _dead_pid(), "host": socket.gethostname(), "created": 0}))
    alive = root / f"{TEMP_PREFIX}{family_dir_name('flux', 5)}-alive"
    alive.mkdir()
    (alive / OWNER).write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname(), "created": 0}))
    probe = ensure_family_probe("flux", 5, root)
    assert probe.temporary and Path(probe.path).name.startswith(f"{TEMP_PREFIX}flux-f{FAMILY_FORMAT_VERSION}-s5-")
    assert not dead.exists(), "a gone process's family probe is swept"
    assert alive.exists(), "a running process's is not"
    owner = json.loads((Path(probe.path) / OWNER).read_text())
    assert owner["pid"] == os.getpid()
    assert (Path(probe.path) / WEIGHTS).is_file() and (Path(probe.path) / MARKER).is_file()
    same = ensure_family_probe("flux", 5, root)
    assert same.path == probe.path and same.cached, "one temporary probe per process"
    probe.release()
    assert not Path(probe.path).exists()


def test_the_probe_synthesis_deletes_only_its_own_folders(tmp_path):
    """A probe cache pointed at a folder a person uses (issue 47): a ``.tmp-…`` folder with no owner
    record, however old, and a folder with the kept probe's name but no probe marker are theirs;
    the sweep and the kept probe's rename leave them and what is in them."""
    root = tmp_path / "probe"
    theirs = root / f"{TEMP_PREFIX}{family_dir_name('flux', 5)}-mine"
    (theirs / "notes").mkdir(parents=True)
    (theirs / "notes" / "a.txt").write_text("mine")
    os.utime(theirs, (1, 1))  # older than any unowned temporary folder is kept
    kept = root / family_dir_name("flux", 5)
    kept.mkdir()
    (kept / "photo.jpg").write_bytes(b"mine")
    probe = ensure_family_probe("flux", 5, root)
    probe.release()
    assert (theirs / "notes" / "a.txt").read_text() == "mine"
    probe = ensure_family_probe("flux", 5, root, keep=True)
    assert (kept / "photo.jpg").read_bytes() == b"mine"
    assert (theirs / "notes" / "a.txt").read_text() == "mine"
    assert Path(probe.path) != kept and (Path(probe.path) / MARKER).is_file()
    probe.release()


def test_a_family_image_never_replaces_a_file_verify_did_not_write(cpu_runtime, tmp_path):
    """`verify --family F -o x.png` writes x-F.png, a name the user did not give: a file of theirs
    there is refused before any work (exit 2, output-path), never replaced (issue 47); a probe image
    an earlier verify wrote there is replaced, as the default verify-<backend>-F.png is."""
    mine = tmp_path / "x-flux.png"
    mine.write_bytes(b"my picture")
    res = run_cli(["verify", "--runtime", cpu_runtime.path, "--family", "flux", "-o", tmp_path / "x.png", "--json"],
                  cli_env(tmp_path / "cache", tmp_path))
    assert res.returncode == 2, res.stdout + res.stderr
    err = error_of(res.stdout)
    assert err["code"] == "output-path" and str(mine) in err["message"], err
    assert mine.read_bytes() == b"my picture" and not (tmp_path / "x.png").exists()
