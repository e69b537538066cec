"""What a command imports: `accelstack detect --json`, `accelstack plan --hardware FILE`,
`accelstack status` and `accelstack --help`, each run in a fresh interpreter that then lists ``sys.modules``.

Every accelstack module a command loads must be in that command's allowlist (a new import on the
path is a decision, made here), and no heavy third-party module it does not need may come with
it: a cold `accelstack detect --json` is measured against torchruntime's `info`
(benchmarks/bench_detect_cold.py), and each of these costs milliseconds on every run.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, FrozenSet, List, Set

import pytest

# Runs the CLI in-process (stdout swallowed), then prints the modules it loaded as one JSON line on stderr.
# (json is imported only after the list is taken: the runner's own imports must not count)
RUNNER = """
import contextlib, io, sys
from accelstack.cli import main
try:
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(sys.argv[1:])
except SystemExit as exc:  # --help exits through argparse
    code = exc.code
loaded = sorted(sys.modules)
import json
sys.stderr.write("\\nMODULES " + json.dumps({"code": code, "modules": loaded}) + "\\n")
"""

BOTTOM = {"accelstack", "accelstack.errors", "accelstack.lazy", "accelstack.domain", "accelstack.events",
          "accelstack.serde", "accelstack.settings", "accelstack.limits", "accelstack.fsio"}
CLI = {"accelstack.cli", "accelstack.commands", "accelstack.commands.common", "accelstack.commands.progress"}
DETECTION = {f"accelstack.hardware{m}" for m in (
    "", ".assess", ".common", ".cpu", ".detection", ".linux", ".live", ".macos", ".protocol", ".report", ".tables",
    ".vulkan", ".vulkan_cache", ".windows")}

ALLOWED: Dict[str, FrozenSet[str]] = {
    # detection and its report; not the capture writer, the replay reader, manifests or anything after
    "detect": frozenset(BOTTOM | CLI | DETECTION | {"accelstack.commands.detect", "accelstack.core",
                                                     "accelstack.core.detection"}),
    # --help lists the commands from a table: no command module, no settings, no detection
    "help": frozenset({"accelstack", "accelstack.cli", "accelstack.errors", "accelstack.lazy"}),
    # a plan from a saved report: the manifests and the resolver, the core's planning (which can detect,
    # replay, fetch manifests and ask a venv's Python its version), never installing, the engine or the service
    "plan": frozenset(BOTTOM | CLI | DETECTION | {
        "accelstack.commands.plan", "accelstack.core", "accelstack.core.detection", "accelstack.core.manifest_files",
        "accelstack.core.planning", "accelstack.core.reports", "accelstack.core.stacks", "accelstack.core.fingerprint",
        "accelstack.core.sources", "accelstack.core.stacks.protocol",  # planning's value types, the drivers' protocol
        "accelstack.hardware.capture", "accelstack.hardware.replay", "accelstack.hardware.system",
        "accelstack.refs", "accelstack.subprocesses", "accelstack.verdict",
        "accelstack.artifacts", "accelstack.artifacts.documents", "accelstack.artifacts.errors",
        "accelstack.artifacts.streams", "accelstack.artifacts.tls", "accelstack.artifacts.transport",
        "accelstack.installer", "accelstack.installer.errors", "accelstack.installer.pip_output",
        "accelstack.installer.pip_runner",
        *(f"accelstack.manifests{m}" for m in (
            "", ".build_targets", ".channels", ".envelope", ".errors", ".fields", ".ggml_checks", ".ggml_manifest", ".ggml_resolve",
            ".hw_rules", ".keys", ".knowledge", ".machine", ".plan", ".request", ".resolver", ".rollback", ".schema",
            ".signatures", ".torch_checks", ".torch_device_rules", ".torch_matrix", ".torch_resolve", ".torch_types", ".trust")),
    }),
    # the state on disk read (receipts, the files' stat against them, the torch journal), detection for the
    # fingerprint; never planning, manifests' checks, the install or download code, the engine or the service
    # (issue 46: it imported all of them through commands/install.py and core/maintenance.py)
    "status": frozenset(BOTTOM | CLI | DETECTION | {
        "accelstack.commands.status", "accelstack.commands.status_text", "accelstack.commands.progress_format",
        "accelstack.core", "accelstack.core.detection", "accelstack.core.fingerprint", "accelstack.core.reports",
        "accelstack.core.stacks", "accelstack.core.stacks.protocol", "accelstack.core.status_check", "accelstack.core.upgrade_check",
        "accelstack.hardware.capture", "accelstack.hardware.replay", "accelstack.hardware.system",
        "accelstack.refs", "accelstack.verdict", "accelstack.artifacts", "accelstack.artifacts.cache",
        "accelstack.artifacts.errors", "accelstack.manifests", "accelstack.manifests.plan",
        *(f"accelstack.installer{m}" for m in (
            "", ".errors", ".file_checks", ".home", ".records", ".recovery", ".shared_libs", ".status", ".torch_journal")),
    }),
}

# Heavy or beside-the-point third-party (and a few standard) modules, per command.
NEVER = {"jsonschema", "PIL", "numpy", "torch", "tqdm", "yaml", "cryptography", "filelock", "starlette", "uvicorn",
         "anyio", "installer", "stable_diffusion_cpp", "diffusers", "selenium", "hypothesis"}
NETWORK = {"requests", "urllib3", "ssl", "truststore", "certifi", "http.client", "socket", "email"}
# what the install and download code brings (status, detect and --help use none of it)
INSTALLING = {"psutil", "pickle", "packaging", "installer", "filelock"}
FORBIDDEN: Dict[str, Set[str]] = {
    # detection reads procfs/sysfs on Linux itself: no psutil (10 ms), no platform (9 regexes), no packaging,
    # no importlib.resources (the tables are read by path)
    "detect": NEVER | NETWORK | INSTALLING | {"importlib.resources", "platform"} if sys.platform.startswith("linux")
    else NEVER | NETWORK | (INSTALLING - {"psutil"}) | {"importlib.resources"},
    "help": NEVER | NETWORK | INSTALLING | {"platformdirs", "packaging", "subprocess", "sqlite3", "dataclasses", "json"},
    "plan": NEVER,
    # the home's lock names its host (socket.gethostname): status reads no lock, but imports the home's module
    "status": NEVER | (NETWORK - {"socket"}) | INSTALLING,
}


def _modules(argv: List[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Set[str]:
    monkeypatch.setenv("ACCELSTACK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ACCELSTACK_HOME", str(tmp_path / "home"))
    out = subprocess.run([sys.executable, "-c", RUNNER, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, timeout=120)
    line = next((line for line in out.stderr.splitlines() if line.startswith("MODULES ")), None)
    assert line is not None, out.stderr
    data = json.loads(line[len("MODULES "):])
    assert data["code"] in (0, 1), out.stderr  # plan exits 1 when nothing fits: it still ran to its end
    return set(data["modules"])


def _report_file(tmp_path: Path) -> Path:
    """A saved HardwareReport (a replayed fixture's), as `accelstack detect --json > report.json` writes."""
    from accelstack.core.detection import detect
    from accelstack.hardware.system import ReplaySystem
    from accelstack.serde import dumps

    capture = Path(__file__).resolve().parent / "fixtures" / "captures" / "linux-nvidia-rtx4070-550"
    path = tmp_path / "report.json"
    path.write_text(dumps(detect(ReplaySystem(str(capture)))), encoding="utf-8")
    return path


def _check(command: str, loaded: Set[str]) -> None:
    ours = {m for m in loaded if m == "accelstack" or m.startswith("accelstack.")}
    extra = sorted(ours - ALLOWED[command])
    assert not extra, f"`accelstack {command}` imports accelstack modules outside its allowlist: {extra}"
    heavy = sorted(m for m in loaded if m in FORBIDDEN[command] or m.split(".")[0] in FORBIDDEN[command])
    assert not heavy, f"`accelstack {command}` imports {heavy}"


def test_detect_json_imports_only_detection(tmp_path, monkeypatch):
    _check("detect", _modules(["detect", "--json"], tmp_path, monkeypatch))


def test_help_imports_only_the_cli(tmp_path, monkeypatch):
    _check("help", _modules(["--help"], tmp_path, monkeypatch))


def test_status_imports_no_install_download_or_planning_code(tmp_path, monkeypatch):
    _check("status", _modules(["status"], tmp_path, monkeypatch))


def test_status_json_imports_no_install_download_or_planning_code(tmp_path, monkeypatch):
    _check("status", _modules(["status", "--json"], tmp_path, monkeypatch))


def test_plan_from_a_saved_report_imports_no_install_engine_or_service_code(tmp_path, monkeypatch):
    _check("plan", _modules(["plan", "--hardware", str(_report_file(tmp_path)), "--json"], tmp_path, monkeypatch))


# core/planning.py reaches the documents through the artifacts package's lazy names, so requests, urllib3, ssl
# and truststore (~45 ms of CPU here) are loaded only when a manifest is fetched.
def test_plan_from_a_saved_report_loads_no_network_stack(tmp_path, monkeypatch):
    loaded = _modules(["plan", "--hardware", str(_report_file(tmp_path)), "--json"], tmp_path, monkeypatch)
    network = sorted(m for m in loaded if m in NETWORK or m.split(".")[0] in NETWORK)
    assert not network, f"`accelstack plan --hardware FILE` imports {network}"


# What `detect --json` loaded without using it, from outside detection, until issue 24 (measured: ~5 ms of
# CPU together, the difference to torchruntime's `info` on a machine without a GPU; see the benchmark),
# and what keeps each one out now.
UNUSED_BY_DETECT = {
    "platformdirs": "settings.platform_dirs applies the XDG rule itself on Linux (platformdirs only on macOS/Windows)",
    "accelstack.commands.progress": "commands/common.py configures the progress renderer only where a command "
                                    "loaded it (or -q/-v asks for it); `detect --json` reports no progress",
    "accelstack.events": "imported with the progress renderer",
    "tempfile": "accelstack/fsio.py makes its temporary files and folders with os alone (tempfile loads random)",
    "shutil": "cli.Parser gives the formatters argparse makes while building a width (argparse's default asks "
              "shutil, which loads bz2 and lzma); fsio removes trees with os alone",
}


def test_detect_json_loads_nothing_it_does_not_use(tmp_path, monkeypatch):
    loaded = _modules(["detect", "--json"], tmp_path, monkeypatch)
    assert not sorted(m for m in UNUSED_BY_DETECT if m in loaded)
