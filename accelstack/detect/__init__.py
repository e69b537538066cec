"""Detection: System -> HardwareReport. Reports facts and problems; never decides what to install.

    report = detect(LiveSystem())                       # this machine
    report = detect(ReplaySystem("captures/laptop"))    # a captured machine, on any OS
"""
from __future__ import annotations

import time
from typing import Optional

from . import assess, linux, macos, windows
from .common import Probe
from .report import CPUInfo, GPU, HardwareReport, MemoryInfo, OSInfo, Problem
from .system import CapturingSystem, LiveSystem, ReplaySystem, System

__all__ = ["detect", "HardwareReport", "GPU", "Problem", "System", "LiveSystem", "ReplaySystem", "CapturingSystem"]

_ARCH = {"amd64": "x86_64", "x86_64": "x86_64", "x64": "x86_64", "aarch64": "arm64", "arm64": "arm64", "armv8": "arm64"}


def default_install_dir(system: System) -> str:
    """Where runtimes go (ACCELSTACK_HOME or platformdirs' data dir); disk space is measured there."""
    home = system.env("ACCELSTACK_HOME")
    if home:
        return home
    import platformdirs

    return platformdirs.user_data_dir("accelstack", appauthor=False)


def detect(system: System, install_dir: Optional[str] = None, timeout: float = 5.0) -> HardwareReport:
    """Look at the machine through ``system`` and report what is there. Never raises on odd machines."""
    start = time.perf_counter()
    facts = system.platform()
    probe = Probe(system, timeout=timeout)
    os_name = {"linux": "linux", "windows": "windows", "darwin": "macos"}.get(facts.system.lower(), facts.system.lower())
    arch = _ARCH.get(facts.machine.lower(), facts.machine.lower())
    info = OSInfo(
        name=os_name,
        kernel=facts.release,
        arch=arch,
        python_version=facts.python_version,
        libc=facts.libc,
        libc_version=facts.libc_version,
    )
    report = HardwareReport(os=info, cpu=CPUInfo(), memory=MemoryInfo())
    kfd_ok: Optional[bool] = None
    icds: list = []
    level_zero = ""

    if os_name == "linux":
        linux.os_info(probe, info)
        report.cpu = linux.cpu_info(probe, arch)
        report.gpus = linux.gpus(probe, os_name, info.wsl)
        if any(g.vendor == "amd" for g in report.gpus):
            report.rocm_version = linux.rocm_version(probe)
            kfd_ok = _check_kfd(probe, report)
        report.vulkan_loader, icds = linux.vulkan(probe)
        if any(g.vendor == "intel" for g in report.gpus):
            level_zero = linux.level_zero(probe)
        if report.gpus and not report.vulkan_loader and not info.wsl:
            probe.problem(
                "vulkan_loader_missing",
                "no Vulkan loader (libvulkan.so.1) is installed",
                "install your distribution's Vulkan loader and GPU driver package (e.g. libvulkan1 and mesa-vulkan-drivers) to use Vulkan builds",
                "info",
            )
    elif os_name == "windows":
        windows.probe(probe, report)
    elif os_name == "macos":
        macos.probe(probe, report)
    else:
        probe.problem("unknown_os", f"{facts.system} is not a platform accelstack knows", "only the CPU will be used", "warning")

    if not (report.cpu.physical_cores and report.cpu.logical_cores):
        physical, logical = system.cpu_count()
        report.cpu.physical_cores = report.cpu.physical_cores or physical
        report.cpu.logical_cores = report.cpu.logical_cores or logical
    total, available = system.memory()
    where = install_dir or default_install_dir(system)
    report.memory = MemoryInfo(ram_total=total, ram_available=available, disk_path=where, disk_free=system.disk_free(where))

    report.problems = probe.problems  # the same list: the assessment reads what the probes found
    assess.add_gpu_apis(report, kfd_ok=kfd_ok, vulkan_icds=icds, level_zero=level_zero)
    assess.cpu_problems(report, probe.problem)
    report.preference = assess.order_preference(report)
    for i, g in enumerate(report.gpus):
        g.index = i
    report.problems = probe.problems
    report.duration_ms = round((time.perf_counter() - start) * 1000, 3)
    return report


def _check_kfd(probe: Probe, report: HardwareReport) -> bool:
    """ROCm needs read-write access to /dev/kfd; say exactly how to get it when we lack it."""
    if not probe.system.exists("/dev/kfd"):
        if any(g.vendor == "amd" and g.driver == "amdgpu" for g in report.gpus):
            msg = "/dev/kfd does not exist"
            hint = "load the amdgpu driver with KFD support" + (" and pass --device /dev/kfd --device /dev/dri to the container" if report.os.container else "")
            probe.problem("kfd_missing", msg, hint, "warning")
        return False
    if not probe.system.access("/dev/kfd", "rw"):
        hint = "add your user to the render and video groups (sudo usermod -aG render,video $USER) and log in again"
        if report.os.container:
            hint = "start the container with --device /dev/kfd --device /dev/dri --group-add video --group-add render"
        probe.problem("kfd_not_writable", "/dev/kfd is not readable and writable by this user, so ROCm cannot use the GPU", hint, "error")
        return False
    return True
