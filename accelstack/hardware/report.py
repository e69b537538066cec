"""The HardwareReport: facts about a machine, never decisions about what to install.

Every field is plain data so the report round-trips through JSON (``accelstack detect --json``
writes it, ``accelstack plan --hardware report.json`` reads it back). Sizes are bytes, versions
are strings as the vendor prints them, PCI ids are 4 lowercase hex digits. Vendors, GPU kinds and
API names are plain strings too; their ``Literal`` types in ``accelstack.domain`` say which.
"""
from __future__ import annotations

import reprlib
from dataclasses import dataclass, field, fields
from typing import Any, List, Optional, Tuple

from ..domain import ApiName, GpuKind, Severity, Vendor
from ..errors import Action

__all__ = ["REPORT_FORMAT", "AcceleratorAPI", "CPUInfo", "GPU", "HardwareReport", "MemoryInfo", "NPU", "OSInfo", "Preference",
           "Problem", "Record", "VulkanDevice", "VulkanHeap"]

REPORT_FORMAT = 1


class Record:
    """The ``==`` and ``repr`` a dataclass generates, written once: detection's value types are
    ``@dataclass(eq=False, repr=False)`` on this base, compared and printed exactly as with a plain
    ``@dataclass``, so importing detection does not compile two methods per class (1.3 ms of a cold
    ``accelstack detect``, more than the detection itself takes on most machines)."""

    __slots__ = ()
    __hash__ = None  # type: ignore[assignment]  # unhashable, as a dataclass with eq=True

    def _values(self) -> Tuple[Any, ...]:
        return tuple(getattr(self, f.name) for f in fields(self) if f.compare)  # type: ignore[arg-type]

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()

    @reprlib.recursive_repr()
    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.repr)  # type: ignore[arg-type]
        return f"{self.__class__.__qualname__}({shown})"


@dataclass(eq=False, repr=False)  # Record's == and repr
class Problem(Record):
    """Something a person can fix, with the fix. ``code`` is stable for programs to match on.

    ``hint`` says what to do in words; ``action`` says it for programs (an app shows a button, the
    CLI the command to run): ``report-bug`` when only a capture of the machine can tell more.
    """

    code: str
    message: str
    hint: str = ""
    severity: Severity = "warning"
    gpu: Optional[int] = None  # index into HardwareReport.gpus when it concerns one GPU (the first one of ``gpus``)
    action: Action = Action.NONE
    # every GPU it concerns: the same problem on several identical GPUs is reported once, with all of them
    gpus: List[int] = field(default_factory=list)


@dataclass(eq=False, repr=False)  # Record's == and repr
class OSInfo(Record):
    """The operating system and the Python detection ran under."""

    name: str  # "linux" | "windows" | "macos" | other platform.system().lower()
    version: str = ""  # distro/OS release ("Ubuntu 22.04", "10.0.22631", "14.4.1")
    kernel: str = ""
    arch: str = ""  # normalized: "x86_64" | "arm64" | as reported for others
    python_version: str = ""
    libc: str = ""  # "glibc" | "musl" | ""
    libc_version: str = ""
    wsl: bool = False  # running under WSL2 (GPU through /dev/dxg)
    rosetta: bool = False  # an x86_64 process translated on Apple Silicon
    container: str = ""  # "docker" | "podman" | "lxc" | "kubernetes" | "" when none detected


@dataclass(eq=False, repr=False)  # Record's == and repr
class CPUInfo(Record):
    """The processor: vendor, model, core counts, and the instruction-set features builds need."""

    vendor: str = ""  # "intel" | "amd" | "apple" | "arm" | ... (normalized lowercase)
    model: str = ""
    physical_cores: Optional[int] = None
    logical_cores: Optional[int] = None
    features: List[str] = field(default_factory=list)  # normalized, sorted: "avx2", "neon", ...
    x86_64_level: Optional[int] = None  # 1..4 (x86-64-v1..v4); None off x86

    def has(self, feature: str) -> bool:
        return feature in self.features


@dataclass(eq=False, repr=False)  # Record's == and repr
class MemoryInfo(Record):
    """RAM, and the free disk where runtimes will be installed (bytes; None when unknown)."""

    ram_total: Optional[int] = None
    ram_available: Optional[int] = None
    disk_path: str = ""  # where runtimes will be installed
    disk_free: Optional[int] = None


@dataclass(eq=False, repr=False)  # Record's == and repr
class GPU(Record):
    """One GPU: what it is (PCI ids, kind, VRAM), its driver, and each vendor's capability facts."""

    index: int
    vendor: Vendor
    name: str
    pci_vendor_id: str = ""  # "10de"
    pci_device_id: str = ""  # "2684"
    pci_subsystem_id: str = ""  # "vvvv:dddd" of the board maker, when known
    bus_id: str = ""  # "0000:01:00.0" (domain:bus:device.function, lowercase)
    kind: GpuKind = "unknown"
    vram_total: Optional[int] = None  # None when unknown; never a capped or guessed value
    # a lower bound when the exact size is unknown: Windows' AdapterRAM is a 32-bit field that caps at 4 GiB
    vram_at_least: Optional[int] = None
    vram_free: Optional[int] = None
    driver: str = ""  # kernel/OS driver name: "nvidia", "amdgpu", "i915", "xe", "nouveau", ...
    driver_version: str = ""
    # NVIDIA
    compute_capability: str = ""  # "8.9"
    cuda_driver_version: str = ""  # the highest CUDA version the driver supports, "12.4"
    l4t_version: str = ""  # Jetson/Tegra only: the L4T release, "36.3.0" (JetPack follows from it)
    # AMD
    gfx_target: str = ""  # "gfx1100"
    # Windows: the major version of the HIP runtime the Adrenalin driver installed (amdhip64_<N>.dll
    # in the system directory): "7" runs AMD's ROCm builds of PyTorch; "" none found or not Windows
    hip_runtime: str = ""
    # Intel
    intel_generation: str = ""  # "Xe-HPG (Alchemist)", "Gen9.5", ...
    # Apple
    apple_family: str = ""  # "M3 Pro"
    metal_support: str = ""  # "Metal 3"
    sources: List[str] = field(default_factory=list)  # where each fact came from


@dataclass(eq=False, repr=False)  # Record's == and repr
class NPU(Record):
    """A neural processing unit (Intel NPU, AMD XDNA, another PCI processing accelerator): no GPU, so
    never one of ``gpus`` nor in the preference order; listed for apps that can use one (OpenVINO,
    ONNX Runtime's execution providers)."""

    index: int
    vendor: str  # "intel" | "amd" | "other"
    name: str
    pci_vendor_id: str = ""
    pci_device_id: str = ""
    bus_id: str = ""
    driver: str = ""  # the kernel driver bound to it: "intel_vpu", "amdxdna"; "" when none is
    sources: List[str] = field(default_factory=list)


@dataclass(eq=False, repr=False)  # Record's == and repr
class VulkanHeap(Record):
    """One memory heap of a Vulkan device."""

    size: int  # bytes
    device_local: bool  # VK_MEMORY_HEAP_DEVICE_LOCAL_BIT: the device's own memory (VRAM, or RAM on an iGPU/CPU)


@dataclass(eq=False, repr=False)  # Record's == and repr
class VulkanDevice(Record):
    """One physical device as the Vulkan loader enumerates it (what a Vulkan build of ggml can see).

    ``index`` is the loader's enumeration order, the number ``GGML_VK_VISIBLE_DEVICES`` takes.
    ``type`` is Vulkan's device type: a ``cpu`` device (Mesa's lavapipe/llvmpipe) runs on the
    processor and is no accelerator. Ids are lowercase hex as in PCI ids ("10de"); Mesa's software
    drivers use Khronos vendor ids past 0xffff ("10005").
    """

    index: int
    name: str
    type: str  # "discrete" | "integrated" | "virtual" | "cpu" | "other"
    vendor_id: str = ""
    device_id: str = ""
    api_version: str = ""  # the device's Vulkan version, "1.3.230"
    driver_version: str = ""  # decoded per vendor ("550.40.7" for NVIDIA, "0.0.1" for lavapipe)
    driver_name: str = ""  # VkPhysicalDeviceDriverProperties (Vulkan 1.2+): "NVIDIA", "llvmpipe", "radv"
    driver_info: str = ""  # "Mesa 22.3.6 (LLVM 15.0.6)", "550.40.07"
    driver_id: int = 0  # VkDriverId (0: not reported)
    heaps: List[VulkanHeap] = field(default_factory=list)
    gpu: Optional[int] = None  # index into HardwareReport.gpus of the same PCI device, when matched

    __derived__ = ("device_local_bytes",)

    @property
    def device_local_bytes(self) -> int:
        """The memory the device calls its own (the sum of its device-local heaps)."""
        return sum(h.size for h in self.heaps if h.device_local)


@dataclass(eq=False, repr=False)  # Record's == and repr
class AcceleratorAPI(Record):
    """One way to run work on hardware, with why we think it is usable (or not)."""

    name: ApiName
    usable: bool
    version: str = ""  # CUDA driver API version, ROCm version, Vulkan loader, macOS Metal version
    gpus: List[int] = field(default_factory=list)  # GPU indexes it can drive
    evidence: List[str] = field(default_factory=list)


@dataclass(eq=False, repr=False)  # Record's == and repr
class Preference(Record):
    """One entry of the ordered accelerator preference: use ``api`` on ``gpu`` (None: the CPU)."""

    api: ApiName
    gpu: Optional[int]
    reason: str


@dataclass(eq=False, repr=False)  # Record's == and repr
class HardwareReport(Record):
    """What is in a machine: OS, CPU, memory, GPUs, usable accelerator APIs, the order to use them in, and problems."""

    os: OSInfo
    cpu: CPUInfo
    memory: MemoryInfo
    gpus: List[GPU] = field(default_factory=list)
    apis: List[AcceleratorAPI] = field(default_factory=list)
    preference: List[Preference] = field(default_factory=list)
    problems: List[Problem] = field(default_factory=list)
    rocm_version: str = ""  # installed ROCm userspace, "6.2.4"
    vulkan_loader: str = ""  # path of the Vulkan loader found, "" when none
    vulkan_loader_version: str = ""  # the loader's Vulkan version, "1.3.239", when its devices were enumerated
    vulkan_devices: List[VulkanDevice] = field(default_factory=list)  # what the loader enumerates, in its order
    npus: List[NPU] = field(default_factory=list)  # neural processing units: not GPUs, not in the preference
    format_version: int = REPORT_FORMAT
    source: str = "live"  # "live" | "replay:<dir>"
    duration_ms: float = 0.0

    def api(self, name: ApiName) -> Optional[AcceleratorAPI]:
        for a in self.apis:
            if a.name == name:
                return a
        return None

    def gpu(self, index: Optional[int]) -> Optional[GPU]:
        if index is None:
            return None
        for g in self.gpus:
            if g.index == index:
                return g
        return None

    def problem_codes(self) -> List[str]:
        return [p.code for p in self.problems]
