"""The resolver's view of a HardwareReport: facts parsed once, GPUs grouped and ranked.

Identical GPUs (four TITAN X on one driver) form one device group, so a choice is made once for
them; groups are ranked for "which device runs the work": discrete before integrated, then more
memory. That ranking, with the words for why, is what a mixed-vendor machine's plan shows.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from packaging.version import InvalidVersion, Version

from ..domain import ApiName
from ..hardware.report import GPU, HardwareReport, VulkanDevice

__all__ = ["Device", "GiB", "Machine", "cc_parts", "cuda_kernels_for", "gib", "is_jetson", "kind_rank", "l4t_of",
           "machine_of", "slots", "sm_name", "version_of", "version_or_none", "visible_devices_env", "why_not_device",
           "why_preferred"]

GiB = 1024 ** 3
_ARCH = {"amd64": "x86_64", "x86_64": "x86_64", "x64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}
_KIND_RANK = {"discrete": 0, "unknown": 1, "integrated": 2}
_VENDOR_TEXT = {"nvidia": "NVIDIA", "amd": "AMD", "intel": "Intel", "apple": "Apple"}


@functools.lru_cache(maxsize=512)
def version_of(text: str) -> Version:
    """A version from checked manifest data (parsed once per distinct text)."""
    return Version(text)


@functools.lru_cache(maxsize=512)
def version_or_none(text: str) -> Optional[Version]:
    text = (text or "").strip()
    if not text:
        return None
    try:
        return Version(text)
    except InvalidVersion:
        m = re.match(r"^(\d+(?:\.\d+)*)", text)
        return Version(m.group(1)) if m else None


@functools.lru_cache(maxsize=256)
def cc_parts(cc: str) -> Optional[Tuple[int, int]]:
    m = re.match(r"^(\d+)\.(\d+)$", (cc or "").strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def sm_name(cc: str) -> str:
    parts = cc_parts(cc)
    return f"sm_{parts[0]}{parts[1]}" if parts else f"sm_{cc}"


def gib(n: Optional[int]) -> str:
    if not n:
        return "? GiB"
    v = n / GiB
    return f"{v:.0f} GiB" if v >= 10 else f"{v:.1f} GiB".replace(".0 GiB", " GiB")


@dataclass
class Device:
    """One GPU, or several identical ones, as a target for a build."""

    gpus: List[GPU]
    rank: int = 0

    @property
    def first(self) -> GPU:
        return self.gpus[0]

    @property
    def indexes(self) -> List[int]:
        return [g.index for g in self.gpus]

    @property
    def vendor(self) -> str:
        return self.first.vendor

    @property
    def kind(self) -> str:
        return self.first.kind

    @property
    def name(self) -> str:
        return self.first.name or f"{_VENDOR_TEXT.get(self.vendor, self.vendor)} GPU"

    @property
    def cc(self) -> str:
        return self.first.compute_capability

    @property
    def gfx(self) -> str:
        return self.first.gfx_target

    @property
    def vram(self) -> int:
        return self.first.vram_total or 0

    @functools.cached_property
    def cuda_max(self) -> Optional[Version]:
        return version_or_none(self.first.cuda_driver_version)

    @functools.cached_property
    def driver(self) -> Optional[Version]:
        """The NVIDIA desktop driver version; None for other vendors and for Jetson (L4T numbers, or
        a Tegra driver such as "540.3.0" that the desktop driver tables do not describe)."""
        v = version_or_none(self.first.driver_version)
        if v is None or self.vendor != "nvidia" or v.major < 100 or self.jetson:  # "35.3.1" is an L4T release
            return None
        return v

    @property
    def jetson(self) -> bool:
        return is_jetson(self.first)

    @property
    def l4t(self) -> str:
        return l4t_of(self.first)

    @property
    def label(self) -> str:
        idx = self.indexes
        if len(idx) == 1:
            return f"GPU {idx[0]} {self.name}"
        span = f"{idx[0]}-{idx[-1]}" if idx == list(range(idx[0], idx[-1] + 1)) else ",".join(map(str, idx))
        return f"GPUs {span} {len(idx)}x {self.name}"

    def describe(self) -> str:
        bits = [self.kind if self.kind != "unknown" else "", gib(self.vram) if self.vram else ""]
        return ", ".join(b for b in bits if b)


@dataclass
class Machine:
    """Facts from a HardwareReport in the form the resolver compares."""

    report: HardwareReport
    os: str
    arch: str
    platforms: List[str]  # matrix platform keys, most specific first ("wsl-x86_64", "linux-x86_64")
    python: Optional[Version]
    python_text: str
    glibc: Optional[Version]
    musl: bool
    macos: Optional[Version]
    windows_build: Optional[int]
    devices: List[Device] = field(default_factory=list)

    @property
    def platform(self) -> str:
        return self.platforms[-1]

    @property
    def driver_os(self) -> str:
        """Whose NVIDIA driver table applies: under WSL2 the driver is the Windows host's."""
        return "windows" if self.os == "windows" or self.report.os.wsl else "linux"

    def api_usable(self, name: ApiName, gpu: Optional[int] = None) -> Optional[bool]:
        """True/False as the report says; None when the report has no entry for the API."""
        api = self.report.api(name)
        if api is None:
            return None
        if not api.usable:
            return False
        return gpu is None or not api.gpus or gpu in api.gpus

    def api_evidence(self, name: ApiName, gpu: Optional[GPU] = None) -> str:
        """Detection's evidence about API ``name`` (about ``gpu`` only, without its "GPU n name: " prefix)."""
        api = self.report.api(name)
        if not api or not api.evidence:
            return ""
        if gpu is None:
            return "; ".join(api.evidence)
        prefix = f"GPU {gpu.index} {gpu.name}: "
        mine = [e[len(prefix):] for e in api.evidence if e.startswith(prefix)]
        return "; ".join(mine or api.evidence)

    def vulkan_indexes(self, gpus: Sequence[int]) -> List[int]:
        """The Vulkan loader's indexes (what ``GGML_VK_VISIBLE_DEVICES`` takes) of the devices detection
        linked to the report's GPUs ``gpus``, in the loader's order; [] when none was linked."""
        return [d.index for d in self.report.vulkan_devices if d.gpu is not None and d.gpu in gpus]

    def cpu_vulkan_devices(self) -> List[VulkanDevice]:
        """Vulkan devices that run on the processor (Mesa's lavapipe/llvmpipe, SwiftShader): they
        can run a Vulkan build but are no accelerator, so they are never linked to a GPU."""
        return [d for d in self.report.vulkan_devices if d.type == "cpu"]

    def vendor_gpus(self, vendor: str) -> List[GPU]:
        return [g for g in self.report.gpus if g.vendor == vendor]

    def ordinals(self, vendor: str, chosen: List[int], api: Optional[ApiName] = None) -> List[int]:
        """Positions of ``chosen`` among the vendor's GPUs as that vendor's runtime numbers them.

        With an API entry listing GPUs, its order is used (detection lists them as the runtime
        enumerates them); otherwise PCI bus order, which is what ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
        and ROCm use.
        """
        entry = self.report.api(api) if api else None
        if entry is not None and entry.gpus:
            order = [i for i in entry.gpus]
        else:
            gpus = self.vendor_gpus(vendor)
            if all(g.bus_id for g in gpus):
                gpus = sorted(gpus, key=lambda g: g.bus_id)
            order = [g.index for g in gpus]
        return [order.index(i) for i in chosen if i in order]


def is_jetson(gpu: GPU) -> bool:
    """Jetson's integrated Tegra GPU as detection reports it (driver "nvgpu", or an L4T release)."""
    if gpu.vendor != "nvidia" or gpu.kind != "integrated":
        return False
    return gpu.driver == "nvgpu" or bool(getattr(gpu, "l4t_version", ""))


def l4t_of(gpu: GPU) -> str:
    """The L4T release of a Jetson GPU: detection's field, else an L4T-style driver version ("35.3.1")."""
    l4t = str(getattr(gpu, "l4t_version", "") or "")
    if l4t:
        return l4t
    drv = gpu.driver_version or ""
    head = drv.split(".")[0]
    return drv if head.isascii() and head.isdigit() and 30 <= int(head) < 100 else ""


def _group_key(g: GPU) -> tuple:
    return (g.vendor, g.name, g.kind, g.compute_capability, g.gfx_target, g.driver_version, g.vram_total)


def machine_of(report: HardwareReport, python: str = "") -> Machine:
    os_name = (report.os.name or "").lower()
    arch = _ARCH.get((report.os.arch or "").lower(), (report.os.arch or "").lower())
    plats = [f"{os_name}-{arch}"]
    if report.os.wsl:
        plats.insert(0, f"wsl-{arch}")
    py_text = python or report.os.python_version or ""
    py = version_or_none(py_text)
    if py is not None:
        py = Version(f"{py.major}.{py.minor}" if len(py.release) >= 2 else f"{py.major}.0")
    libc = (report.os.libc or "").lower()
    win_build = None
    if os_name == "windows":
        parts = (report.os.version or "").split(".")
        if len(parts) >= 3 and parts[2].isascii() and parts[2].isdigit():
            win_build = int(parts[2])
    m = Machine(
        report=report,
        os=os_name,
        arch=arch,
        platforms=plats,
        python=py,
        python_text=f"{py.major}.{py.minor}" if py else "",
        glibc=version_or_none(report.os.libc_version) if os_name == "linux" and libc in ("glibc", "") else None,
        musl=os_name == "linux" and libc == "musl",
        macos=version_or_none(report.os.version) if os_name == "macos" else None,
        windows_build=win_build,
    )
    groups: Dict[tuple, List[GPU]] = {}
    for g in report.gpus:
        if g.vendor not in ("nvidia", "amd", "intel", "apple"):
            continue  # BMC and virtual display adapters run nothing
        groups.setdefault(_group_key(g), []).append(g)
    devices = [Device(gpus=sorted(gs, key=lambda g: g.index)) for gs in groups.values()]
    devices.sort(key=lambda d: (_KIND_RANK.get(d.kind, 1), -d.vram, -len(d.gpus), d.indexes[0]))
    for i, d in enumerate(devices):
        d.rank = i
    m.devices = devices
    return m


def why_preferred(top: Device, other: Device) -> str:
    """Why ``top`` ranks above ``other``, in words."""
    if _KIND_RANK.get(top.kind, 1) < _KIND_RANK.get(other.kind, 1):
        return f"{top.kind} GPU over {other.kind}" if other.kind != "unknown" else f"{top.kind} GPU"
    if top.vram > other.vram:
        return f"more memory ({gib(top.vram)} vs {gib(other.vram)})"
    if len(top.gpus) > len(other.gpus):
        return f"{len(top.gpus)} GPUs vs {len(other.gpus)}"
    return "listed first"


def kind_rank(dev: Optional[Device]) -> int:
    return 9 if dev is None else _KIND_RANK.get(dev.kind, 1)


def slots(devices: List[Device], tiers: List[List[str]]) -> List[Tuple[int, Optional[Device], str]]:
    """(tier, device, backend) in preference order.

    Discrete GPUs come before integrated ones whatever their backend (a discrete Arc on Vulkan
    beats an integrated Radeon on ROCm); among GPUs of one kind the backend tier decides first
    (CUDA on one card beats DirectML on a bigger one), then the device rank. The CPU comes last.
    """
    out: List[Tuple[int, Optional[Device], str]] = []
    for cls in sorted({kind_rank(d) for d in devices}):
        for ti, tier in enumerate(tiers):
            for d in devices:
                if kind_rank(d) == cls:
                    out.extend((ti, d, b) for b in tier)
    for ti, tier in enumerate(tiers):
        out.extend((ti, None, b) for b in tier)
    return out


def why_not_device(dev: Optional[Device], tier: int, text: str, chosen_dev: Optional[Device], chosen_tier: int,
                   chosen_text: str) -> str:
    """Why a build for ``dev`` lost to the chosen one on another device or backend (both stacks)."""
    if dev is None:
        return "a GPU build was found"
    if chosen_dev is not None and dev is not chosen_dev and kind_rank(chosen_dev) < kind_rank(dev):
        return f"{chosen_dev.label} is preferred ({why_preferred(chosen_dev, dev)})"
    if tier != chosen_tier or dev is chosen_dev:
        return f"{chosen_text} ranks above {text}"
    if chosen_dev is not None:
        return f"{chosen_dev.label} is preferred ({why_preferred(chosen_dev, dev)})"
    return "ranks lower"


# -- what a build needs from the machine's devices ---------------------------------------------
def cuda_kernels_for(cc: str, sm: Sequence[str], ptx: Sequence[str]) -> Optional[str]:
    """How a GPU of compute capability ``cc`` runs a CUDA build, or None when it cannot (cached)."""
    return _kernels(cc, tuple(sm), tuple(ptx))


@functools.lru_cache(maxsize=1024)
def _kernels(cc: str, sm: Tuple[str, ...], ptx: Tuple[str, ...]) -> Optional[str]:
    """How a GPU of compute capability ``cc`` runs a CUDA build, or None when it cannot.

    Device code (SASS) for X.y runs on X.z with z >= y; "X.ya" (arch-specific) code only on X.y;
    PTX for X.y is JIT-compiled on any GPU of compute capability X.y or newer.
    """
    gpu = cc_parts(cc)
    if gpu is None:
        return None
    best: Optional[Tuple[int, int, str]] = None
    for s in sm:
        specific = s.endswith("a")
        parts = cc_parts(s.rstrip("a"))
        if parts is None:
            continue
        ok = parts == gpu if specific else (parts[0] == gpu[0] and parts[1] <= gpu[1])
        if ok and (best is None or parts > best[:2]):
            best = (parts[0], parts[1], f"sm_{parts[0]}{parts[1]}{'a' if specific else ''}")
    if best:
        return best[2]
    for p in sorted(ptx, key=lambda t: cc_parts(t.rstrip("a")) or (0, 0), reverse=True):
        parts = cc_parts(p.rstrip("a"))
        if parts is not None and parts <= gpu:
            return f"compute_{parts[0]}{parts[1]} (PTX, compiled on first use)"
    return None


def visible_devices_env(machine: Machine, vendor: str, chosen: List[int], api: ApiName) -> Dict[str, str]:
    """The variables that keep a runtime on ``chosen`` when the vendor has other GPUs too."""
    all_gpus = [g.index for g in machine.vendor_gpus(vendor)]
    if not chosen or set(chosen) >= set(all_gpus):
        return {}
    ordinals = ",".join(map(str, machine.ordinals(vendor, chosen, api)))
    if vendor == "nvidia":
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ordinals}
    if vendor == "amd":
        return {"HIP_VISIBLE_DEVICES": ordinals}
    if vendor == "intel":
        return {"ZE_AFFINITY_MASK": ordinals}
    return {}
