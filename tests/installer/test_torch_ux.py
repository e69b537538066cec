"""Torch installs as a person meets them: package indexes for mirrors, pip's download progress as
events, pip's real failure named, and the torch engine's own packages in the plan.

pip runs for real, against a real HTTP index on 127.0.0.1 serving wheels these tests build; no
test downloads anything from the internet."""
from __future__ import annotations

import io
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import List, Sequence

import pytest

from accelstack.commands.progress import ProgressRenderer
from accelstack.errors import Action
from accelstack.events import ProgressEvent
from accelstack.installer.errors import (
    PipConflictError,
    PipDiskFullError,
    PipError,
    PipHashMismatchError,
    PipNetworkError,
    PipNotFoundError,
    TorchEngineMissingError,
)
from accelstack.installer.home import Home
from accelstack.installer.pip_commands import download_commands, with_indexes
from accelstack.installer.pip_output import PipOutput, pip_failure, redact
from accelstack.installer.pip_runner import run_pip
from accelstack.installer.torch_check import check_engine, engine_modules
from accelstack.installer.torch_destination import PipCommands, TorchEnvironment
from accelstack.manifests.knowledge import Manifests
from accelstack.manifests.plan import PYTHON_PLACEHOLDER, Command, Plan, Request
from accelstack.manifests.resolver import resolve
from accelstack.manifests.torch_matrix import ENGINE_PACKAGES, _builtin_bytes, load_torch_matrix
from accelstack.manifests.torch_resolve import ENGINE_WHY, engine_command, without_engine
from accelstack.settings import ENV, Settings

from installer_helpers import Server, write_wheel

PYTORCH = "https://download.pytorch.org/whl/cu128"
MIRROR = "https://mirror.example/simple"


def _pip(*args: str) -> Command:
    return Command("pip", [PYTHON_PLACEHOLDER, "-m", "pip", "install", *args])


# -- package indexes --------------------------------------------------------------------------------


def test_index_settings_come_from_arguments_then_the_environment(tmp_path):
    env = {ENV["index_url"]: " https://env.example/simple ", ENV["extra_index_urls"]: "https://a.example/simple  https://b.example/simple"}
    s = Settings.resolve(home=tmp_path, env=env, os_name="linux")
    assert s.index_url == "https://env.example/simple"
    assert s.extra_index_urls == ["https://a.example/simple", "https://b.example/simple"]
    s = Settings.resolve(home=tmp_path, env=env, os_name="linux", index_url=MIRROR, extra_index_urls=["https://c.example/simple"])
    assert s.index_url == MIRROR and s.extra_index_urls == ["https://c.example/simple"]
    s = Settings.resolve(home=tmp_path, env={}, os_name="linux", extra_index_urls="https://one.example/simple")
    assert s.index_url is None and s.extra_index_urls == ["https://one.example/simple"]  # one string is one URL


def test_a_mirror_replaces_pypi_but_not_the_pytorch_index():
    commands = [_pip("torch==2.14.*", "--index-url", PYTORCH), _pip("diffusers>=0.30")]
    out = with_indexes(commands, MIRROR, ["https://extra.example/simple"])
    assert out[0].argv[-4:] == ["--index-url", PYTORCH, "--extra-index-url", "https://extra.example/simple"]
    assert out[0].argv.count("--index-url") == 1  # the CUDA build is published only on the PyTorch index
    assert out[1].argv[-4:] == ["--index-url", MIRROR, "--extra-index-url", "https://extra.example/simple"]
    assert commands[1].argv == _pip("diffusers>=0.30").argv  # the plan's own commands are not changed
    bundle = Command("pip", [PYTHON_PLACEHOLDER, "-m", "pip", "install", "--no-index", "--find-links", "/b", "-r", "r.txt"])
    assert with_indexes([bundle], MIRROR, ["https://x.example"])[0].argv == bundle.argv  # no index: a bundle stays offline
    assert with_indexes(commands, None, [])[1].argv == commands[1].argv


def test_pip_commands_for_a_plan_use_the_settings(tmp_path):
    plan = Plan(stack="torch", summary="", commands=[_pip("torch==2.14.*")])
    s = Settings.resolve(home=tmp_path, env={}, os_name="linux", index_url=MIRROR, use_uv=True)
    source = PipCommands.for_plan(plan, s)
    assert source.use_uv and source.commands[0].argv[-2:] == ["--index-url", MIRROR]


def test_a_token_in_an_index_url_is_not_shown():
    assert redact(["pip", "--index-url", "https://me:s3cret@mirror.example/simple"]) == \
        ["pip", "--index-url", "https://me:***@mirror.example/simple"]


# -- a real pip against a real index on 127.0.0.1 -----------------------------------------------------


def _wheel(dest: Path, name: str, version: str, size: int = 0, requires: Sequence[str] = ()) -> Path:
    """A pure-Python wheel of about ``size`` bytes (random, stored uncompressed so the file is that big)."""
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {f"{name}/__init__.py": b"", f"{name}/blob.bin": os.urandom(size), f"{info}/METADATA": meta.encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: accelstack-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    return write_wheel(dest / f"{name}-{version}-py3-none-any.whl", files)


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    """A PEP 503 index on 127.0.0.1: bigpkg (4 MB, served slowly so pip reports progress), and
    alpha/beta whose requirements on gamma conflict."""
    root = tmp_path_factory.mktemp("index")
    wheels = {"bigpkg": [_wheel(root, "bigpkg", "1.0", 4_000_000)],
              "alpha": [_wheel(root, "alpha", "1.0", requires=["gamma==1.0"])],
              "beta": [_wheel(root, "beta", "1.0", requires=["gamma==2.0"])],
              "gamma": [_wheel(root, "gamma", "1.0"), _wheel(root, "gamma", "2.0")]}
    for name, files in wheels.items():
        (root / "simple" / name).mkdir(parents=True)
        links = "".join(f'<a href="../../{f.name}">{f.name}</a>\n' for f in files)
        (root / "simple" / name / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    server = Server(root)
    server.set_delay(0.01)  # ~64 KiB per 10 ms: the 4 MB wheel takes most of a second
    yield server
    server.close()


@pytest.fixture
def pip_env(monkeypatch, tmp_path):
    """pip sees only the indexes a test names: no pip configuration, find-links, cache or retries to wait for."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for name in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX", "PIP_CONSTRAINT", "PIP_PROGRESS_BAR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_CACHE_DIR", str(tmp_path / "pip-cache"))
    monkeypatch.setenv("PIP_RETRIES", "1")
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "10")
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory) -> str:
    """A fresh venv as accelstack creates one (with the pip that Python's ensurepip brings)."""
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    return str(venv / "bin" / "python")


@pytest.fixture(scope="module")
def new_pip_python(tmp_path_factory) -> str:
    """A venv with pip >= 24.1 (``--progress-bar raw``), from this machine's local wheel mirror; skips without one."""
    venv = tmp_path_factory.mktemp("venv-newpip") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    res = subprocess.run([python, "-m", "pip", "install", "-q", "pip>=24.1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=300, env={**os.environ, "PIP_RETRIES": "0", "PIP_DEFAULT_TIMEOUT": "5"})
    if res.returncode != 0:
        pytest.skip(f"no pip >= 24.1 reachable here: {res.stdout[-300:]}")
    return python


def _install(python: str, *args: str) -> List[ProgressEvent]:
    events: List[ProgressEvent] = []
    run_pip([python, "-m", "pip", "install", "--force-reinstall", *args], 300, events.append, "nothing changed", proxied=False)
    return events


def _downloads(events: List[ProgressEvent], task: str) -> List[ProgressEvent]:
    return [e for e in events if e.stage == "download" and e.task == task]


@pytest.mark.parametrize("which", ["ensurepip", "pip>=24.1"])
def test_pip_download_progress_becomes_byte_events(which, index, pip_env, request):
    python = request.getfixturevalue("venv_python" if which == "ensurepip" else "new_pip_python")
    events = _install(python, "--index-url", f"{index.url}/simple", "bigpkg")
    got = _downloads(events, "bigpkg-1.0-py3-none-any.whl")
    assert [e.kind for e in got][0] == "start" and got[-1].kind == "end" and got[-1].ok
    advances = [e for e in got if e.kind == "advance"]
    assert len(advances) >= 2, [(e.kind, e.done, e.total) for e in got]  # a percentage that moves, not one jump
    size = 4_000_000
    assert all(abs(e.total - size) < size * 0.05 for e in advances if e.total)
    assert [e.done for e in advances] == sorted(e.done for e in advances) and 0 < advances[0].done < size
    assert got[-1].done == got[-1].total and abs(got[-1].total - size) < size * 0.05
    assert all(e.extra.get("unit") == "B" for e in got)
    # the bar's redraws are not passed on as messages; pip's other lines are
    messages = [e.message for e in events if e.kind == "message"]
    assert any("Successfully installed bigpkg" in m for m in messages)
    assert not any("/4.0 MB" in m or m.startswith("Progress ") or "\x1b" in m for m in messages)


def test_download_events_render_as_a_percentage_and_as_json_lines(index, pip_env, venv_python):
    events = _install(venv_python, "--index-url", f"{index.url}/simple", "bigpkg")
    terminal, lines = io.StringIO(), io.StringIO()
    bars = ProgressRenderer("bars", stream=terminal)
    jsonl = ProgressRenderer("json", json_stream=lines)
    for e in events:
        bars(e)
        jsonl(e)
    bars.close()
    assert re.search(r"\d+%", terminal.getvalue()) and "bigpkg" in terminal.getvalue()
    docs = [json.loads(line) for line in lines.getvalue().splitlines()]
    advance = [d for d in docs if d["stage"] == "download" and d["kind"] == "advance"]
    assert advance and all(d["event"] == "progress" and 0 < d["done"] <= d["total"] for d in advance)


def test_a_download_without_a_bar_still_shows_its_file():
    events: List[ProgressEvent] = []
    out = PipOutput(events.append, "install")
    for line in ["Collecting torch\n", "  Downloading https://example.org/whl/torch-2.14.0%2Bcu128-cp311-cp311-linux_x86_64.whl (2.5 GB)\n",
                 "Installing collected packages: torch\n"]:
        out.feed(line)
    out.close()
    got = [(e.kind, e.task, e.total) for e in events if e.stage == "download"]
    assert got == [("start", "torch-2.14.0+cu128-cp311-cp311-linux_x86_64.whl", 2_500_000_000),
                   ("end", "torch-2.14.0+cu128-cp311-cp311-linux_x86_64.whl", 2_500_000_000)]


def test_an_index_url_reaches_pip_through_the_torch_destination(index, pip_env, venv_python, tmp_path):
    plan = Plan(stack="torch", summary="", backend="cpu", variant="cpu", packages=["bigpkg"], commands=[_pip("bigpkg")])
    s = Settings.resolve(home=tmp_path / "home", cache=tmp_path / "cache", env={}, os_name="linux",
                         torch_python=venv_python, index_url=f"{index.url}/simple")
    home = Home(s.home)
    home.ensure()
    dest = TorchEnvironment(home, venv_python, s.timeouts.pip, s.timeouts.probe)
    events: List[ProgressEvent] = []
    staged = dest.stage(plan, PipCommands.for_plan(plan, s), events.append)
    dest.abort(staged)  # nothing of the test stays in the venv
    assert any(e.kind == "message" and f"--index-url {index.url}/simple" in e.message for e in events)
    assert _downloads(events, "bigpkg-1.0-py3-none-any.whl")


# -- pip's real failure -----------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _failure(python: str, *args: str) -> PipError:
    with pytest.raises(PipError) as info:
        _install(python, *args)
    return info.value


@pytest.mark.parametrize("retries", ["1", "0"])  # with PIP_RETRIES=0 pip says nothing of the network: accelstack looks
def test_a_closed_port_is_reported_as_connection_refused(retries, venv_python, pip_env, monkeypatch):
    monkeypatch.setenv("PIP_RETRIES", retries)
    err = _failure(venv_python, "--index-url", f"http://127.0.0.1:{_closed_port()}/simple", "bigpkg")
    assert isinstance(err, PipNetworkError) and err.kind == "connection-refused" and err.code == "pip-connection-refused"
    assert "refused" in err.message and "Connection refused" in err.cause and err.action is Action.CHECK_NETWORK
    assert "conflict" not in err.message and "nothing changed" in err.hint


@pytest.mark.parametrize("retries", ["1", "0"])
def test_a_host_that_does_not_resolve_is_reported_as_dns(retries, venv_python, pip_env, monkeypatch):
    monkeypatch.setenv("PIP_RETRIES", retries)
    err = _failure(venv_python, "--index-url", "https://nonexistent.invalid/simple", "bigpkg")
    assert isinstance(err, PipNetworkError) and err.kind == "dns", err.message
    assert "DNS" in err.message and "nonexistent.invalid" in err.message and err.action is Action.CHECK_NETWORK


def test_a_plain_http_index_pip_ignores_is_named(venv_python, pip_env):
    err = _failure(venv_python, "--index-url", "http://nonexistent.invalid/simple", "bigpkg")
    assert isinstance(err, PipNetworkError) and err.kind == "insecure-index"
    assert "not a trusted or secure host" in err.cause and "https://" in err.hint


def test_a_package_the_index_does_not_have(index, venv_python, pip_env):
    err = _failure(venv_python, "--index-url", f"{index.url}/simple", "nosuchpkg")
    assert isinstance(err, PipNotFoundError) and err.kind == "not-found" and err.code == "pip-not-found"
    assert "nosuchpkg" in err.message and f"{index.url}/simple" in err.message
    err = _failure(venv_python, "--index-url", f"{index.url}/simple", "gamma>=3")
    assert err.kind == "no-matching-version" and "1.0, 2.0" in err.message


def test_a_real_conflict_is_reported_as_one(index, venv_python, pip_env):
    err = _failure(venv_python, "--index-url", f"{index.url}/simple", "alpha", "beta")
    assert isinstance(err, PipConflictError) and err.kind == "conflict" and err.action is Action.FIX_INPUT
    assert "gamma==1.0" in err.message and "gamma==2.0" in err.message


@pytest.mark.parametrize("line,kind,cls", [
    ("ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device", "disk-full", PipDiskFullError),
    ("ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE.", "hash-mismatch", PipHashMismatchError),
    ("WARNING: Retrying (Retry(total=0)) after connection broken by 'ProxyError('Cannot connect to proxy.', "
     "NewConnectionError('x: Failed to establish a new connection: [Errno 111] Connection refused'))': /simple/torch/", "proxy", PipNetworkError),
    ("Could not fetch URL https://h/simple/torch/: There was a problem confirming the ssl certificate: "
     "HTTPSConnectionPool(host='h', port=443): Max retries exceeded (Caused by SSLError(SSLCertVerificationError(1, "
     "'[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed'))) - skipping", "tls", PipNetworkError),
    ("ERROR: HTTP error 404 while getting https://h/torch-2.14.0-cp311-none-any.whl", "http-404", PipNetworkError),
    ("WARNING: Retrying after connection broken by 'ReadTimeoutError(\"HTTPSConnectionPool(host='h', port=443): "
     "Read timed out. (read timeout=15)\")': /simple/torch/", "timeout", PipNetworkError),
])
def test_pip_causes_pip_prints_are_classified(line, kind, cls):
    lines = [line, "ERROR: Cannot install torch==2.14.0 because these package versions have conflicting dependencies.",
             "ERROR: ResolutionImpossible: for help visit https://pip.pypa.io"]
    err = pip_failure(lines, ["python", "-m", "pip", "install", "torch", "--index-url", "https://h/simple"], "restored",
                      proxied=False)
    assert type(err) is cls and err.kind == kind and line.strip()[:40] in (err.cause + err.message)
    assert err.hint.endswith("restored")


# -- the torch engine's own packages ----------------------------------------------------------------


def _plan(requirements: Sequence[str] = (), engine=None, matrix=None) -> Plan:
    import accelstack

    report = accelstack.detect()
    request = Request(stack="torch", requirements=list(requirements), backend="cpu", python="3.11")
    if engine is not None:
        request.engine = engine  # type: ignore[attr-defined]  # the field an app sets to install torch alone
    manifests = Manifests.builtin()
    if matrix is not None:
        manifests.torch = matrix
    return resolve(report, request, manifests)


def test_a_torch_plan_installs_the_engines_packages_after_torch():
    plan = _plan(["torch==2.13.*"])
    engine = engine_command(plan)
    assert engine is not None and plan.commands[-1] is engine and engine.why == ENGINE_WHY
    assert engine.argv[4:] == [*ENGINE_PACKAGES, "torch==2.13.*"]  # torch pinned: pip keeps the planned build
    assert {"diffusers", "transformers", "safetensors", "accelerate"} <= {re.split(r"[<>=]", a)[0] for a in engine.argv}
    assert "--index-url" not in engine.argv  # from PyPI (or the user's mirror), not the PyTorch index
    assert plan.uv_commands[-1].why == ENGINE_WHY and plan.packages == ["torch==2.13.*"]
    assert any(n.startswith(ENGINE_WHY) and "diffusers" in n for n in plan.notes)
    assert engine_modules(plan) == ["diffusers", "transformers", "safetensors", "accelerate"]


def test_the_users_own_pin_of_an_engine_package_wins():
    plan = _plan(["torch==2.13.*", "diffusers==0.35.2"])
    assert "diffusers==0.35.2" in plan.commands[1].argv  # the user's requirements, as written
    engine = engine_command(plan)
    assert engine is not None and not any(a.startswith("diffusers") for a in engine.argv)


def test_torch_alone_when_the_engine_is_not_wanted():
    assert engine_command(_plan(engine=False)) is None
    plan = without_engine(_plan())
    assert engine_command(plan) is None and not any(c.why == ENGINE_WHY for c in plan.uv_commands)
    assert not any(n.startswith(ENGINE_WHY) for n in plan.notes) and engine_modules(plan) == []


def test_the_matrix_can_name_the_engines_packages():
    doc = json.loads(_builtin_bytes())
    doc["engine_packages"] = ["diffusers>=0.40", "transformers>=5"]
    matrix = load_torch_matrix(json.dumps(doc).encode(), check_expiry=False)
    assert engine_command(_plan(matrix=matrix)).argv[4:6] == ["diffusers>=0.40", "transformers>=5"]
    doc["engine_packages"] = ["diffusers >>> 1"]
    with pytest.raises(Exception, match="engine_packages"):
        load_torch_matrix(json.dumps(doc).encode(), check_expiry=False)


def test_missing_engine_packages_are_named_with_the_command_that_adds_them(venv_python):
    with pytest.raises(TorchEngineMissingError) as info:
        check_engine(venv_python)
    err = info.value
    assert err.code == "torch-engine-missing" and err.action is Action.REINSTALL
    assert "lacks diffusers, transformers, safetensors," in err.message  # accelerate helps, but is not needed
    assert f"{venv_python} -m pip install 'diffusers>=0.31'" in err.message


def test_the_engine_packages_install_through_the_torch_destination_and_then_are_found(index, pip_env, tmp_path):
    """The plan's engine command, run like any torch step against a mirror (stand-in wheels of the
    four packages on the local index), after which nothing is reported missing."""
    for name, version in (("diffusers", "0.31.0"), ("transformers", "4.41.0"), ("safetensors", "0.4.3"), ("accelerate", "0.31.0")):
        folder = index.root / "simple" / name
        folder.mkdir(exist_ok=True)
        wheel = _wheel(index.root, name, version)
        (folder / "index.html").write_text(f'<a href="../../{wheel.name}">{wheel.name}</a>\n')
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    plan = Plan(stack="torch", summary="", backend="cpu", variant="cpu", packages=[],
                commands=[Command("pip", [PYTHON_PLACEHOLDER, "-m", "pip", "install", *ENGINE_PACKAGES], ENGINE_WHY)])
    s = Settings.resolve(home=tmp_path / "home", cache=tmp_path / "cache", env={}, os_name="linux",
                         torch_python=python, index_url=f"{index.url}/simple")
    home = Home(s.home)
    home.ensure()
    dest = TorchEnvironment(home, python, s.timeouts.pip, s.timeouts.probe)
    dest.stage(plan, PipCommands.for_plan(plan, s), lambda e: None)
    check_engine(python)  # raises if any is missing


def test_the_torch_worker_names_every_missing_package(monkeypatch):
    import importlib.util
    import types

    from accelstack.engine.worker.torch_backend import ENGINE_MODULES, TorchBackend

    missing = [m for m in ENGINE_MODULES if importlib.util.find_spec(m) is None]
    if not missing:
        pytest.skip("this interpreter has the torch engine's packages")
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    with pytest.raises(ImportError) as info:
        TorchBackend(io.StringIO()).import_runtime()
    text = str(info.value)
    assert all(m in text for m in missing) and f"{sys.executable} -m pip install {' '.join(missing)}" in text


def test_a_bundle_downloads_torch_and_the_engine_in_one_resolution(tmp_path):
    plan = _plan(["torch==2.13.*"])
    cmds = download_commands(plan, tmp_path, "3.11", index_url=MIRROR, extra_index_urls=["https://x.example/simple"])
    assert len(cmds) == 1  # one resolution: one version of every shared dependency, and the planned torch
    argv = cmds[0]
    assert argv[3:5] == ["download", "--dest"] and "torch==2.13.*" in argv and "diffusers>=0.31" in argv
    assert argv.count("torch==2.13.*") == 1
    assert argv[argv.index("--index-url") + 1] == MIRROR  # the engine's packages from the mirror...
    extras = [argv[i + 1] for i, a in enumerate(argv) if a == "--extra-index-url"]
    assert extras == ["https://download.pytorch.org/whl/cpu", "https://x.example/simple"]  # ...torch's build from its index


def test_a_download_that_breaks_ends_failed_where_it_stopped():
    events: List[ProgressEvent] = []
    out = PipOutput(events.append, "install", interval=0)
    for line in ["  Downloading http://h/x-1.0-py3-none-any.whl (10.0 MB)\n", "\x1b[2K     ━━━━╺━━━━━━━━━ 2.0/10.0 MB 1.0 MB/s eta 0:00:08\r",
                 "ERROR: Exception: urllib3.exceptions.ProtocolError: Connection broken: IncompleteRead\n"]:
        out.feed(line)
    out.close(False)
    got = [(e.kind, e.done, e.total, e.ok) for e in events if e.stage == "download"]
    assert got == [("start", 0, 10_000_000, None), ("advance", 2_000_000, 10_000_000, None), ("end", 2_000_000, 10_000_000, False)]


def test_a_dns_failure_that_pip_ends_as_a_conflict_is_reported_as_dns(index, venv_python, pip_env, monkeypatch):
    """The issue's case: an index that does not resolve, another that has other versions; pip ends in
    "conflicting dependencies" and (with PIP_RETRIES=0) says nothing of the network."""
    monkeypatch.setenv("PIP_RETRIES", "0")
    err = _failure(venv_python, "--index-url", f"{index.url}/simple", "--extra-index-url", "https://nonexistent.invalid/simple",
                   "alpha", "gamma==2.0")
    assert isinstance(err, PipNetworkError) and err.kind == "dns", err.message
    assert "nonexistent.invalid" in err.message and "conflicting dependencies" in err.message  # pip's own words kept
