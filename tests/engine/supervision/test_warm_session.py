"""The warm engine session (issue 46): one worker keeps its model loaded between images.

Against the real CPU build and the real SD 1.x probe: the same load reuses the worker (same process,
no second load, the same pixels as a one-off generate); per-image settings never reload; a model file
changed on disk, or other load-time options, load again; a worker that died is replaced on the next
job; close leaves no process behind.
"""
from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from accelstack.engine.config import EngineOptions
from accelstack.engine.generation import generate
from accelstack.engine.request.check import check_generation
from accelstack.engine.session import WarmSession
from accelstack.engine.supervision.supervisor import SupervisorPolicy, early_worker
from accelstack.engine.worker.protocol import GenerateRequest

POLICY = SupervisorPolicy(startup_timeout=60, load_timeout=300, poll_interval=0.3, ping_timeout=1.0, shutdown_grace=5.0)


def job(model, out, options=None, **kw):
    fields = dict(prompt="probe", width=64, height=64, steps=1, seed=7, sampler="euler")
    fields.update(kw)
    return check_generation(GenerateRequest(**fields), model, out, options)


def _gone(pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_session_loads_once_and_draws_what_a_one_off_generate_draws(cpu_runtime, probe_model, tmp_path):
    generate(cpu_runtime, probe_model.path, GenerateRequest(prompt="probe", width=64, height=64, steps=1, seed=7,
                                                            sampler="euler"), tmp_path / "plain.png", policy=POLICY)
    with WarmSession(cpu_runtime, policy=POLICY) as session:
        first = session.generate(job(probe_model.path, tmp_path / "a.png"))
        pid = session.pid
        second = session.generate(job(probe_model.path, tmp_path / "b.png", prompt="another", seed=8, steps=2,
                                      width=128, cfg_scale=5.0, sampler="euler_a"))
        third = session.generate(job(probe_model.path, tmp_path / "c.png"))
        assert not first.reused_worker and second.reused_worker and third.reused_worker
        assert session.pid == pid and session.loads == 1 and session.jobs == 3
        assert second.width == 128 and second.steps == 2 and second.seeds == [8]
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "plain.png").read_bytes()
    assert (tmp_path / "c.png").read_bytes() == (tmp_path / "plain.png").read_bytes()  # no state leaks between images
    assert _gone(pid) and not session.loaded


def test_an_early_worker_takes_the_first_load(cpu_runtime, probe_model, tmp_path):
    with WarmSession(cpu_runtime, policy=POLICY, worker=early_worker(cpu_runtime, policy=POLICY)) as session:
        pid = session._early.pid
        session.generate(job(probe_model.path, tmp_path / "a.png"))
        assert session.pid == pid and session.loads == 1
        assert session.generate(job(probe_model.path, tmp_path / "b.png", seed=9)).reused_worker
    assert _gone(pid)


def test_a_model_changed_on_disk_or_other_load_options_load_again(cpu_runtime, probe_model, tmp_path):
    model = tmp_path / "model.safetensors"
    os.link(os.path.join(probe_model.path, probe_model.weights), model)  # the probe's weights under a name of the test's own
    st = os.stat(model)
    try:
        with WarmSession(cpu_runtime, policy=POLICY) as session:
            session.generate(job(str(model), tmp_path / "a.png"))
            pid = session.pid
            os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # changed since it was loaded
            again = session.generate(job(str(model), tmp_path / "b.png"))
            assert not again.reused_worker and session.pid != pid and session.loads == 2 and _gone(pid)
            pid = session.pid
            other = session.generate(job(str(model), tmp_path / "c.png", options=EngineOptions(threads=1)))
            assert not other.reused_worker and session.pid != pid and session.loads == 3
    finally:
        os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (tmp_path / "b.png").read_bytes() == (tmp_path / "a.png").read_bytes()


def test_a_worker_that_died_is_replaced_on_the_next_job_and_close_leaks_nothing(cpu_runtime, probe_model, tmp_path):
    session = WarmSession(cpu_runtime, policy=POLICY)
    session.generate(job(probe_model.path, tmp_path / "a.png"))
    pid = session.pid
    os.kill(pid, signal.SIGKILL)
    # dead, as its parent sees it: psutil calls the thread-group leader a zombie while the worker's other
    # threads still exit, and until they have the process cannot be reaped (the session sees it alive)
    deadline = time.monotonic() + 10
    while session.loaded and time.monotonic() < deadline:
        time.sleep(0.05)
    after = session.generate(job(probe_model.path, tmp_path / "b.png"))
    assert not after.reused_worker and session.pid != pid and session.loads == 2
    new = session.pid
    assert session.release() and _gone(new) and not session.loaded
    session.close()
    session.close()  # twice: no harm
    with pytest.raises(ValueError):
        session.generate(job(probe_model.path, tmp_path / "c.png"))


def test_the_core_session_keeps_the_model_loaded_and_keeps_components_to_the_session(cpu_runtime, probe_model, tmp_path):
    from accelstack.core.session import open_session
    from accelstack.engine.errors import InvalidRequestError

    with open_session(probe_model.path, runtime=cpu_runtime, options=EngineOptions(), policy=POLICY) as session:
        early = session._engine._early.pid  # started as the session opened
        a = session.generate("probe", tmp_path / "a.png", width=64, height=64, steps=1, seed=7, sampler="euler")
        b = session.generate("other", tmp_path / "b.png", width=64, height=64, steps=1, seed=8, sampler="euler")
        assert session._engine.pid == early and not a.reused_worker and b.reused_worker and session.loads == 1
        with pytest.raises(InvalidRequestError, match="load-time setting"):
            session.generate("probe", tmp_path / "c.png", vae=str(tmp_path / "vae.safetensors"))
    assert _gone(early) and not session.loaded


def test_a_warm_worker_slow_to_take_the_next_job_is_waited_for_not_replaced(cpu_runtime, probe_model, tmp_path):
    """Under heavy load an idle warm worker may not answer the next job's submit for seconds (starved of CPU,
    its pages swapped out): stopped here (SIGSTOP) past the old 5 s submit wait, then continued. A live worker
    is judged by its exit or a stall, never by one late answer: the job runs on it (reused, no restart)."""
    import threading

    with WarmSession(cpu_runtime, policy=POLICY) as session:
        first = session.generate(job(probe_model.path, tmp_path / "a.png"))
        pid = session.pid
        assert pid is not None and first.reused_worker is False
        os.kill(pid, signal.SIGSTOP)
        resume = threading.Timer(7.0, os.kill, (pid, signal.SIGCONT))
        resume.start()
        try:
            second = session.generate(job(probe_model.path, tmp_path / "b.png", seed=8))
        finally:
            resume.join()
            os.kill(pid, signal.SIGCONT)
        assert second.reused_worker is True and second.restarts == 0 and session.pid == pid and session.loads == 1
