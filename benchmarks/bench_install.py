"""Cold and warm ggml install vs a plain `pip install` of the same wheel, in the same run.

Serves the CPU build (built or reused from the build cache) with a signed manifest on 127.0.0.1,
then times, in fresh homes and caches:
  - cold install through the library core, split into manifests / download / stage (PyPA installer) / hash / verify
    (the cheap import check);
  - the engine's verify, which the CLI runs as its check before activating (one real generation);
  - warm no-op re-run (goal: under 0.3 s) — both in-process and as a whole `accelstack install` command;
  - baseline: `pip install --no-deps --target DIR wheel` into a fresh directory, plus the download time.
Goal: cold install within 1.5x of (plain pip + download).

    python benchmarks/bench_install.py
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    import importlib.util

    # the loopback server and publisher of the installer tests (by path: "installer" is PyPA's package)
    spec = importlib.util.spec_from_file_location("installer_test_site", Path(__file__).resolve().parents[1] / "tests" / "installer" / "conftest.py")
    assert spec is not None and spec.loader is not None
    site_mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site_mod)
    Server, publish = site_mod.Server, site_mod.publish

    import accelstack
    from accelstack.artifacts import ArtifactRef, Cache, fetch
    from accelstack.core.verifiers import default_verifier, import_verifier
    from accelstack.installer.home import Home
    from accelstack.installer.transaction import StagedRuntime
    from accelstack.manifests.signing import generate_keypair
    from accelstack.publisher.build import build_ggml
    from accelstack.settings import Settings

    build = build_ggml("cpu", Settings.resolve())
    wheel = Path(build.wheel)
    tmp = Path(tempfile.mkdtemp(prefix="bench-install-"))
    site = tmp / "site"
    site.mkdir()
    server = Server(site)
    private_pem, public_b64 = generate_keypair()
    publish(build, wheel, site, "v1", 1, private_pem, server.url)
    url = f"{server.url}/v1/ggml-manifest.json"
    s = Settings.resolve(home=tmp / "home", cache=tmp / "cache", manifests=[url], trusted_keys=[public_b64], allow_build=False)
    report = accelstack.detect(settings=s)

    # baseline: download + plain pip install into a fresh target
    t = time.perf_counter()
    fetch([ArtifactRef(wheel.name, build.sha256, build.size, [f"{server.url}/v1/{wheel.name}"])], cache=Cache(tmp / "cache-baseline"), offline=False)
    download = time.perf_counter() - t
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "--no-index",
                    "--target", str(tmp / "plain"), str(wheel)], check=True)
    plain = time.perf_counter() - t

    # the library path with the cheap import check, so the ratio compares installing with installing
    t = time.perf_counter()
    plan = accelstack.plan(report, stack="ggml", settings=s)
    cold = accelstack.install(plan, report=report, settings=s, verifier=import_verifier())
    cold_total = time.perf_counter() - t
    t = time.perf_counter()
    warm = accelstack.install(accelstack.plan(report, stack="ggml", settings=s), report=report, settings=s)
    warm_total = time.perf_counter() - t
    env = {**os.environ, "ACCELSTACK_HOME": str(s.home), "ACCELSTACK_CACHE": str(s.cache)}
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "accelstack", "install", "--no-build", "--manifest", url, "--trusted-key", public_b64],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    warm_cli = time.perf_counter() - t
    server.close()

    assert cold.receipt is not None
    t = time.perf_counter()
    staged = StagedRuntime(stack="ggml", backend="cpu", path=Home(s.home).runtime_path(cold.receipt))
    verified = default_verifier(s)(staged, lambda e: None)
    verify_s = time.perf_counter() - t

    assert cold.changed and not warm.changed
    print(f"wheel: {wheel.name} ({build.size / 1e6:.1f} MB)")
    print("cold install: " + ", ".join(f"{k} {v:.3f} s" for k, v in cold.timings.items()) + f"; total {cold_total:.3f} s")
    print(f"warm no-op re-run (in process):   {warm_total * 1000:.1f} ms  (goal < 300 ms)")
    print(f"warm no-op re-run (whole command, incl. interpreter start and detection): {warm_cli * 1000:.0f} ms")
    print(f"baseline: download {download:.3f} s + plain pip install {plain:.3f} s = {download + plain:.3f} s")
    print(f"ratio cold install / (plain pip + download): {cold_total / (download + plain):.2f}  (goal <= 1.5)")
    print(f"the default check before activation is the engine's verify (a real 64x64 generation): {verify_s:.2f} s "
          f"(load {verified.load_seconds or 0:.2f} s, step {verified.step_seconds or 0:.2f} s); measured apart from the ratio above")


if __name__ == "__main__":
    main()
