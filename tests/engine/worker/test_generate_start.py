"""What `accelstack generate` has done by the time its worker starts, and what the worker's interpreter
loads before the runtime (issue 46: a short generate paid 0.13-0.17 s of fixed start-up before the
model load could begin, 1.14-1.19x sd-cli's whole run on the ~1 s Flux probe).

The parent's modules are listed at the moment it spawns the worker (subprocess.Popen wrapped in the
runner); everything imported after that overlaps the worker's own start and its model load. The
worker's modules are listed by a worker started with the real command line for the CPU runtime.
benchmarks/bench_generate_start.py measures both, and the whole process against sd-cli.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set

# Runs the CLI in-process (stdout swallowed) and lists sys.modules when the worker's process is spawned.
RUNNER = """
import contextlib, io, subprocess, sys
seen = {}
_spawn = subprocess.Popen.__init__
def spawn(self, cmd, *a, **k):
    if "before" not in seen and any("accelstack.engine.worker.main" in str(c) for c in cmd):
        seen["before"] = sorted(sys.modules)
    return _spawn(self, cmd, *a, **k)
subprocess.Popen.__init__ = spawn
from accelstack.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(sys.argv[1:])
import json
sys.stderr.write("\\nMODULES " + json.dumps({"code": code, "before": seen.get("before")}) + "\\n")
"""

# Never needed before the worker starts: the download and TLS stack, the install core, and what
# only the wait for the worker (psutil, http.client), the PNG's check (zipfile, pickle: .ckpt files)
# or the worker itself (ctypes: the runtime's libraries) uses.
NOT_BEFORE_THE_WORKER = {
    "requests", "urllib3", "ssl", "_ssl", "http.client", "email", "certifi", "truststore", "psutil", "pickle",
    "zipfile", "ctypes", "PIL", "numpy", "packaging", "installer", "filelock", "jsonschema", "cryptography",
    "accelstack.artifacts.transport", "accelstack.artifacts.download", "accelstack.core.installing",
    "accelstack.core.planning", "accelstack.installer", "accelstack.manifests", "accelstack.publisher",
    "accelstack.hardware.detection", "accelstack.engine.models", "accelstack.engine.memory.plan",
}


def _matches(loaded: Set[str], names: Set[str]) -> List[str]:
    return sorted(m for m in loaded if any(m == x or m.startswith(x + ".") for x in names))


def test_generate_starts_its_worker_before_the_heavy_imports(tmp_path, cpu_runtime, probe_model):
    import os

    env: Dict[str, str] = dict(os.environ, ACCELSTACK_HOME=str(tmp_path / "home"), ACCELSTACK_CACHE=str(tmp_path / "cache"))
    argv = ["generate", "--runtime", str(cpu_runtime.path), "-m", probe_model.path, "-p", "a lighthouse", "-W", "64",
            "-H", "64", "--steps", "1", "--seed", "1", "-o", str(tmp_path / "a.png"), "--json"]
    out = subprocess.run([sys.executable, "-c", RUNNER, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, timeout=300, env=env)
    line = next((x for x in out.stderr.splitlines() if x.startswith("MODULES ")), None)
    assert line is not None, out.stderr[-3000:]
    data = json.loads(line[len("MODULES "):])
    assert data["code"] == 0 and (tmp_path / "a.png").is_file(), out.stderr[-3000:]
    assert data["before"], "the worker was never started"
    early = _matches(set(data["before"]), NOT_BEFORE_THE_WORKER)
    assert not early, f"`accelstack generate` imports {early} before it starts its worker"


# Lists the modules the worker's interpreter holds once its entry module is imported (no runtime yet).
WORKER_PROBE = ("import sys; exec(sys.argv.pop(1).split('runpy.run_module')[0]); "
                "import accelstack.engine.worker.main; print(sorted(sys.modules))")


def test_the_ggml_worker_finds_the_runtimes_packages_the_runtime_first(tmp_path, cpu_runtime):
    cmd = cpu_runtime.worker_command()
    interpreter, flags, boot = cmd[:3]
    env = cpu_runtime.worker_env()
    res = subprocess.run([interpreter, flags, WORKER_PROBE, boot], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    loaded = set(eval(res.stdout))  # noqa: S307 - our own output
    assert not _matches(loaded, {"PIL", "stable_diffusion_cpp", "http.server", "socketserver"}), loaded
    # what the runtime needs from the environment (PIL, typing_extensions) is still found, the runtime first
    find = ("import sys; exec(sys.argv.pop(1).split('runpy.run_module')[0]); import PIL, typing_extensions, "
            "stable_diffusion_cpp; print(stable_diffusion_cpp.__file__)")
    res = subprocess.run([interpreter, flags, find, boot], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    assert Path(res.stdout.strip()).resolve().is_relative_to(Path(cpu_runtime.path).resolve())
