"""Cold and warm ggml install vs a plain `pip install` of the same wheel, in the same run.

Serves the CPU build (built or reused from the build cache) with a signed manifest on 127.0.0.1,
then times, in fresh homes and caches:
  - cold install, split into plan / fetch / unpack (pip --target) / hash / check (the import check);
  - the engine's verify, which the CLI runs as its check before activating (one real generation);
  - warm no-op re-run (goal: under 0.3 s) — both in-process and as a whole `accelstack install` command;
  - baseline: `pip install --no-deps --target DIR wheel` into a fresh directory, plus the download time.
Goal: cold install within 1.5x of (plain pip + download).

    python benchmarks/bench_install.py
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> None:
    from accelstack.artifacts import fetch
    from accelstack.detect import detect
    from accelstack.detect.system import LiveSystem
    from accelstack.installer import flow
    from accelstack.publisher.build import build_ggml
    from accelstack.installer.state import Home
    from accelstack.manifests.plan import Request
    from accelstack.manifests.signing import generate_keypair
    from installer.conftest import Server, publish  # noqa: E402

    build = build_ggml("cpu")
    wheel = Path(build.wheel)
    tmp = Path(tempfile.mkdtemp(prefix="bench-install-"))
    site = tmp / "site"
    site.mkdir()
    server = Server(site)
    private_pem, public_b64 = generate_keypair()
    publish(build, wheel, site, "v1", 1, private_pem, server.url)
    url = f"{server.url}/v1/ggml-manifest.json"
    report = detect(LiveSystem())
    opts = flow.ManifestOptions(urls=[url], extra_keys=[public_b64], allow_build=False)

    # baseline: download + plain pip install into a fresh target
    t = time.perf_counter()
    from accelstack.artifacts import ArtifactRef

    fetch([ArtifactRef(wheel.name, build.sha256, build.size, [f"{server.url}/v1/{wheel.name}"])], cache=tmp / "cache-baseline")
    download = time.perf_counter() - t
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "--no-index",
                    "--target", str(tmp / "plain"), str(wheel)], check=True)
    plain = time.perf_counter() - t

    home = Home(tmp / "home")
    import os

    os.environ["ACCELSTACK_CACHE"] = str(tmp / "cache")
    t = time.perf_counter()
    cold = flow.install(report, Request(stack="ggml"), opts, home)
    cold_total = time.perf_counter() - t
    t = time.perf_counter()
    warm = flow.install(report, Request(stack="ggml"), opts, home)
    warm_total = time.perf_counter() - t
    env = {**os.environ, "ACCELSTACK_HOME": str(home.root)}
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "accelstack", "install", "--no-build", "--manifest", url, "--trusted-key", public_b64],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    warm_cli = time.perf_counter() - t
    server.close()
    from accelstack.engine.verify import runtime_check

    t = time.perf_counter()
    verified = runtime_check(Path(cold.receipt.path), {}, "cpu")
    verify_s = time.perf_counter() - t

    assert cold.changed and not warm.changed
    print(f"wheel: {wheel.name} ({build.size / 1e6:.1f} MB)")
    print("cold install: " + ", ".join(f"{k} {v:.3f} s" for k, v in cold.timings.items()) + f"; total {cold_total:.3f} s")
    print(f"warm no-op re-run (in process):   {warm_total * 1000:.1f} ms  (goal < 300 ms)")
    print(f"warm no-op re-run (whole command, incl. interpreter start and detection): {warm_cli * 1000:.0f} ms")
    print(f"baseline: download {download:.3f} s + plain pip install {plain:.3f} s = {download + plain:.3f} s")
    print(f"ratio cold install / (plain pip + download): {cold_total / (download + plain):.2f}  (goal <= 1.5)")
    print(f"the CLI's check before activation is the engine's verify (a real 64x64 generation): {verify_s:.2f} s "
          f"(load {verified['load_seconds']:.2f} s, step {verified['step_seconds']:.2f} s); measured apart from the ratio above")


if __name__ == "__main__":
    main()
