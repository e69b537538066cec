"""The early worker of `generate`: started before the model and options are known, it imports the
runtime while the caller imports and runs its checks, then loads what it is sent (its load file).

Against the real CPU build and the real SD 1.x probe; each CLI run is a real process whose worker
folders go to a temp dir of the test (TMPDIR), so what a run leaves behind can be seen.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from accelstack.engine.errors import ModelLoadError
from accelstack.engine.generation import generate
from accelstack.engine.probes.layout import probe_weights
from accelstack.engine.runtime import Runtime
from accelstack.engine.supervision.supervisor import Supervisor, SupervisorPolicy, early_worker
from accelstack.engine.worker.main import MAX_LOAD_FILE_BYTES, read_load_file
from accelstack.engine.worker.protocol import GenerateRequest

POLICY = SupervisorPolicy(startup_timeout=60, load_timeout=300, poll_interval=0.3, ping_timeout=1.0, shutdown_grace=5.0)

# Spawns the worker of `accelstack generate` with a record of the modules loaded at that moment.
RUNNER = """
import json, sys
from accelstack.engine.supervision import process
spawn = process.WorkerProcess.spawn
seen = []
def recording(self):
    seen.append(sorted(sys.modules))
    spawn(self)
process.WorkerProcess.spawn = recording
from accelstack.cli import main
code = main(sys.argv[1:])
sys.stderr.write("\\nSPAWNS " + json.dumps({"code": code, "spawns": seen}) + "\\n")
"""

# What the parent imports only once the worker runs: the model checks, the memory planner, LoRAs;
# psutil (~9 ms: the supervisor's folder marker, killing and watching the worker) and secrets (~4 ms:
# hmac and OpenSSL, for the worker's token).
AFTER_THE_WORKER_STARTS = ("accelstack.engine.generation", "accelstack.engine.request.components",
                           "accelstack.engine.models.inspection", "accelstack.engine.memory.plan",
                           "accelstack.engine.request.companions", "accelstack.engine.verification.probe_verify", "psutil", "secrets")


def request(**kw):
    return GenerateRequest(prompt="probe", width=64, height=64, steps=1, seed=7, sampler="euler", **kw)


def _workers_of(folder: Path):
    """Live processes whose command line names ``folder`` (a worker's ready file is in it)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(str(folder) in part for part in p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
        except psutil.Error:
            pass
    return found


def test_the_early_worker_loads_what_generate_sends_it_and_draws_the_same_image(cpu_runtime, probe_model, tmp_path):
    generate(cpu_runtime, probe_model.path, request(), tmp_path / "plain.png", policy=POLICY)
    worker = early_worker(cpu_runtime, policy=POLICY)
    folder = worker._dir
    assert worker.alive() and worker.model == ""  # started with no model and no options
    early = generate(cpu_runtime, probe_model.path, request(), tmp_path / "early.png", worker=worker)
    assert early.images == [str(tmp_path / "early.png")] and early.load_seconds is not None
    assert (tmp_path / "early.png").read_bytes() == (tmp_path / "plain.png").read_bytes()
    assert worker._proc is None and folder is not None and not folder.exists()  # let go: nothing of it stays


def test_an_early_worker_for_another_runtime_is_refused_and_stopped(cpu_runtime, probe_model, tmp_path):
    worker = early_worker(cpu_runtime, policy=POLICY)
    pid = worker.pid
    with pytest.raises(ValueError, match="another runtime"):
        generate(Runtime(cpu_runtime.path, "cpu", env={"GGML_SCHED_MAX_COPIES": "1"}), probe_model.path, request(),
                 tmp_path / "x.png", worker=worker)
    assert not worker.alive() and (not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    assert not (tmp_path / "x.png").exists()


def test_an_equal_runtime_object_is_the_same_runtime(cpu_runtime, probe_model, tmp_path):
    worker = early_worker(cpu_runtime, policy=POLICY)
    same = Runtime(cpu_runtime.path, cpu_runtime.backend, env=dict(cpu_runtime.env))
    assert same is not cpu_runtime
    assert generate(same, probe_model.path, request(), tmp_path / "same.png", worker=worker).images


def test_a_refused_request_stops_the_early_worker(cpu_runtime, tmp_path):
    worker = early_worker(cpu_runtime, policy=POLICY)
    pid, folder = worker.pid, worker._dir
    with pytest.raises(ModelLoadError):
        generate(cpu_runtime, tmp_path / "missing.safetensors", request(), tmp_path / "x.png", worker=worker)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert folder is not None and not folder.exists()


def test_a_deferred_worker_never_configured_loads_nothing_and_is_ready(cpu_runtime):
    """start() without configure() sends what the launcher has: no model (a worker that only imports)."""
    sup = Supervisor(cpu_runtime, policy=POLICY)
    try:
        sup.prestart(model_appears=60, deferred=True)
        st = sup.start()
        assert st.phase == "ready" and st.load_seconds is None
    finally:
        sup.stop()


def test_a_deferred_worker_whose_order_never_comes_fails_clearly(cpu_runtime, probe_model):
    """The order is late (the worker waited 0.5 s for it): a typed error naming the load file."""
    sup = Supervisor(cpu_runtime, policy=POLICY)
    try:
        sup.prestart(model_appears=0.5, deferred=True)
        proc = sup._proc
        assert proc is not None and proc.wait(0) is False
        sup._awaits_load, sup._load_by = False, math.inf  # the order is withheld, the launcher thinks it sent it
        with pytest.raises(ModelLoadError, match=r"load file .* did not appear within 0\.5 s"):
            sup.start()
        assert not sup.alive()
    finally:
        sup.stop()


def test_an_order_later_than_the_worker_waits_still_generates(cpu_runtime, probe_model, tmp_path):
    """The caller's checks took longer than the worker's wait (a copy from a slow disk): the worker
    that gave up is replaced by an ordinary launch and the image is the same, not an error."""
    generate(cpu_runtime, probe_model.path, request(), tmp_path / "plain.png", policy=POLICY)
    worker = early_worker(cpu_runtime, policy=POLICY, within=0.5)
    first = worker._proc
    assert first is not None and first.wait(3) is False  # it waited 0.5 s, failed, and still runs
    late = generate(cpu_runtime, probe_model.path, request(), tmp_path / "late.png", worker=worker)
    assert late.images == [str(tmp_path / "late.png")]
    assert (tmp_path / "late.png").read_bytes() == (tmp_path / "plain.png").read_bytes()
    assert not first.alive() and worker._proc is None  # the one that gave up was ended, the new one let go


def test_a_deferred_worker_started_after_its_wait_without_an_order_is_replaced(cpu_runtime):
    """start() with no configure(), later than the worker waits: an ordinary worker, not a dead one."""
    sup = Supervisor(cpu_runtime, policy=POLICY)
    try:
        sup.prestart(model_appears=0.5, deferred=True)
        first = sup._proc
        assert first is not None and first.wait(3) is False  # it gave up waiting and still runs
        st = sup.start()
        assert st.phase == "ready" and st.load_seconds is None
        assert not first.alive() and sup._proc is not first and sup.launches == 2
    finally:
        sup.stop()


def test_a_model_written_after_the_prestarted_worker_stopped_waiting_still_loads(cpu_runtime, probe_model, tmp_path):
    """verify's prestart (model known, file not yet written): a probe written later than the worker
    waits for it costs the head start, not a ModelLoadError."""
    model = tmp_path / "probe.safetensors"
    sup = Supervisor(cpu_runtime, model=str(model), policy=POLICY)
    try:
        sup.prestart(model_appears=0.5)
        first = sup._proc
        assert first is not None and first.wait(3) is False  # "did not appear within 0.5 s", still running
        part = tmp_path / "probe.part"
        part.write_bytes(Path(str(probe_weights(probe_model.path))).read_bytes())
        os.replace(part, model)
        st = sup.start()
        assert st.phase == "ready" and st.load_seconds is not None
        assert not first.alive() and sup.launches == 2
    finally:
        sup.stop()


@pytest.mark.parametrize("content, reason", [
    (b"", "load file"),
    (b"[1, 2]", "does not hold a model"),
    (b'{"model": 3, "options": {}}', "does not hold a model"),
    (b'{"model": "m.safetensors", "options": []}', "does not hold a model"),
    (b"{" * 5000, "load file"),
    (b'{"model": "' + b"a" * (MAX_LOAD_FILE_BYTES + 10) + b'", "options": {}}', "load file"),
])
def test_a_load_file_that_is_not_one_is_a_model_load_error(tmp_path, content, reason):
    path = tmp_path / "load-1.json"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError, match=reason):
        read_load_file(str(path))


def test_a_load_file_that_is_a_fifo_or_a_link_is_not_read(tmp_path):
    target = tmp_path / "real.json"
    target.write_text(json.dumps({"model": "m.safetensors", "options": {}}))
    assert read_load_file(str(target)) == ("m.safetensors", {})
    link = tmp_path / "link.json"
    link.symlink_to(target)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for path in (link, fifo):
        with pytest.raises(ModelLoadError, match="cannot read the worker's load file"):
            read_load_file(str(path))


def _run_cli(argv, tmp_path: Path, env_extra=None):
    temp = tmp_path / "tmpdir"
    temp.mkdir(exist_ok=True)
    env = dict(os.environ, TMPDIR=str(temp), **(env_extra or {}))
    out = subprocess.run([sys.executable, "-c", RUNNER, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, timeout=300, env=env)
    line = next((x for x in out.stderr.splitlines() if x.startswith("SPAWNS ")), None)
    return out, (json.loads(line[len("SPAWNS "):]) if line else None), temp


def test_the_cli_starts_the_worker_before_it_imports_the_model_checks(cpu_runtime, probe_model, tmp_path):
    argv = ["generate", "--runtime", str(cpu_runtime.path), "-m", probe_model.path, "-p", "a lighthouse", "-W", "64",
            "-H", "64", "--steps", "1", "--seed", "1", "-o", str(tmp_path / "a.png"), "--json"]
    out, data, temp = _run_cli(argv, tmp_path)
    assert data is not None and data["code"] == 0, out.stderr[-3000:]
    assert (tmp_path / "a.png").is_file() and len(data["spawns"]) == 1
    loaded = set(data["spawns"][0])
    assert "accelstack.engine.supervision.supervisor" in loaded
    early = sorted(m for m in AFTER_THE_WORKER_STARTS if m in loaded)
    assert not early, f"imported before the worker started: {early}"
    assert not _workers_of(temp) and not list(temp.glob("accelstack-worker-*"))


def test_a_cli_refusal_after_the_worker_started_leaves_no_worker(cpu_runtime, tmp_path):
    """A missing model is refused (exit 2, one JSON error line) after the worker was started: it is
    stopped, its folder removed, nothing left running."""
    argv = ["generate", "--runtime", str(cpu_runtime.path), "-m", str(tmp_path / "missing.safetensors"),
            "-p", "a lighthouse", "-o", str(tmp_path / "a.png"), "--json"]
    out, data, temp = _run_cli(argv, tmp_path)
    assert data is not None and data["code"] == 2 and len(data["spawns"]) == 1, out.stderr[-3000:]
    lines = [x for x in out.stdout.splitlines() if x.strip()]
    last = json.loads(lines[-1])
    assert last["event"] == "error" and last["code"] == "model-not-found" and "does not exist" in last["message"]
    assert not _workers_of(temp) and not list(temp.glob("accelstack-worker-*"))
    assert not (tmp_path / "a.png").exists()
