"""The Vulkan variant end to end on lavapipe (Mesa's conformant Vulkan driver on the CPU): the cached
``vulkan`` build and the CPU build published through a signed manifest on 127.0.0.1, planned with
``--backend vulkan`` from this machine's live report (lavapipe is a CPU-type device, so only a forced
backend picks it, with ``GGML_VK_VISIBLE_DEVICES`` naming it), installed, and verified by the engine
with the real CPU-vs-GPU agreement check against the CPU build: the device reported is the one
stable-diffusion.cpp initialized (``Vulkan0``, llvmpipe), never the CPU.

Which lavapipe: the system's. Debian 12's (Mesa 22.3.6) corrupts its heap in the first UNet graph
(an expected failure, below). With ``ACCELSTACK_NEWER_LAVAPIPE=1`` (scripts/test.sh, and so ``.ci/run``,
set it unless it is 0; scripts/setup-vulkan.sh then has scripts/vulkan-lavapipe.sh extract
bookworm-backports' Mesa 25 lavapipe into ``<build cache>/vulkan-lavapipe/<version>/``) the Vulkan
loader is pointed at that one through its folder's ``env`` file (``VK_DRIVER_FILES``/``VK_ICD_FILENAMES``,
``MESA_SHADER_CACHE_DIR`` beside it, and ``LD_LIBRARY_PATH`` for a libLLVM of its own). There the
install+verify test PASSES, with flash attention off: llvmpipe's LLVM 15 compiles ggml's
flash-attention shader for more than 25 minutes, and without it the test took 9 min with a cold shader
cache (docs/engine.md).

A 64x64 one-step generation takes over a minute on lavapipe, so the module runs ONE verify (two
Vulkan generations: the determinism check needs both) plus a load-only check that fails fast.

Skipped, with the reason, only outside CI when the Vulkan loader or lavapipe is missing, or when the
vulkan build is neither cached nor buildable here (no glslc, no Vulkan 1.4 headers: scripts/setup-vulkan.sh
installs all of them, and ``.ci/run`` runs it), or with ``ACCELSTACK_SKIP_VULKAN_BUILD=1``; otherwise the
module builds the variant when the cache lacks it (about 5 minutes), as tests/publisher/test_vulkan_build.py
does in the same run. In CI (``CI`` set) it always runs.
"""
from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Dict

import pytest

from accelstack.engine import Runtime
from accelstack.engine.config import EngineOptions
from accelstack.engine.verification.probe_verify import verify
from accelstack.engine.worker.ggml_backend import initialized_backends
from accelstack.settings import Settings

CI = bool(os.environ.get("CI"))
LOADER = any(Path(d, "libvulkan.so.1").exists() for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"))
SYSTEM_LAVAPIPE = any(Path(d, f"lvp_icd.{a}.json").exists() for d in ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d")
                      for a in ("x86_64", "aarch64"))


def newer_lavapipe_env() -> Dict[str, str]:
    """The environment that points the Vulkan loader at the newest lavapipe scripts/vulkan-lavapipe.sh
    extracted into the build cache (its ``env`` file), or {} to use the system's (always, unless
    ACCELSTACK_NEWER_LAVAPIPE=1)."""
    from accelstack.publisher.build_cache import build_cache_dir

    if os.environ.get("ACCELSTACK_NEWER_LAVAPIPE") != "1":
        return {}

    def version(p: Path):
        return [int(n) for n in re.findall(r"\d+", p.name)]

    for folder in sorted(Path(build_cache_dir(Settings.resolve()), "vulkan-lavapipe").glob("*"), key=version, reverse=True):
        try:
            lines = (folder / "env").read_text(encoding="utf-8").splitlines()
        except OSError:
            continue
        env = dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))
        if Path(env.get("VK_DRIVER_FILES", "")).is_file():
            return env
    return {}


@pytest.fixture
def lavapipe(monkeypatch) -> Dict[str, str]:
    """This process (and the workers and detection probes it starts) on the newer lavapipe when there
    is one; returns what was set."""
    env = newer_lavapipe_env()
    for key, value in env.items():
        if key == "LD_LIBRARY_PATH" and os.environ.get(key):
            value = os.pathsep.join([value, os.environ[key]])
        monkeypatch.setenv(key, value)
    return env


def _cached_vulkan_build() -> bool:
    """A vulkan build is in the build cache (looked up by its record: no compile is started here)."""
    from accelstack.publisher.build_cache import build_cache_dir

    for record in Path(build_cache_dir(Settings.resolve())).glob("*/build.json"):
        try:
            data = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if data.get("variant") == "vulkan" and Path(str(data.get("wheel", ""))).is_file():
            return True
    return False


def _missing() -> str:
    if sys.platform != "linux":
        return "the lavapipe setup is Linux's"
    if not (LOADER and (SYSTEM_LAVAPIPE or newer_lavapipe_env())):
        return "no Vulkan loader with Mesa's lavapipe here (scripts/setup-vulkan.sh installs them)"
    if os.environ.get("ACCELSTACK_SKIP_VULKAN_BUILD"):
        return "ACCELSTACK_SKIP_VULKAN_BUILD is set"
    if _cached_vulkan_build():
        return ""
    from accelstack.publisher.build import vulkan_include_dir
    from accelstack.publisher.build_cache import build_cache_dir
    from accelstack.publisher.variants import missing_toolchain

    missing = missing_toolchain("vulkan")
    if vulkan_include_dir(build_cache_dir(Settings.resolve())) is None and not Path("/usr/include/vulkan/vulkan.hpp").exists():
        missing.append("the Vulkan 1.4 headers")
    if missing:
        return f"no cached vulkan build, and it cannot be built here: {', '.join(missing)} not found (scripts/setup-vulkan.sh)"
    return ""


# -- the log line the engine reads its device from (no runtime needed) ---------------------------------
def test_the_initialized_backend_is_read_from_stable_diffusion_cpps_log():
    lines = ["Found 2 backend devices:", "#0: Vulkan0", "#1: CPU", "Initializing backend: Vulkan0", "loading model from 'x'"]
    assert initialized_backends(lines) == ["Vulkan0"]
    assert initialized_backends(["ggml_vulkan: No devices found.", "Initializing backend: CPU"]) == ["CPU"]
    assert initialized_backends(["nothing here"]) == []


# -- the real thing ------------------------------------------------------------------------------------------
real = pytest.mark.skipif(bool(_missing()) and not CI, reason=_missing() or "runs")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """The cpu and vulkan builds on a loopback server with a signed manifest: (manifest URL, public key,
    and each build installed into a directory: CPU, Vulkan)."""
    from accelstack.manifests.signing import generate_keypair
    from accelstack.publisher.build import build_ggml
    from accelstack.publisher.publish import build_manifest, write_signed_manifest
    from accelstack.serde import to_dict

    site = tmp_path_factory.mktemp("vulkan-site")
    builds = {variant: build_ggml(variant, Settings.resolve()) for variant in ("cpu", "vulkan")}  # cache lookups (CI: builds)
    for variant, build in builds.items():
        wheel = Path(build.wheel)
        (site / variant).mkdir()
        shutil.copyfile(wheel, site / variant / wheel.name)
        record = {**to_dict(build), "wheel": str(site / variant / wheel.name)}
        (site / variant / f"{wheel.name}.build.json").write_text(json.dumps(record))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    private_pem, public_b64 = generate_keypair()
    write_signed_manifest(site, build_manifest(site, url, source="vulkan-e2e", version=1), private_pem)
    dirs = {}
    for variant, build in builds.items():
        dirs[variant] = tmp_path_factory.mktemp(f"ggml-{variant}-runtime")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                        "--no-index", "--target", str(dirs[variant]), build.wheel], check=True)
    yield f"{url}/ggml-manifest.json", public_b64, dirs["cpu"], dirs["vulkan"]
    server.shutdown()
    server.server_close()


def _lavapipe_heap_bug(report, driver_info: str) -> bool:
    """The crash seen here on every plain run (2026-12-01): Mesa 22.3.6's lavapipe corrupts the heap
    during the first UNet graph ("malloc(): unsorted double linked list corrupted", SIGABRT, or SIGSEGV
    without flash attention) while ggml-vulkan compiles a pipeline on another thread; it is independent
    of threads, flash attention, offloading, buffer sizes, ggml's fusion/async switches and the shader
    cache, and one run under gdb completed. Newer Mesa must not hit it: there the test must pass."""
    return ("Mesa 22." in driver_info and "worker died during generation" in report.reason
            and "killed by SIG" in report.reason)


@real
def test_install_backend_vulkan_verifies_on_lavapipe_against_the_cpu_build(published, probe_model, tmp_path, lavapipe):
    from accelstack import core
    from accelstack.core.detection import detect
    from accelstack.core.verifiers import default_verifier
    from accelstack.installer.errors import VerifyFailed
    from accelstack.settings import Settings

    url, key, cpu_dir, _vk_dir = published
    s = Settings.resolve(home=tmp_path / "home", cache=tmp_path / "cache", probe_cache=Path(probe_model.path).parent,
                         manifests=[url], trusted_keys=[key], allow_build=False)
    report = detect(settings=s)
    device = next(d for d in report.vulkan_devices if d.type == "cpu")
    if lavapipe:  # the loader was pointed at the newer lavapipe: it is the one detection sees
        assert len(report.vulkan_devices) == 1 and "Mesa 22." not in device.driver_info, device.driver_info
    # Flash attention off, for both builds: llvmpipe compiles ggml-vulkan's flash-attention shader with
    # LLVM 15 for more than 25 minutes (still compiling after 900 s on an idle machine), while without it
    # a cold first generation, every other shader compiled, took 491 s here (docs/engine.md). Every other
    # kernel of the probe still runs on lavapipe and is compared with the CPU build.
    verifier = default_verifier(s, cpu_runtime=Runtime(path=cpu_dir, backend="cpu"),
                                options=EngineOptions(flash_attention=False))
    try:
        summary = core.install(None, stack="ggml", backend="vulkan", report=report, settings=s, verifier=verifier)
    except VerifyFailed as exc:
        v = exc.report
        # whatever happened next, the runtime was loaded onto lavapipe as the plan said
        assert [(c.name, c.ok) for c in v.checks][:2] == [("load", True), ("device", True)], v.reason
        assert v.device is not None and "llvmpipe" in v.device.description
        if _lavapipe_heap_bug(v, device.driver_info):
            pytest.xfail(f"{device.driver_info} lavapipe crashed in the UNet graph: {v.reason}")
        raise

    plan, receipt = summary.plan, summary.receipt
    assert plan.backend == "vulkan" and "CPU-type device" in plan.device_reason
    assert receipt is not None and receipt.backend == "vulkan"
    assert receipt.env == {"GGML_VK_VISIBLE_DEVICES": str(device.index)}
    v = receipt.verification
    assert v.ok, f"{v.reason}\n" + "\n".join(v.log_tail)
    assert v.device is not None and v.device.name == "Vulkan0" and "llvmpipe" in v.device.description
    checks = {c.name: c for c in v.checks}
    assert checks["device"].ok and checks["deterministic"].ok and checks["cpu-match"].ok
    assert v.cpu_mean_diff is not None and v.cpu_max_diff is not None
    assert 0 < v.cpu_max_diff, "a Vulkan image identical to the CPU's would mean it ran on the CPU"
    print(f"\nlavapipe ({device.driver_info}) verify: {v.total_seconds:.1f} s, vs CPU mean {v.cpu_mean_diff}, "
          f"max {v.cpu_max_diff}")


@real
def test_verify_family_flux_on_lavapipe_against_the_cpu_build(published, tmp_path, monkeypatch, lavapipe):
    """``verify --family flux`` on the vulkan build: the reduced Flux probe (rotary attention, RMS q/k
    norms, the 16-channel VAE) loaded onto lavapipe, and its image compared with the CPU build's (the
    per-family cpu-match check). Flash attention off, as above (llvmpipe's shader compile). The probe
    is 128 M parameters, most of them CLIP-L: far smaller than the SD 1.x probe above."""
    from accelstack.core.detection import detect

    _url, _key, cpu_dir, vk_dir = published
    device = next(d for d in detect().vulkan_devices if d.type == "cpu")
    monkeypatch.setenv("GGML_VK_VISIBLE_DEVICES", str(device.index))
    report = verify(Runtime(path=vk_dir, backend="vulkan"), output=tmp_path / "flux.png", probe_cache=tmp_path / "probe",
                    records=None, cpu_runtime=Runtime(path=cpu_dir, backend="cpu"), families=["flux"],
                    options=EngineOptions(flash_attention=False), keep_probe=False)
    if not report.ok and _lavapipe_heap_bug(report, device.driver_info):
        pytest.xfail(f"{device.driver_info} lavapipe crashed: {report.reason}")
    assert report.ok, f"{report.reason}\n" + "\n".join(report.log_tail)
    checks = {c.name: c for c in report.checks}
    assert [n for n in checks] == ["flux:load", "flux:device", "flux:family", "flux:size", "flux:pixels",
                                   "flux:deterministic", "flux:cpu-match"]
    assert report.device is not None and report.device.name == "Vulkan0" and "llvmpipe" in report.device.description
    assert report.cpu_max_diff is not None and report.cpu_max_diff > 0, "identical to the CPU's: it ran on the CPU"
    print(f"\nlavapipe ({device.driver_info}) verify --family flux: {report.total_seconds:.1f} s, "
          f"vs CPU mean {report.cpu_mean_diff}, max {report.cpu_max_diff}")


@real
def test_generate_runs_on_lavapipe_through_the_cli(published, tmp_path, lavapipe):
    """`accelstack generate --backend vulkan` on the vulkan build, with GGML_VK_VISIBLE_DEVICES naming
    lavapipe: the image is made on Vulkan0 (llvmpipe), not on the CPU backend, and the JSON result says
    so. The model is the reduced Flux probe (128 M parameters, cfg 1: one pass a step), not the SD 1.x
    probe: what this asserts is the command's path to the device and its report, whatever the model, and
    the SD 1.x UNet on lavapipe is the install test's (two generations, compared with the CPU build's).
    With the SD 1.x probe it was the module's second-longest test (79 s of a full run: 42.7 s generating)."""
    from accelstack.core.detection import detect
    from accelstack.engine.probes.family_files import ensure_family_probe
    from tests.cli_helpers import result_of, run_cli

    _url, _key, _cpu_dir, vk_dir = published
    device = next(d for d in detect().vulkan_devices if d.type == "cpu")
    flux = ensure_family_probe("flux", 7, tmp_path / "probe", keep=True)
    out = tmp_path / "lavapipe.png"
    code, stdout, stderr = run_cli(
        ["generate", "--runtime", vk_dir, "--backend", "vulkan", "-m", flux.model, "-p", "accelstack probe",
         "-W", "64", "-H", "64", "--steps", "1", "--cfg-scale", "1", "--seed", "42", "--no-flash-attention", "-o", out,
         "--json"],
        env={"GGML_VK_VISIBLE_DEVICES": str(device.index), "ACCELSTACK_HOME": str(tmp_path / "home"),
             "ACCELSTACK_CACHE": str(tmp_path / "cache"), "ACCELSTACK_CONFIG": str(tmp_path / "none.yaml")},
        timeout=1800)
    if code != 0 and "Mesa 22." in device.driver_info and "killed by SIG" in stdout + stderr:
        pytest.xfail(f"{device.driver_info} lavapipe crashed in the UNet graph (see the verify test)")
    assert code == 0, stdout[-2000:] + stderr[-2000:]
    result = result_of(stdout)
    assert result["device"]["name"] == "Vulkan0" and "llvmpipe" in result["device"]["description"]
    assert result["width"] == result["height"] == 64 and Path(result["images"][0]).is_file()
    assert Path(result["images"][0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"\nlavapipe generate: {result['generate_seconds']:.1f} s, {result['total_seconds']:.1f} s in all")


@real
def test_a_vulkan_build_that_skips_lavapipe_falls_back_to_cpu_and_fails(published, probe_model, tmp_path, monkeypatch,
                                                                        lavapipe):
    """Without GGML_VK_VISIBLE_DEVICES ggml-vulkan skips lavapipe, stable-diffusion.cpp runs on its CPU
    backend, and verify says so right after the load, before any generation."""
    _url, _key, _cpu_dir, vk_dir = published
    monkeypatch.delenv("GGML_VK_VISIBLE_DEVICES", raising=False)
    report = verify(Runtime(path=vk_dir, backend="vulkan"), output=tmp_path / "fallback.png",
                    probe_cache=Path(probe_model.path).parent, records=Settings.resolve().verify_dir)
    assert not report.ok and report.generate_seconds is None
    assert report.reason.startswith("the vulkan runtime ran on the CPU: no Vulkan device was initialized")
    assert "unless GGML_VK_VISIBLE_DEVICES names them" in report.reason
    assert report.device is not None and report.device.name == "CPU"
    assert "ggml_vulkan: No devices found" in report.checks[-1].detail and report.checks[-1].name == "device"


@real
def test_install_falls_back_to_the_cpu_build_when_the_vulkan_build_fails_verify(published, probe_model, tmp_path, monkeypatch):
    """lavapipe shown to the planner as an integrated GPU with a usable Vulkan driver, so the plan
    chooses the vulkan build without being forced; the Vulkan loader then finds no driver (it is pointed
    at a file that does not exist), the vulkan build runs on its CPU backend, verify fails it, and
    install lands on the CPU build, saying why in the result and in the receipt."""
    from accelstack import core
    from accelstack.core.detection import detect
    from accelstack.hardware.report import GPU, AcceleratorAPI
    from accelstack.installer.home import Home
    from accelstack.settings import Settings

    url, key, _cpu_dir, _vk_dir = published
    s = Settings.resolve(home=tmp_path / "home", cache=tmp_path / "cache", probe_cache=Path(probe_model.path).parent,
                         manifests=[url], trusted_keys=[key], allow_build=False)
    report = detect(settings=s)
    lvp = next(d for d in report.vulkan_devices if d.type == "cpu")
    report.gpus = [GPU(index=0, vendor="intel", name="Intel UHD Graphics (lavapipe here)", kind="integrated")]
    report.apis.append(AcceleratorAPI(name="vulkan", usable=True, version=report.vulkan_loader_version, gpus=[0]))
    lvp.type, lvp.gpu = "integrated", 0
    for var in ("VK_ICD_FILENAMES", "VK_DRIVER_FILES"):
        monkeypatch.setenv(var, str(tmp_path / "no-driver.json"))

    summary = core.install(None, stack="ggml", report=report, settings=s)  # what `accelstack install` calls
    assert core.install(None, stack="ggml", report=report, settings=s).changed is False  # a second run: the CPU build stays

    assert summary.plan.backend == "cpu" and summary.receipt is not None and summary.receipt.verification.ok
    why = [n for n in summary.notes if "(vulkan) was abandoned: it failed verify on this machine: " in n]
    assert len(why) == 1, summary.notes
    assert "the vulkan runtime ran on the CPU: no Vulkan device was initialized" in why[0], why[0]
    print("\nfallback:", why[0])
    home = Home(s.home)
    receipt = home.read_receipt(home.read_active().active["ggml"])
    assert receipt.backend == "cpu" and why[0] in receipt.plan.notes
    assert [p.name for p in home.runtimes("ggml").iterdir()] == [receipt.id]  # the vulkan try was undone
