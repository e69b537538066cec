"""``detect``: run the per-OS probes over a System and assemble the HardwareReport.

The Linux probes read sysfs and procfs; the Vulkan enumeration (a child process that loads every
driver, :mod:`.vulkan_cache`) starts before them and is collected after them. Each stage that
fails becomes a problem in the report, never an exception.
"""
from __future__ import annotations

import importlib
import logging
import time
from pathlib import Path
from typing import Callable, List, Optional, Tuple, TypeVar, Union

from ..errors import Action
from . import assess, linux, vulkan_cache
from .common import Probe
from .live import LiveSystem
from .protocol import DEFAULT_TIMEOUT, PlatformFacts, System
from .report import GPU, CPUInfo, HardwareReport, MemoryInfo, OSInfo

__all__ = ["detect", "HomeRule"]

log = logging.getLogger(__name__)

# the probes of the other systems detection knows, by ``PlatformFacts.os_name``
OTHER_OS_PROBES = {"windows": "accelstack.hardware.windows", "macos": "accelstack.hardware.macos"}
T = TypeVar("T")
#: Where runtimes go on the machine a System looks at (the core's rule for a replayed machine).
HomeRule = Callable[[System, PlatformFacts], Path]

_ARCH = {"amd64": "x86_64", "x86_64": "x86_64", "x64": "x86_64", "aarch64": "arm64", "arm64": "arm64", "armv8": "arm64"}


def _stage(probe: Probe, what: str, fn: Callable[[], T], default: T) -> T:
    """``fn()``, or ``default`` with a problem when it raises.

    Probes parse what drivers and tools print, and a capture from a bug report may hold anything:
    output no parser expected (JSON that is not an object, a version of a million digits) must
    cost that one fact, not the whole detection.
    """
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - any parser failure becomes a reported problem
        log.debug("detection stage %s failed", what, exc_info=True)
        detail = f"{type(exc).__name__}: {exc}"
        if len(detail) > 200:
            detail = detail[:197] + "..."
        probe.problem(f"probe_failed_{what.replace(' ', '_')}", f"could not read {what}: {detail}",
                      "detection went on without it; please report this with a capture of the machine",
                      "warning", action=Action.REPORT_BUG)
        return default


def detect(system: Optional[System] = None, *, home: Union[Path, HomeRule, None], cache: Optional[Path] = None,
           timeout: float = DEFAULT_TIMEOUT, refresh: bool = False, write_cache: bool = True) -> HardwareReport:
    """Look at the machine through ``system`` (default: this machine) and report what is there.

    ``home`` is where runtimes will be installed, so free disk is measured there: a path, a rule
    applied to the machine (:data:`HomeRule`: a replayed Windows capture gets its Windows home), or
    None (not measured). ``cache`` is the folder the Vulkan enumeration is kept in between runs
    (:mod:`.vulkan_cache`; None: always run it), ``refresh`` runs it again whatever is kept there,
    ``write_cache=False`` reads it but keeps nothing new (a dry run touches no file).
    ``timeout`` bounds each external command. Never raises on odd machines: what cannot be read
    becomes a problem in the report."""
    start = time.perf_counter()
    system = LiveSystem() if system is None else system
    facts = system.platform()
    probe = Probe(system, timeout=timeout)
    os_name = facts.os_name
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
    icds: List[str] = []
    level_zero = ""

    if os_name == "linux":
        _stage(probe, "os info", lambda: linux.os_info(probe, info), None)
        report.cpu = _stage(probe, "cpu info", lambda: linux.cpu_info(probe, arch), report.cpu)
        # The Vulkan enumeration (a child loading every driver) starts first and is collected last;
        # its cache key needs the PCI GPUs and the loader, both cheap sysfs reads.
        pci: List[GPU] = _stage(probe, "gpus", lambda: linux.pci_gpus(probe), [])
        report.npus = _stage(probe, "npus", lambda: linux.pci_npus(probe), [])
        no_vulkan: Tuple[str, List[str]] = ("", [])
        report.vulkan_loader, icds = _stage(probe, "vulkan", lambda: linux.vulkan(probe), no_vulkan)
        enumeration = _stage(probe, "vulkan devices", lambda: vulkan_cache.start(
            probe, report.vulkan_loader, facts=facts, gpus=pci, cache=cache, refresh=refresh, write=write_cache), None)
        report.gpus = _stage(probe, "gpus", lambda: linux.gpus(probe, os_name, info.wsl, pci), [])
        if any(g.vendor == "amd" for g in report.gpus):
            report.rocm_version = _stage(probe, "rocm version", lambda: linux.rocm_version(probe), "")
            kfd_ok = _stage(probe, "kfd", lambda: _check_kfd(probe, report), False)
        if enumeration is not None:
            report.vulkan_loader_version, report.vulkan_devices = _stage(
                probe, "vulkan devices", lambda: enumeration.devices(report.gpus), ("", report.vulkan_devices))
        if any(g.vendor == "intel" for g in report.gpus):
            level_zero = _stage(probe, "level zero", lambda: linux.level_zero(probe), "")
        if report.gpus and not report.vulkan_loader and not info.wsl:
            probe.problem(
                "vulkan_loader_missing",
                "no Vulkan loader (libvulkan.so.1) is installed",
                "install your distribution's Vulkan loader and GPU driver package (e.g. libvulkan1 and mesa-vulkan-drivers) to use Vulkan builds",
                "info",
            )
    elif os_name in OTHER_OS_PROBES:  # imported for their own OS only: a Linux detect pays for neither
        other = importlib.import_module(OTHER_OS_PROBES[os_name])
        _stage(probe, f"{os_name} hardware", lambda: other.probe(probe, report), None)
    else:
        probe.problem("unknown_os", f"{facts.system} is not a platform accelstack knows", "only the CPU will be used", "warning")

    if not (report.cpu.physical_cores and report.cpu.logical_cores):
        physical, logical = system.cpu_count()
        report.cpu.physical_cores = report.cpu.physical_cores or physical
        report.cpu.logical_cores = report.cpu.logical_cores or logical
    total, available = system.memory()
    at = _stage(probe, "runtime home", lambda: home(system, facts), None) if callable(home) else home
    where = str(at) if at is not None else ""
    report.memory = MemoryInfo(ram_total=total, ram_available=available, disk_path=where,
                               disk_free=system.disk_free(where) if where else None)

    report.problems = probe.problems  # the same list: the assessment reads what the probes found
    _stage(probe, "accelerator APIs", lambda: assess.add_gpu_apis(report, kfd_ok=kfd_ok, vulkan_icds=icds,
                                                                   level_zero=level_zero), None)
    _stage(probe, "cpu features", lambda: assess.cpu_problems(report, probe.problem), None)
    report.preference = _stage(probe, "preference", lambda: assess.order_preference(report), [])
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
