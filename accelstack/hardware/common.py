"""Helpers shared by the per-OS probes: safe reads, problem recording, nvidia-smi parsing."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ..domain import GpuKind, Severity
from ..errors import Action
from . import tables
from .protocol import DEFAULT_TIMEOUT, CommandResult, RunningCommand, System
from .report import GPU, Problem, Record

__all__ = ["MIB", "NVIDIA_NO_DEVICES", "NVIDIA_SMI_QUERY", "NVIDIA_SMI_QUERY_OLD", "Probe", "SmiGPU", "check_driver_age", "classify_kind",
           "fill_nvidia", "newest_usable_branch", "norm_bus_id", "nvidia_driver_hint", "parse_smi_csv", "query_nvidia_smi"]

NVIDIA_SMI_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,pci.bus_id,name,memory.total,memory.free,driver_version,compute_cap",
    "--format=csv,noheader,nounits",
]
NVIDIA_SMI_QUERY_OLD = [  # drivers before ~510 reject the compute_cap field
    "nvidia-smi",
    "--query-gpu=index,pci.bus_id,name,memory.total,memory.free,driver_version",
    "--format=csv,noheader,nounits",
]
MIB = 1024 * 1024
# the problem of a loaded NVIDIA driver that initialized no GPU: CUDA cannot run until it does
NVIDIA_NO_DEVICES = "nvidia_gpu_not_initialized"


@dataclass(eq=False, repr=False)  # Record's == and repr
class Probe(Record):
    """What a per-OS probe accumulates: the system to ask, and problems found on the way."""

    system: System
    problems: List[Problem] = field(default_factory=list)
    timeout: float = DEFAULT_TIMEOUT
    _said: Dict[int, str] = field(default_factory=dict)  # id(problem) -> its message before GPUs were merged in

    def problem(self, code: str, message: str, hint: str = "", severity: Severity = "warning", gpu: Optional[int] = None,
                action: Action = Action.NONE) -> None:
        """Record a problem once. The same problem (code, words, hint) on another GPU joins the first
        one's ``gpus`` instead of repeating it: eight identical GPUs give one problem naming all eight."""
        if any(p.code == code and (p.gpu == gpu or (gpu is not None and gpu in p.gpus)) for p in self.problems):
            return
        if gpu is not None:
            for p in self.problems:
                if (p.code, p.hint, p.severity, p.action) == (code, hint, severity, action) and p.gpus and self._said.get(id(p)) == message:
                    p.gpus.append(gpu)
                    p.message = f"{message} (GPUs {', '.join(str(i) for i in p.gpus)})"
                    return
        added = Problem(code=code, message=message, hint=hint, severity=severity, gpu=gpu, action=action, gpus=[gpu] if gpu is not None else [])
        self._said[id(added)] = message
        self.problems.append(added)

    def read(self, path: str) -> Optional[str]:
        """File text, or None when missing; unreadable files become a problem, not a crash."""
        try:
            return self.system.read_text(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (13, 1):  # EACCES, EPERM
                self.problem("unreadable", f"cannot read {path}: {exc.strerror}", "run detection as a user that can read it", "info")
            return None

    def read_line(self, path: str) -> str:
        text = self.read(path)
        return text.strip() if text else ""

    def list_dir(self, path: str) -> List[str]:
        try:
            return self.system.list_dir(path)
        except OSError:
            return []

    def run(self, argv: List[str], what: str) -> CommandResult:
        return self.checked(self.system.run(argv, self.timeout), what)

    def start(self, argv: List[str], what: str) -> RunningCommand:
        """:meth:`run`, collected later with ``result()`` (the problem of a hung command is said then)."""
        return _Started(self, self.system.start(argv, self.timeout), what)

    def checked(self, result: CommandResult, what: str) -> CommandResult:
        """``result``, with a problem when the command did not answer in time."""
        if result.timed_out:
            self.problem(
                f"{what}_hung",
                f"`{' '.join(result.argv[:2])}` did not answer within {self.timeout:g} s",
                "a wedged GPU or driver often causes this: reboot, or reload the driver",
                "error",
            )
        return result


class _Started:
    def __init__(self, probe: Probe, running: RunningCommand, what: str) -> None:
        self.probe, self.running, self.what = probe, running, what

    def result(self) -> CommandResult:
        return self.probe.checked(self.running.result(), self.what)


def norm_bus_id(bus: str) -> str:
    """'00000000:2D:00.0' / '2d:00.0' / 'PCI bus 45, device 0, function 0' -> '0000:2d:00.0'."""
    b = bus.strip().lower()
    m = re.search(r"([0-9a-f]{4,8}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])", b)
    if m:
        return f"{int(m.group(1), 16):04x}:{m.group(2)}:{m.group(3)}.{m.group(4)}"
    m = re.search(r"\b([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])\b", b)
    if m:
        return f"0000:{m.group(1)}:{m.group(2)}.{m.group(3)}"
    m = re.search(r"bus (\d+), device (\d+), function (\d+)", b)
    if m:
        return f"0000:{int(m.group(1)):02x}:{int(m.group(2)):02x}.{int(m.group(3))}"
    return ""


def _num(text: str) -> Optional[float]:
    try:
        return float(text.strip())
    except ValueError:
        return None


@dataclass(eq=False, repr=False)  # Record's == and repr
class SmiGPU(Record):
    """One row of ``nvidia-smi --query-gpu`` (sizes in bytes)."""

    index: int
    bus_id: str
    name: str
    vram_total: Optional[int]
    vram_free: Optional[int]
    driver_version: str
    compute_capability: str


def parse_smi_csv(text: str) -> List[SmiGPU]:
    """Rows of our ``--query-gpu`` CSV; malformed rows are skipped, never fatal."""
    out: List[SmiGPU] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 6 or not (parts[0].isascii() and parts[0].isdigit()):
            continue
        total, free = _num(parts[3]), _num(parts[4])
        cc = parts[6] if len(parts) > 6 and re.fullmatch(r"\d+\.\d+", parts[6]) else ""
        driver = parts[5] if re.fullmatch(r"[\d.]+", parts[5]) else ""
        out.append(
            SmiGPU(
                index=int(parts[0]),
                bus_id=norm_bus_id(parts[1]),
                name=parts[2],
                vram_total=int(total * MIB) if total is not None else None,
                vram_free=int(free * MIB) if free is not None else None,
                driver_version=driver,
                compute_capability=cc,
            )
        )
    return out


def query_nvidia_smi(probe: Probe, exe: str = "nvidia-smi") -> Optional[List[SmiGPU]]:
    """Ask nvidia-smi (query mode; ``exe`` names the program or its path). None when it is absent or
    failed (a problem says why)."""
    res = probe.run([exe, *NVIDIA_SMI_QUERY[1:]], "nvidia_smi")
    if res.missing or res.timed_out:
        return None
    text = res.stdout + res.stderr
    if res.returncode != 0 and "compute_cap" in text and "not a valid field" in text.lower():
        res = probe.run([exe, *NVIDIA_SMI_QUERY_OLD[1:]], "nvidia_smi")
        text = res.stdout + res.stderr
    if res.ok:
        rows = parse_smi_csv(res.stdout)
        if rows:
            return rows
        probe.problem("nvidia_smi_garbage", "nvidia-smi printed output that could not be understood", "run `nvidia-smi` by hand; reinstall the NVIDIA driver if it fails", "warning")
        return None
    if "version mismatch" in text.lower():
        probe.problem(
            "nvidia_driver_library_mismatch",
            "nvidia-smi: NVML driver/library version mismatch (the loaded kernel module and the installed user-space driver differ)",
            "reboot after a driver update, or reinstall one consistent NVIDIA driver version",
            "error",
            action=Action.UPDATE_DRIVER,
        )
    elif "no devices were found" in text.lower():
        # the driver answered (nvidia-smi could not talk to it otherwise) but initialized no GPU: its
        # kernel log says why (RmInitAdapter failed, GSP firmware); installing a driver fixes nothing
        probe.problem(
            NVIDIA_NO_DEVICES,
            "the NVIDIA driver is loaded, but it could not initialize the GPU (nvidia-smi: \"No devices were found\")",
            "`sudo dmesg | grep NVRM` shows why (\"RmInitAdapter failed\", \"Cannot initialize GSP firmware RM\"); with NVIDIA's "
            "open kernel modules, try the proprietary kernel module of the same version, which can also run without GSP "
            "firmware (NVreg_EnableGpuFirmware=0); otherwise power the machine off fully and check the GPU's power and seating",
            "error",
        )
    elif "couldn't communicate with the nvidia driver" in text.lower():
        probe.problem(
            "nvidia_driver_not_loaded",
            "nvidia-smi cannot talk to the NVIDIA driver",
            "install the NVIDIA proprietary driver (and reboot) so that CUDA can be used",
            "error",
            action=Action.UPDATE_DRIVER,
        )
    else:
        first = (text.strip().splitlines() or ["no output"])[0][:200]
        probe.problem("nvidia_smi_failed", f"nvidia-smi failed (exit {res.returncode}): {first}", "run `nvidia-smi` by hand to see why", "warning")
    return None


def fill_nvidia(gpu: GPU, smi: Optional[SmiGPU], os_name: str) -> None:
    """Complete an NVIDIA GPU from nvidia-smi and the tables."""
    if smi:
        # the driver's own name beats a PCI-database chip name ("TITAN X (Pascal)"); on Windows the
        # WDDM adapter name already is the driver's
        if smi.name and (os_name != "windows" or not gpu.name):
            gpu.name = smi.name
        gpu.vram_total = smi.vram_total or gpu.vram_total
        if smi.vram_total:
            gpu.vram_at_least = None  # the exact size is known now
        gpu.vram_free = smi.vram_free
        gpu.driver_version = smi.driver_version or gpu.driver_version
        if smi.compute_capability:
            gpu.compute_capability = smi.compute_capability
            gpu.sources.append("compute_capability: nvidia-smi")
        gpu.sources.append("vram, driver: nvidia-smi")
    if not gpu.compute_capability and gpu.name:
        gpu.compute_capability = tables.nvidia_compute_capability(gpu.name)
        if gpu.compute_capability:
            gpu.sources.append("compute_capability: name table")
    if not gpu.compute_capability and gpu.pci_device_id:
        chip, gpu.compute_capability = tables.nvidia_chip_by_device_id(gpu.pci_device_id)
        if gpu.compute_capability:
            gpu.sources.append(f"compute_capability: PCI device id ({chip})")
    if gpu.driver_version and not gpu.cuda_driver_version:
        gpu.cuda_driver_version = tables.cuda_for_driver(gpu.driver_version, os_name)


def newest_usable_branch(cc: str, os_name: str = "", os_version: str = "") -> Optional[Tuple[int, str, str]]:
    """(branch, highest CUDA, why) of the newest NVIDIA driver this GPU on this OS can run, when that
    is an old branch: Kepler R470, Maxwell/Pascal/Volta R580 (NVIDIA's architecture matrix), Fermi R390,
    Windows 7/8.1 R470. None: current drivers support it."""
    limits: List[Tuple[int, str, str]] = []
    support = tables.nvidia_support(cc)
    if support:
        arch, branch, cuda = support
        limits.append((int(branch), cuda, f"the last branch for {arch} GPUs (compute capability {cc})"))
    os_limit = tables.nvidia_os_limit(os_name, os_version)
    if os_limit:
        limits.append((int(os_limit[0]), os_limit[1], os_limit[2]))
    return min(limits) if limits else None


def nvidia_driver_hint(cc: str, install: bool = False, os_name: str = "", os_version: str = "") -> str:
    """Which NVIDIA driver to advise for a GPU of compute capability ``cc`` on this OS: never one it
    cannot run (``newest_usable_branch``); a GPU past every current driver is told so."""
    verb = "install the NVIDIA proprietary driver" if install else "update the NVIDIA driver"
    best = newest_usable_branch(cc, os_name, os_version)
    if best is None:
        return f"{verb} (R525 or newer runs CUDA 12 builds, R580 or newer CUDA 13)"
    branch, cuda, why = best
    if branch < 470:
        return (f"no current NVIDIA driver runs this GPU: R{branch} is {why} (CUDA {cuda} at most), too old for current "
                f"CUDA builds; use the CPU or another GPU")
    what = f"{verb}{',' if install else ' to'} the newest R{branch} release"
    if branch < 525:
        return f"{what}: R{branch} is {why} and runs CUDA {cuda} at most, so CUDA 12 builds cannot run here"
    return f"{what}: R{branch} is {why}; later drivers do not support this GPU, and CUDA 13 builds do not run on it"


def check_driver_age(probe: Probe, gpu: GPU, os_name: str, os_version: str = "") -> None:
    """A driver older than the newest one this GPU can run (and too old for CUDA 12) is worth updating;
    the hint names the newest usable branch, never a newer one."""
    if not gpu.driver_version or not gpu.cuda_driver_version or gpu.l4t_version:
        return
    v = tables.parse_version(gpu.driver_version)
    if v is None:
        return
    best = newest_usable_branch(gpu.compute_capability, os_name, os_version)
    if best is None or best[0] >= 525:
        if v.major >= 525:
            return
        message = f"NVIDIA driver {gpu.driver_version} runs CUDA {gpu.cuda_driver_version} at most; current CUDA 12 builds need R525 or newer"
    elif v.major < best[0]:
        message = f"NVIDIA driver {gpu.driver_version} is older than R{best[0]}, the newest driver this GPU can run here"
    else:
        return
    probe.problem("nvidia_driver_old", message, nvidia_driver_hint(gpu.compute_capability, os_name=os_name, os_version=os_version),
                  "warning", gpu.index, action=Action.UPDATE_DRIVER)


def classify_kind(vendor: str, name: str, device_id: str = "", gfx: str = "", bus_id: str = "") -> GpuKind:
    """discrete vs integrated from what we know of the chip (and, for Intel, where it sits on the bus)."""
    if vendor == "apple":
        return "integrated"
    if vendor == "intel":
        if device_id:  # Intel's discrete GPUs are few and listed; every other Intel display device is an iGPU
            return "discrete" if tables.intel_is_discrete_id(device_id, bus_id) else "integrated"
        return tables.intel_generation(name)[1] if name else "integrated"
    if vendor == "amd":
        if gfx:
            return "integrated" if tables.amd_is_integrated(gfx) else "discrete"
        if re.search(r"Radeon\(TM\) Graphics|Radeon Graphics|Vega \d+ Graphics|\d{3}M\b", name, re.I):
            return "integrated"
        return "discrete" if name else "unknown"
    if vendor == "nvidia":
        return "integrated" if tables.nvidia_is_integrated(name) else "discrete"
    return "unknown"
