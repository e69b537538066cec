"""The free VRAM the memory planner gets before a GPU generation's worker starts, read by the core from
the System it has (here real machines' dumps, replayed: nvidia-smi's CSV, amdgpu's sysfs), never from a
full detect, and never by the engine itself."""
from __future__ import annotations

from pathlib import Path

import pytest

from accelstack.core import direct
from accelstack.core.machine import machine_memory
from accelstack.engine import generation
from accelstack.engine.config import EngineOptions
from accelstack.engine.memory.device import vram_free_of
from accelstack.engine.memory.plan import plan_for_files
from accelstack.hardware.detection import detect
from accelstack.hardware.replay import ReplaySystem

MIB = 1 << 20
CAPTURES = Path(__file__).resolve().parents[2] / "fixtures" / "captures"  # the committed captures of real machines


def fixture_names():
    return sorted(p.name for p in CAPTURES.iterdir() if (p / "capture.json").is_file())


def _system(name: str) -> ReplaySystem:
    return ReplaySystem(str(CAPTURES / name))


def gpu_vram_free(backend: str, system: ReplaySystem):
    """What the planner is told of ``backend``'s free VRAM on ``system``."""
    return machine_memory(backend, system).vram_free(backend)


@pytest.mark.parametrize("name", fixture_names())
def test_the_quick_read_agrees_with_detect_on_every_captured_machine(name):
    # The planner's read skips detect's Vulkan enumeration and the rest; on every real machine's dump it
    # gives each backend the free VRAM the full detect reports for the same GPUs.
    report = detect(_system(name), home=None)
    for backend in ("cuda", "rocm", "vulkan", "sycl", "metal", "cpu"):
        want = vram_free_of(backend, report.gpus)
        if backend == "vulkan" and report.os.name != "linux":
            want = None  # elsewhere the quick read sees nvidia-smi's GPUs only: Vulkan's device is not told
        assert gpu_vram_free(backend, _system(name)) == want, backend


def test_an_nvidia_gpu_gives_cuda_and_vulkan_its_free_vram():
    assert gpu_vram_free("cuda", _system("linux-nvidia-rtx4070-550")) == 11852 * MIB  # nvidia-smi's memory.free
    assert gpu_vram_free("vulkan", _system("linux-nvidia-rtx4070-550")) == 11852 * MIB
    assert gpu_vram_free("rocm", _system("linux-nvidia-rtx4070-550")) is None  # no AMD GPU there
    assert gpu_vram_free("metal", _system("linux-nvidia-rtx4070-550")) is None
    assert gpu_vram_free("cuda", _system("windows-nvidia-rtx4060-591")) == (8188 - 660) * MIB  # Windows: nvidia-smi


def test_of_several_gpus_the_least_free_is_taken():
    # ggml's device order is not the PCI order (CUDA's puts the fastest first): never more than any has.
    report = detect(_system("linux-nvidia-8x-b200-580"), home=None)
    frees = [g.vram_free for g in report.gpus]
    assert len(frees) == 8 and len(set(frees)) > 1
    assert gpu_vram_free("cuda", _system("linux-nvidia-8x-b200-580")) == min(frees)


def test_a_machine_without_the_backends_gpu_leaves_it_unknown():
    assert gpu_vram_free("cuda", _system("linux-cpu-pentium-e5700-no-avx")) is None
    assert gpu_vram_free("cpu", _system("linux-nvidia-rtx4070-550")) is None


def test_known_free_vram_keeps_the_weights_on_the_gpu_where_unknown_offloads(probe_model):
    # issue 26: "keep weights on the GPU when they fit, offload when not". The SD 1.x probe's shapes at
    # f16 (2 GB) at 512x512 on the captured RTX 4070 (11.6 GiB free) fit: weights stay in VRAM.
    probe = probe_model
    free = gpu_vram_free("cuda", _system("linux-nvidia-rtx4070-550"))
    known = plan_for_files([probe.model], 512, 512, 1, EngineOptions(), gpu=True, ram_free=16 << 30, vram_free=free)
    assert known.offload_to_cpu is False and known.vram_free == free
    unknown = plan_for_files([probe.model], 512, 512, 1, EngineOptions(), gpu=True, ram_free=16 << 30, vram_free=None)
    assert unknown.offload_to_cpu is True
    small = plan_for_files([probe.model], 512, 512, 1, EngineOptions(), gpu=True, ram_free=16 << 30, vram_free=1 << 30)
    assert small.offload_to_cpu is True  # 1 GiB free: the weights go to RAM


def test_generate_plans_with_the_machines_free_vram(cpu_runtime, probe_model, monkeypatch, tmp_path):
    # The wiring: the core's generate hands the engine the machine it is given (a replayed RTX 4070: a
    # System an app injects), and the worker is started with the weights kept in VRAM. A CUDA runtime
    # cannot exist here: the CPU build's folder is named a cuda runtime (it has no outside libraries to
    # check), and the worker's start is where the test stops, with the options it would have been given.
    import dataclasses

    from accelstack.engine.worker.protocol import GenerateRequest

    probe = probe_model
    started = {}

    class Stop(BaseException):
        """Where the test stops: nothing would run on this machine's missing GPU."""

    def supervisor(runtime, model=None, options=None, **kw):
        started.update(options=options)
        raise Stop

    monkeypatch.setattr(generation, "Supervisor", supervisor)
    cuda = dataclasses.replace(cpu_runtime, backend="cuda")
    with pytest.raises(Stop):
        direct.generate(cuda, probe.path, GenerateRequest(prompt="a lighthouse", width=512, height=512),
                        tmp_path / "out.png", system=_system("linux-nvidia-rtx4070-550"))
    assert started["options"].offload_to_cpu is False  # 2 GB of weights fit in the 11.6 GiB free
    started.clear()
    with pytest.raises(Stop):  # the engine alone, told nothing of the machine: unknown VRAM, weights offloaded
        generation.generate(cuda, probe.path, GenerateRequest(prompt="a lighthouse", width=512, height=512),
                            tmp_path / "out.png")
    assert started["options"].offload_to_cpu is True
