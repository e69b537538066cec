"""`verify` and `generate` end to end on the real CPU runtime, through the CLI and the library."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from accelstack.engine.png import read_png
from accelstack.engine.runtime import Runtime
from accelstack.engine.verification.probe_verify import verify
from accelstack.settings import Settings

from cli_helpers import result_of
from engine_helpers import cli_env, run_cli


def test_verify_cli_passes_on_the_cpu_runtime(cpu_runtime, cache_with_probe, tmp_path):
    out = tmp_path / "probe.png"
    res = run_cli(["verify", "--runtime", cpu_runtime.path, "--output", out, "--json"], cli_env(cache_with_probe, tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    report = result_of(res.stdout)
    assert report["verdict"] == "PASS" and report["ok"] and report["reason"] == ""
    checks = {c["name"]: c for c in report["checks"]}
    assert set(checks) == {"load", "size", "pixels", "deterministic"} and all(c["ok"] for c in checks.values())
    assert checks["deterministic"]["detail"] == "identical bytes"
    assert report["device"]["kind"] == "cpu" and report["device"]["name"]
    assert report["load_seconds"] > 0 and report["step_seconds"] > 0 and report["its_per_second"] > 0
    assert report["probe_seconds"] == 0  # the probe came from the cache
    img = read_png(out)
    assert (img.width, img.height) == (64, 64) and report["image"] == str(out)
    assert len(set(img.pixels)) > 16
    assert "Steps: 1, Sampler: euler" in img.text["parameters"] and "Seed: 42" in img.text["parameters"]


def test_verify_human_output_and_default_png(cpu_runtime, cache_with_probe, tmp_path):
    res = run_cli(["verify", "--runtime", cpu_runtime.path], cli_env(cache_with_probe, tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("PASS  cpu runtime")
    for word in ("device", "load", "it/s", "deterministic ok", "image"):
        assert word in res.stdout
    assert (cache_with_probe / "verify" / "verify-cpu.png").is_file()
    assert "repeat" not in res.stdout  # generated twice: nothing more to say
    res = run_cli(["verify", "--runtime", cpu_runtime.path], cli_env(cache_with_probe, tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "  repeat      identical bytes to this runtime's probe image of " in res.stdout  # what was compared


def test_a_gpu_runtime_that_runs_on_the_cpu_fails_with_that_reason(cpu_runtime, probe_model, tmp_path):
    # The CPU build under a GPU label initializes ggml's CPU backend, as a Vulkan build does when it
    # finds no device: a FAIL, before any generation. (The real comparison: tests/engine/verification/test_vulkan_e2e.py.)
    labelled = Runtime(path=cpu_runtime.path, backend="vulkan")
    report = verify(labelled, output=tmp_path / "v.png", cpu_runtime=cpu_runtime,
                    probe_cache=Path(probe_model.path).parent, records=Settings.resolve().verify_dir)
    assert not report.ok and report.reason.startswith("the vulkan runtime ran on the CPU: no Vulkan device was initialized")
    assert [(c.name, c.ok) for c in report.checks] == [("load", True), ("device", False)]
    assert report.device is not None and report.device.name == "CPU" and report.cpu_mean_diff is None
    assert not list(Settings.resolve().verify_dir.glob("image-*")), "only a passing verify is remembered"


def test_a_later_verify_compares_with_the_earlier_image_instead_of_generating_twice(cpu_runtime, probe_model, tmp_path):
    def run():
        events: list = []
        report = verify(cpu_runtime, output=tmp_path / "v.png", probe_cache=Path(probe_model.path).parent,
                        records=Settings.resolve().verify_dir, progress=events.append)
        assert report.ok, report.reason
        detail = next(c.detail for c in report.checks if c.name == "deterministic")
        return report, detail, {e.task for e in events if e.stage == "generate"} - {"loading the probe model"}

    first, detail, generations = run()
    assert detail == "identical bytes" and first.details["deterministic"] == {"compared_with": "second generation"}
    assert generations == {"probe generation 1 of 2", "probe generation 2 of 2 (same seed)"}
    records = list(Settings.resolve().verify_dir.glob("image-*.json"))
    assert len(records) == 1
    digest = json.loads(records[0].read_text())["sha256"]

    second, detail, generations = run()  # the same runtime, probe, request and options: one generation
    assert generations == {"probe generation"}
    assert detail.startswith("identical bytes to this runtime's probe image of ") and detail.endswith("(an earlier verify)")
    assert second.details["deterministic"]["compared_with"] == "earlier verify"
    assert second.details["deterministic"]["sha256"] == digest
    assert [c.name for c in second.checks] == [c.name for c in first.checks]

    # A record this image does not match (a new driver, say, or one written by someone else): the
    # second generation decides, as on a first run, and a pass replaces the record.
    records[0].write_text(records[0].read_text().replace(digest, "0" * 64))
    third, detail, generations = run()
    assert generations == {"probe generation", "probe generation again (same seed)"}
    assert detail.startswith("identical bytes (not those of this runtime's earlier verify")
    assert json.loads(records[0].read_text())["sha256"] == digest


def test_the_installers_verifier_keeps_records_in_its_own_settings_cache(cpu_runtime, probe_model, tmp_path):
    # An app that embeds accelstack passes its Settings: the record goes to that cache, not to the
    # one the environment names (ACCELSTACK_CACHE, this test's tmp_path/"cache").
    from accelstack.core.verifiers import default_verifier
    from accelstack.installer.transaction import StagedRuntime

    settings = Settings.resolve(cache=tmp_path / "app-cache", probe_cache=Path(probe_model.path).parent)
    check = default_verifier(settings)
    staged = StagedRuntime(stack="ggml", backend="cpu", path=Path(cpu_runtime.path))
    assert check(staged, lambda e: None).ok
    assert len(list((tmp_path / "app-cache" / "verify").glob("image-*.json"))) == 1
    assert (tmp_path / "app-cache" / "verify" / "verify-cpu.png").is_file()
    assert not list(Settings.resolve().verify_dir.glob("image-*"))
    again = check(staged, lambda e: None)  # the second check reads that record
    assert again.ok and again.details["deterministic"]["compared_with"] == "earlier verify"


def test_verify_reports_fail_with_the_reason(tmp_path, probe_model):
    pkg = tmp_path / "rt" / "stable_diffusion_cpp"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('GLIBC_2.38 not found (required by libstable-diffusion.so)')\n")
    report = verify(Runtime(tmp_path / "rt"), output=tmp_path / "x.png", probe_cache=Path(probe_model.path).parent,
                    records=Settings.resolve().verify_dir)
    assert not report.ok and report.verdict == "FAIL"
    assert "could not load the probe model" in report.reason and "GLIBC_2.38" in report.reason
    assert report.checks[0].name == "load" and not report.checks[0].ok
    assert not (tmp_path / "x.png").exists()


def _broken_runtime(root: Path, why: str) -> Path:
    pkg = root / "stable_diffusion_cpp"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"raise ImportError({why!r})\n")
    return root


def test_verify_uses_the_active_runtime_by_default(tmp_path, cache_with_probe):
    from accelstack.installer.home import Home
    from accelstack.installer.records import Receipt
    from accelstack.manifests.plan import Plan

    home = Home(tmp_path / "home")  # the home cli_env names
    home.ensure()
    rt = _broken_runtime(home.runtimes("ggml") / "ggml-cuda-1", "libcudart.so.12: cannot open shared object file")
    home.write_receipt(Receipt(id="ggml-cuda-1", stack="ggml", backend="cuda", path=home.relative(rt),
                               plan=Plan(stack="ggml", summary="cuda build", backend="cuda")))
    home.set_active("ggml", "ggml-cuda-1")
    res = run_cli(["verify", "--json"], cli_env(cache_with_probe, tmp_path))
    assert res.returncode == 1, res.stderr
    report = result_of(res.stdout)
    assert report["verdict"] == "FAIL" and report["runtime"] == str(rt) and report["backend"] == "cuda"
    assert "libcudart.so.12" in report["reason"]


def test_the_installers_check_is_verify_and_a_fail_stops_the_install(tmp_path, probe_model):
    """The installer's check is the core's default verifier (the engine's ``verify``); a runtime that
    fails it raises with the reason, is undone, and never becomes active."""
    from accelstack.core.verifiers import default_verifier
    from accelstack.errors import Action
    from accelstack.installer.errors import VerifyFailed
    from accelstack.installer.home import Home
    from accelstack.installer.transaction import StagedRuntime, install
    from accelstack.manifests.plan import Plan
    from accelstack.settings import Settings

    rt = _broken_runtime(tmp_path / "rt", "illegal instruction in libggml-cpu")
    aborted = []

    class AsStaged:  # stages nothing: the broken runtime is the staged one
        stack = "ggml"

        def stage(self, plan, source, progress):
            return StagedRuntime(stack="ggml", backend="cpu", path=rt, env={"GGML_X": "1"})

        def files(self, staged):
            return []

        def commit(self, staged, receipt):
            raise AssertionError("a runtime that failed its check was committed")

        def abort(self, staged):
            aborted.append(staged.path)

        def retire(self, old):
            raise AssertionError("nothing is retired when the check fails")

    settings = Settings.resolve(cache=tmp_path / "cache", probe_cache=Path(probe_model.path).parent)
    home = Home(tmp_path / "home")
    with pytest.raises(VerifyFailed) as err:
        install(Plan(stack="ggml", summary="cpu build", backend="cpu"), None, AsStaged(), default_verifier(settings),
                home=home, runtime_id="ggml-cpu-1")
    exc = err.value
    assert "illegal instruction" in exc.message and exc.action == Action.EXPLAIN_PLAN
    assert exc.hint and "accelstack" not in exc.hint and "--" not in exc.hint
    assert exc.report.check == "verify" and not exc.report.ok and "illegal instruction" in exc.report.reason
    assert exc.report.checks[0].name == "load" and not exc.report.checks[0].ok
    assert aborted == [rt] and home.read_active().active.get("ggml", "") == ""


def test_generate_cli_writes_pngs_with_parameters(cpu_runtime, probe_model, tmp_path):
    out = tmp_path / "img.png"
    res = run_cli(["generate", "--runtime", cpu_runtime.path, "-m", probe_model.path, "-p", "a red cube",
                   "-n", "blurry", "-W", "64", "-H", "64", "--steps", "1", "--seed", "5", "-b", "2",
                   "--cfg-scale", "5", "--sampler", "euler", "--scheduler", "discrete", "-o", out, "--json"],
                  cli_env(tmp_path / "cache", tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    report = result_of(res.stdout)
    assert report["images"] == [str(tmp_path / "img-1.png"), str(tmp_path / "img-2.png")]
    assert report["seeds"] == [5, 6] and report["sampler"] == "euler" and report["scheduler"] == "discrete"
    first, second = (read_png(p) for p in report["images"])
    assert (first.width, first.height) == (64, 64) and first.pixels != second.pixels
    params = first.text["parameters"].splitlines()
    assert params[0] == "a red cube" and params[1] == "Negative prompt: blurry"
    assert "Steps: 1, Sampler: euler, Schedule type: discrete, CFG scale: 5.0, Seed: 5, Size: 64x64" in params[2]
    assert "Seed: 6" in second.text["parameters"]
