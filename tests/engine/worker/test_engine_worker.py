"""The worker and its supervisor against the real CPU build of stable-diffusion.cpp and the real
probe model: start, ready, generate, token, cancel, crash and restart with backoff, a stalled
worker, a busy worker with a slow ping, parent death, and load failures.

Generations are 64x64 with 1-2 steps; one supervisor is shared where a test does not break it.
"""
from __future__ import annotations

import http.client
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace

import psutil
import pytest

from accelstack.engine.errors import CancelledError, ModelLoadError, WorkerCrashedError, WorkerStartError
from accelstack.engine.runtime import Runtime
from accelstack.engine.supervision.supervisor import Supervisor, SupervisorPolicy
from accelstack.engine.worker.protocol import GenerateRequest
from accelstack.errors import Action

from engine_helpers import SlowStatusRuntime

POLICY = SupervisorPolicy(startup_timeout=60, load_timeout=300, poll_interval=0.3, ping_timeout=1.0,
                          stall_timeout=60, backoff_initial=0.1, backoff_max=1.0, shutdown_grace=2.0)


def request(steps=1, seed=42, **kw):
    return GenerateRequest(prompt="probe", width=64, height=64, steps=steps, seed=seed, sampler="euler", **kw)


@pytest.fixture(scope="module")
def sup(cpu_runtime, probe_model):
    events = []
    s = Supervisor(cpu_runtime, model=probe_model.path, policy=POLICY, progress=events.append)
    s.events = events
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def one_step(sup):
    """A 1-step result; its image is the one every recovery test must reproduce exactly."""
    sup.events.clear()
    return sup.generate(request(steps=1))


def when(predicate, timeout=120.0, interval=0.02):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(interval)


class Saboteur(threading.Thread):
    """Sends ``sig`` to each new worker once it is generating, ``times`` times."""

    def __init__(self, sup, sig, times=1):
        super().__init__(daemon=True)
        self.sup, self.sig, self.times = sup, sig, times
        self.hit = []
        self.stop = threading.Event()
        sup.last_status = None  # act on what the next job shows, not on the previous job's status

    def run(self):
        while len(self.hit) < self.times and not self.stop.is_set():
            st = self.sup.last_status
            pid = self.sup.pid
            if st is not None and pid and st.pid == pid and pid not in self.hit and st.phase == "generating":
                os.kill(pid, self.sig)
                self.hit.append(pid)
            time.sleep(0.02)


def test_start_ready_status(sup):
    st = sup.status()
    assert st.phase == "ready" and st.pid == sup.pid and sup.ping()
    assert st.device is not None and st.device.kind == "cpu" and st.device.name
    assert st.load_seconds and st.load_seconds > 0 and st.rss_bytes and st.rss_bytes > 1 << 30
    assert "AVX" in st.system_info or st.system_info  # the runtime reports its build


def test_generate_one_step(sup, one_step):
    res = one_step
    img = res.images[0]
    assert (img.width, img.height, img.seed) == (64, 64, 42) and len(img.pixels) == 64 * 64 * 3
    assert len(set(img.pixels)) > 16
    assert res.steps == 1 and res.sampling_seconds > 0 and res.its_per_second > 0
    assert res.library_seconds and res.library_seconds > 0  # the runtime's own timing, from its log
    assert res.sampler == "euler" and res.scheduler  # "default" scheduler named by the runtime
    kinds = [(e.kind, e.done) for e in sup.events if e.stage == "generate"]
    assert kinds[0] == ("start", 0) and kinds[-1] == ("end", 1) and sup.events[-1].ok


def test_requests_need_the_token(sup):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        conn = http.client.HTTPConnection("127.0.0.1", sup.client.port, timeout=5)
        conn.request("GET", "/status", headers=headers)
        resp = conn.getresponse()
        assert resp.status == 401 and json.loads(resp.read())["kind"] == "Unauthorized"
        conn.close()
    # the token is not on the worker's command line
    assert not any(sup.client.token in part for part in psutil.Process(sup.pid).cmdline())


def test_batch_and_seeds(sup):
    res = sup.generate(request(steps=1, seed=7, batch_count=2))
    assert [i.seed for i in res.images] == [7, 8] and res.images[0].pixels != res.images[1].pixels


def test_cancel_mid_generation_then_work_again(sup):
    out = {}

    def job():
        try:
            out["result"] = sup.generate(request(steps=3))
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            out["error"] = exc

    sup.last_status = None
    t = threading.Thread(target=job)
    t.start()
    when(lambda: sup.last_status is not None and sup.last_status.phase == "generating")
    assert sup.cancel()
    t.join(60)
    assert isinstance(out.get("error"), CancelledError)
    res = sup.generate(request(steps=1))  # a fresh worker, no crash backoff for a cancel
    assert len(res.images) == 1
    assert sup.restarts[-1].reason == "cancelled" and sup.restarts[-1].delay == 0


def test_crashes_restart_with_growing_backoff_and_same_image(sup, one_step):
    before = len(sup.restarts)
    killer = Saboteur(sup, signal.SIGKILL, times=2)
    killer.start()
    res = sup.generate(request(steps=1), attempts=3)
    killer.stop.set()
    assert len(killer.hit) == 2 and res.restarts == 2
    new = sup.restarts[before:]
    assert all("died during generation" in r.reason and "SIGKILL" in r.reason for r in new), new
    assert [r.delay for r in new] == [POLICY.backoff_initial, POLICY.backoff_initial * 2]
    assert res.images[0].pixels == one_step.images[0].pixels, "a restarted worker must give the same image"


def test_a_stalled_worker_is_detected_and_restarted(cpu_runtime, probe_model, one_step):
    policy = replace(POLICY, stall_timeout=3.0, ping_timeout=0.5)
    with Supervisor(cpu_runtime, model=probe_model.path, policy=policy) as s:
        stopper = Saboteur(s, signal.SIGSTOP, times=1)
        stopper.start()
        res = s.generate(request(steps=1), attempts=2)
        frozen = stopper.hit[0]
        assert res.restarts == 1 and "stopped making progress" in s.restarts[-1].reason
        assert res.images[0].pixels == one_step.images[0].pixels
        assert not psutil.pid_exists(frozen) or psutil.Process(frozen).status() == psutil.STATUS_ZOMBIE


def test_a_busy_worker_with_a_slow_ping_is_not_killed(cpu_runtime, probe_model):
    # /status answers 2.5 s late while generating, the ping timeout is 0.5 s and a stall is 2 s
    # without progress: only the CPU time shows the worker is alive, and that must be enough.
    policy = replace(POLICY, stall_timeout=2.0, ping_timeout=0.5, max_restarts=0)
    slow = SlowStatusRuntime(path=cpu_runtime.path, backend=cpu_runtime.backend, delay=2.5)  # the test's own worker
    with Supervisor(slow, model=probe_model.path, policy=policy) as s:
        pid = s.pid
        res = s.generate(request(steps=2))
        assert res.restarts == 0 and s.pid == pid and len(res.images) == 1


def test_restart_cap(cpu_runtime, probe_model):
    policy = replace(POLICY, max_restarts=1)
    with Supervisor(cpu_runtime, model=probe_model.path, policy=policy) as s:
        killer = Saboteur(s, signal.SIGKILL, times=2)
        killer.start()
        with pytest.raises(WorkerCrashedError) as err:
            s.generate(request(steps=1), attempts=5)
        killer.stop.set()
        assert "not restarting it again" in err.value.message and len(killer.hit) == 2


PARENT = """
import sys, time
from pathlib import Path
from accelstack.engine.runtime import Runtime
from accelstack.engine.supervision.supervisor import Supervisor
s = Supervisor(Runtime(Path(sys.argv[1])))
s.start()
print(s.pid, s._dir, flush=True)
time.sleep(120)
"""


def test_worker_exits_when_its_parent_dies(cpu_runtime):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(cpu_runtime.path)], stdout=subprocess.PIPE, text=True)
    try:
        pid, folder = parent.stdout.readline().split(maxsplit=1)
        worker = int(pid)
        assert psutil.pid_exists(worker)
        parent.kill()
        parent.wait(10)
        when(lambda: not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE,
             timeout=20)
    finally:
        parent.kill()
        shutil.rmtree(folder.strip(), ignore_errors=True)  # the killed parent could not clean up


def test_a_model_that_fails_to_load_names_the_file_and_the_reason(cpu_runtime, tmp_path):
    from accelstack.engine.probes.weights import safetensors_header

    path = tmp_path / "not-sd.safetensors"
    path.write_bytes(safetensors_header({"foo.weight": (4, 4)}, {}) + b"\0" * 32)  # valid file, not a diffusion model
    with pytest.raises(ModelLoadError) as err:
        Supervisor(cpu_runtime, model=str(path), policy=POLICY).start()
    msg = err.value.message
    assert str(path) in msg and "NULL pointer" not in msg
    assert len(msg) > len(f"cannot load model {path}: ") + 10  # a reason follows the name


# A failed load in the bindings' own object, which is then dropped (as when a worker's load ends).
FAILED_LOAD = """
import gc, sys
from accelstack.engine.config import EngineOptions
from accelstack.engine.errors import ModelLoadError
from accelstack.engine.worker.ggml_backend import GgmlBackend
backend = GgmlBackend(sys.stderr, [], [])
backend.import_runtime()
try:
    backend.load(sys.argv[1], EngineOptions().validate().concrete())
except ModelLoadError as exc:
    print("refused:", exc.message)
gc.collect()
print("alive")
"""


def test_a_failed_load_leaves_the_process_alive(cpu_runtime, tmp_path):
    """stable-diffusion.cpp returns a NULL context for a file it cannot place; the bindings' object
    around it would free that NULL when dropped (a segfault): the worker must survive to say why."""
    from accelstack.engine.probes.weights import safetensors_header

    path = tmp_path / "not-sd.safetensors"
    path.write_bytes(safetensors_header({"foo.weight": (4, 4)}, {}) + b"\0" * 32)
    out = subprocess.run([sys.executable, "-c", FAILED_LOAD, str(path)], env=cpu_runtime.worker_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"refused: cannot load model {path}" in out.stdout and out.stdout.rstrip().endswith("alive")


def test_a_prestarted_worker_waits_for_its_model_then_loads_it(cpu_runtime, probe_model, one_step, tmp_path):
    """verify starts the worker while it writes the probe: the worker is up (listening, runtime
    imported) before the file exists, loads it when it appears whole, and generates as usual."""
    target = tmp_path / "later" / "probe.safetensors"
    target.parent.mkdir()
    s = Supervisor(cpu_runtime, model=str(target), policy=POLICY)
    try:
        s.prestart()
        when(lambda: s._proc is not None and s._proc.ready_path.is_file(), timeout=60)
        time.sleep(0.3)
        assert s.alive() and not target.exists()
        target.symlink_to(probe_model.model)  # appears whole at once, as the renamed probe does
        st = s.start()
        assert st.phase == "ready" and st.load_seconds is not None
        assert s.generate(request(steps=1)).images[0].pixels == one_step.images[0].pixels
        pid = s.pid
        s.stop(wait=False)  # asks, and returns while the worker exits
        s.stop()
        assert not s.alive() and (not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    finally:
        s.stop()


def test_a_prestarted_worker_whose_model_never_comes_fails_clearly(cpu_runtime, tmp_path):
    s = Supervisor(cpu_runtime, model=str(tmp_path / "never.safetensors"), policy=POLICY)
    s.prestart(model_appears=2.0)  # start() comes in time (LOAD_MARGIN before the worker gives up)
    with pytest.raises(ModelLoadError, match=r"did not appear within 2 s"):
        s.start()
    assert not s.alive() and s._proc is None


def test_a_prestarted_worker_is_stopped_without_ever_starting(cpu_runtime, tmp_path):
    s = Supervisor(cpu_runtime, model=str(tmp_path / "never.safetensors"), policy=POLICY)
    s.prestart()
    when(lambda: s._proc is not None and s._proc.ready_path.is_file(), timeout=60)
    pid, folder = s.pid, s._dir
    s.stop()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert folder is not None and not folder.exists()


def test_let_go_leaves_an_exiting_worker_to_a_reaper_and_removes_its_folder_now(cpu_runtime, probe_model):
    """verify does not wait for the kernel to free the worker's memory (0.2 s of every run): a worker
    that answered the request to exit is reaped by a helper thread; nothing of it stays."""
    s = Supervisor(cpu_runtime, model=probe_model.path, policy=POLICY)
    s.start()
    pid, folder = s.pid, s._dir
    s.stop(wait=False)
    s.let_go()
    assert s._proc is None and not s.alive() and folder is not None and not folder.exists()
    when(lambda: not psutil.pid_exists(pid), timeout=30)  # gone, and reaped (not a zombie)
    s.let_go()  # nothing left to do
    s.stop()


def test_let_go_without_a_request_to_exit_is_a_stop(cpu_runtime, probe_model):
    s = Supervisor(cpu_runtime, model=probe_model.path, policy=POLICY)
    s.start()
    pid, folder = s.pid, s._dir
    s.let_go()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert folder is not None and not folder.exists()


def test_a_broken_runtime_is_a_start_error(tmp_path, caplog):
    pkg = tmp_path / "stable_diffusion_cpp"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('libstable-diffusion.so: cannot open shared object file')\n")
    with caplog.at_level(logging.INFO, logger="accelstack.engine"), pytest.raises(WorkerStartError) as err:
        Supervisor(Runtime(tmp_path), model=None, policy=POLICY).start()
    assert "cannot import the runtime" in err.value.message and "libstable-diffusion.so" in err.value.message
    assert err.value.action == Action.REINSTALL and "accelstack" not in err.value.hint
    logged = " | ".join(r.getMessage() for r in caplog.records)
    assert "started" in logged and "killing worker" in logged and "stopped" in logged
