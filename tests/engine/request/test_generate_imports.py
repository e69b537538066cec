"""What `accelstack generate` imports, in a fresh interpreter that runs a real generation on the CPU
runtime and then lists ``sys.modules``: the engine, the model checks and the record of the active
runtime, never the install, download or build machinery.

Each module the parent process loads is paid before the worker starts, on every image: on the
FLUX.1 probe at 128 px (benchmarks/bench_engine.py) the CLI spent 0.30 s before it started the
worker, 0.25 s of it importing; sd-cli's whole run is 1.09 s.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import List, Set

import pytest

from accelstack.settings import Settings

RUNNER = """
import contextlib, io, sys
from accelstack.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(sys.argv[1:])
loaded = sorted(sys.modules)
import json
sys.stderr.write("\\nMODULES " + json.dumps({"code": code, "modules": loaded}) + "\\n")
"""

# What generating never needs: the download stack, the installer and publisher, planning and the
# manifests' resolver, detection, and the heavy third-party packages behind them.
NOT_FOR_GENERATE = {
    "requests", "urllib3", "truststore", "certifi", "charset_normalizer", "idna", "installer", "packaging",
    "jsonschema", "cryptography", "yaml", "starlette", "uvicorn", "anyio",
    "accelstack.artifacts.transport", "accelstack.artifacts.download", "accelstack.artifacts.batch",
    "accelstack.publisher", "accelstack.core.context", "accelstack.core.options", "accelstack.core.installing",
    "accelstack.core.planning", "accelstack.core.bundles", "accelstack.core.local_build",
    "accelstack.core.stacks.ggml", "accelstack.core.stacks.torch", "accelstack.installer.maintenance",
    "accelstack.installer.repair", "accelstack.installer.wheel", "accelstack.manifests.knowledge",
    "accelstack.manifests.resolver", "accelstack.manifests.torch_matrix", "accelstack.hardware.detection", "filelock",
}


def _loaded(argv: List[str], env: dict) -> Set[str]:
    out = subprocess.run([sys.executable, "-c", RUNNER, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, timeout=300, env=env)
    line = next((x for x in out.stderr.splitlines() if x.startswith("MODULES ")), None)
    assert line is not None, out.stderr[-3000:]
    data = json.loads(line[len("MODULES "):])
    assert data["code"] == 0, out.stderr[-3000:]
    return set(data["modules"])


def _unneeded(loaded: Set[str]) -> List[str]:
    return sorted(m for m in loaded if any(m == x or m.startswith(x + ".") for x in NOT_FOR_GENERATE))


@pytest.fixture(scope="module")
def installed(module_tmp, ggml_cpu_build) -> Path:
    """A home with the CPU runtime installed and active (from the cached build; cheap import check)."""
    import accelstack
    from accelstack.core.verifiers import import_verifier

    s = Settings.resolve(home=module_tmp / "home", cache=module_tmp / "cache", manifests=[])
    summary = accelstack.install(None, stack="ggml", report=accelstack.detect(settings=s), settings=s,
                                 verifier=import_verifier())
    assert summary.receipt is not None
    return module_tmp


def _argv(probe_model, out: Path) -> List[str]:
    return ["generate", "-m", probe_model.path, "-p", "a lighthouse", "-W", "64", "-H", "64", "--steps", "1",
            "--seed", "1", "-o", str(out), "--json"]


def test_generate_with_a_runtime_given_imports_no_install_machinery(tmp_path, cpu_runtime, probe_model):
    import os

    loaded = _loaded(_argv(probe_model, tmp_path / "a.png") + ["--runtime", str(cpu_runtime.path)], dict(os.environ))
    assert (tmp_path / "a.png").is_file()
    assert not _unneeded(loaded), f"`accelstack generate --runtime DIR` imports {_unneeded(loaded)}"


def test_generate_with_the_installed_runtime_imports_no_install_machinery(tmp_path, installed, probe_model):
    import os

    env = dict(os.environ, ACCELSTACK_HOME=str(installed / "home"), ACCELSTACK_CACHE=str(installed / "cache"))
    loaded = _loaded(_argv(probe_model, tmp_path / "b.png"), env)
    assert (tmp_path / "b.png").is_file()
    assert "accelstack.installer.records" in loaded  # it did read the active runtime's receipt
    assert not _unneeded(loaded), f"`accelstack generate` imports {_unneeded(loaded)}"
