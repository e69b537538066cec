"""Linux (and WSL2): sysfs/procfs first, vendor tools only for what sysfs does not say.

Reads: /sys/bus/pci/devices/*/{class,vendor,device,subsystem_*,boot_vga,driver,mem_info_vram_*},
/sys/module/nvidia/version, /proc/driver/nvidia/version, /sys/class/kfd/kfd/topology/nodes/*/properties,
/dev/kfd, /opt/rocm/.info/version, Vulkan loader and ICD files, /proc/cpuinfo, /etc/os-release,
/proc/version. Spawns only ``nvidia-smi`` (query mode), and only when an NVIDIA GPU is present.
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

from ..errors import Action
from . import tables
from . import vulkan as vulkan_probe
from .common import Probe, SmiGPU, check_driver_age, classify_kind, fill_nvidia, norm_bus_id, nvidia_driver_hint, query_nvidia_smi
from .cpu import parse_proc_cpuinfo
from .report import GPU, NPU, CPUInfo, OSInfo, VulkanDevice

__all__ = ["GPU_CLASSES", "KFD_NODES", "LEVEL_ZERO_LOADERS", "NPU_CLASSES", "PCI_ROOT", "TEGRA_RELEASE", "VULKAN_ICD_DIRS",
           "VULKAN_LOADERS", "cpu_info", "gpus", "jetson_gpu", "kfd_targets", "level_zero", "nvidia_module_version",
           "os_info", "os_release", "pci_gpus", "pci_npus", "rocm_version", "vulkan", "vulkan_devices"]

PCI_ROOT = "/sys/bus/pci/devices"
KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"
TEGRA_RELEASE = "/etc/nv_tegra_release"  # "# R36 (release), REVISION: 3.0, ..." on every L4T system
# PCI classes of display controllers (VGA, XGA, 3D, other) and processing accelerators.
GPU_CLASSES = ("0x0300", "0x0301", "0x0302", "0x0380", "0x1200")
# PCI classes an NPU carries: processing accelerators (Intel NPU), other signal processing controllers (AMD XDNA).
NPU_CLASSES = ("0x12", "0x1180")
VULKAN_LOADERS = (
    "/usr/lib/x86_64-linux-gnu/libvulkan.so.1",
    "/usr/lib/aarch64-linux-gnu/libvulkan.so.1",
    "/usr/lib64/libvulkan.so.1",
    "/usr/lib/libvulkan.so.1",
    "/usr/local/lib/libvulkan.so.1",
)
VULKAN_ICD_DIRS = ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d")
LEVEL_ZERO_LOADERS = (
    "/usr/lib/x86_64-linux-gnu/libze_loader.so.1",
    "/usr/lib64/libze_loader.so.1",
    "/usr/lib/libze_loader.so.1",
)


def os_release(text: str) -> Dict[str, str]:
    """``KEY=value`` / ``KEY="value"`` lines of os-release; a line that is neither is skipped.

    Parsed by hand, not with a regular expression: compiling one costs more than this whole parse,
    on every detection."""
    fields: Dict[str, str] = {}
    for line in text.split("\n"):
        key, sep, value = line.partition("=")
        if not sep or not key or not all(c.isalnum() or c == "_" for c in key):
            continue
        if value.startswith('"'):
            value = value[1:]
        if value.endswith('"'):
            value = value[:-1]
        if '"' not in value:
            fields[key] = value
    return fields


def os_info(probe: Probe, info: OSInfo) -> None:
    text = probe.read("/etc/os-release") or ""
    fields = os_release(text)
    info.version = fields.get("PRETTY_NAME", "") or " ".join(filter(None, [fields.get("NAME"), fields.get("VERSION_ID")]))
    proc_version = probe.read_line("/proc/version")
    info.wsl = "microsoft" in proc_version.lower() or probe.system.exists("/dev/dxg")
    info.container = _container(probe)


def _container(probe: Probe) -> str:
    env = probe.system.env("container") or ""
    if env:
        return env
    if probe.system.env("KUBERNETES_SERVICE_HOST"):
        return "kubernetes"
    if probe.system.exists("/.dockerenv"):
        return "docker"
    if probe.system.exists("/run/.containerenv"):
        return "podman"
    cgroup = probe.read("/proc/1/cgroup") or ""
    for name in ("docker", "kubepods", "lxc", "containerd"):
        if name in cgroup:
            return "kubernetes" if name == "kubepods" else name
    return ""


def cpu_info(probe: Probe, arch: str) -> CPUInfo:
    text = probe.read("/proc/cpuinfo") or ""
    return parse_proc_cpuinfo(text, arch)


def _hexid(text: Optional[str]) -> str:
    t = (text or "").strip().lower()
    return t[2:].zfill(4) if t.startswith("0x") else ""


def _int_file(probe: Probe, path: str) -> Optional[int]:
    text = probe.read_line(path)
    return int(text) if text.isascii() and text.isdigit() else None


def pci_gpus(probe: Probe) -> List[GPU]:
    """Display controllers and accelerators on the PCI bus, from sysfs alone."""
    gpus: List[GPU] = []
    for addr in probe.list_dir(PCI_ROOT):
        base = f"{PCI_ROOT}/{addr}"
        klass = probe.read_line(f"{base}/class").lower()
        if not klass.startswith(GPU_CLASSES):
            continue
        vendor_id = _hexid(probe.read(f"{base}/vendor"))
        vendor = tables.PCI_VENDORS.get(vendor_id, "other")
        if klass.startswith("0x1200") and vendor not in ("amd", "nvidia", "intel"):
            continue  # other accelerators (NPUs, FPGAs) are not GPUs we can drive
        device_id = _hexid(probe.read(f"{base}/device"))
        driver_link = probe.system.readlink(f"{base}/driver")
        if klass.startswith("0x1200") and tables.is_npu(klass, vendor_id, device_id, _driver_name(driver_link)):
            continue  # an NPU (Intel's intel_vpu, AMD's XDNA): reported by pci_npus, never as a GPU
        sub = "{}:{}".format(_hexid(probe.read(f"{base}/subsystem_vendor")), _hexid(probe.read(f"{base}/subsystem_device")))
        known = tables.pci_lookup(vendor_id, device_id)
        listed = tables.intel_name(device_id) if vendor == "intel" and not known else ""
        name = tables.pretty_pci_name(vendor, known[0]) if known else listed or f"{vendor.upper() if vendor != 'other' else 'PCI'} device {vendor_id}:{device_id}"
        gpu = GPU(
            index=len(gpus),
            vendor=vendor,
            name=name,
            pci_vendor_id=vendor_id,
            pci_device_id=device_id,
            pci_subsystem_id=sub if sub != ":" else "",
            bus_id=norm_bus_id(addr) or addr,
            driver=_driver_name(driver_link),
            sources=[f"pci: {base}"],
        )
        # an Intel GPU's kind comes from the platform, an NVIDIA one's from its name (classify_kind), not the database's flag,
        # which calls Meteor Lake's iGPU and the DGX Spark's unified-memory GB10 discrete
        if known and vendor not in ("intel", "nvidia"):
            gpu.kind = "discrete" if known[1] else "integrated"
        vram = _int_file(probe, f"{base}/mem_info_vram_total")
        if vram:
            gpu.vram_total = vram
            used = _int_file(probe, f"{base}/mem_info_vram_used")
            gpu.vram_free = vram - used if used is not None else None
            gpu.sources.append("vram: sysfs mem_info_vram_total")
        gpus.append(gpu)
    return gpus


def _driver_name(link: Optional[str]) -> str:
    return link.rstrip("/").split("/")[-1] if link else ""


def pci_npus(probe: Probe) -> List[NPU]:
    """Neural processing units on the PCI bus (processing accelerators, class 0x12, and the signal
    processing controllers AMD's XDNA NPUs are, 0x1180): what :func:`tables.is_npu` calls one."""
    found: List[NPU] = []
    for addr in probe.list_dir(PCI_ROOT):
        base = f"{PCI_ROOT}/{addr}"
        klass = probe.read_line(f"{base}/class").lower()
        if not klass.startswith(NPU_CLASSES):
            continue
        vendor_id, device_id = _hexid(probe.read(f"{base}/vendor")), _hexid(probe.read(f"{base}/device"))
        driver = _driver_name(probe.system.readlink(f"{base}/driver"))
        if not tables.is_npu(klass, vendor_id, device_id, driver):
            continue
        vendor = tables.PCI_VENDORS.get(vendor_id, "other")
        listed = tables.npu_name(vendor_id, device_id)
        known = tables.pci_lookup(vendor_id, device_id)
        name = listed or (tables.pretty_pci_name(vendor, known[0]) if known else f"{vendor.upper() if vendor != 'other' else 'PCI'} NPU {vendor_id}:{device_id}")
        sources = [f"pci: {base} (class {klass})"] + ([f"npu: bound to {driver}"] if driver else []) + (["name: PCI id (kernel accel driver list)"] if listed else [])
        found.append(NPU(index=len(found), vendor=vendor, name=name, pci_vendor_id=vendor_id, pci_device_id=device_id,
                         bus_id=norm_bus_id(addr) or addr, driver=driver, sources=sources))
    return found


def nvidia_module_version(probe: Probe) -> Tuple[str, str]:
    """(driver version, how we know) from the loaded kernel module, '' when not loaded."""
    version = probe.read_line("/sys/module/nvidia/version")
    if version:
        return version, "/sys/module/nvidia/version"
    text = probe.read("/proc/driver/nvidia/version") or ""
    m = re.search(r"Kernel Module(?: for \w+)?\s+([\d.]+)", text) if text else None
    if m:
        return m.group(1), "/proc/driver/nvidia/version"
    return "", ""


def jetson_gpu(probe: Probe, driver: str) -> Optional[GPU]:
    """Jetson's integrated GPU is not on PCI; the device tree and the L4T release say what it is.

    nvidia-smi is deliberately not asked: on a Jetson it names the GPU "Orin (nvgpu)", prints
    [N/A] for memory and compute capability, and its driver version (540.x on JetPack 6) is no
    desktop driver branch, so the desktop driver -> CUDA table would give a wrong CUDA version.
    """
    model = (probe.read("/proc/device-tree/model") or "").strip("\x00 \n")
    compatible = probe.read("/proc/device-tree/compatible") or ""
    release = probe.read_line(TEGRA_RELEASE)
    family, soc_cc = tables.jetson_soc(compatible)
    l4t_module = bool(re.fullmatch(r"3\d\.\d+(\.\d+)?", driver or ""))  # the nvgpu-era module reports the L4T release
    tegra = bool(family or release or l4t_module or "nvidia,tegra" in compatible or re.search(r"\b(jetson|tegra)", model, re.I))
    if not tegra and not probe.system.exists("/sys/module/nvgpu"):
        return None  # another ARM board (a Raspberry Pi has a device-tree model too)
    l4t, l4t_source = "", ""
    m = re.search(r"R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", release)
    if m:
        l4t, l4t_source = f"{m.group(1)}.{m.group(2)}", TEGRA_RELEASE
    elif l4t_module:
        l4t, l4t_source = driver, "nvidia kernel module version (the L4T release)"
    elif driver:
        l4t = tables.jetson_l4t_from_openrm(driver)
        l4t_source = f"OpenRM module {driver} (JetPack 6 branch)" if l4t else ""
    if model and (not family or re.search(rf"jetson|{re.escape(family.split()[0])}", model, re.I)):
        name = model
    elif family:
        name = f"NVIDIA Jetson {family}" + (f" ({model})" if model else "")
    else:
        name = model or "NVIDIA Jetson"
    gpu = GPU(index=0, vendor="nvidia", name=name, kind="integrated", driver="nvgpu", driver_version=driver or l4t, l4t_version=l4t)
    if soc_cc:
        gpu.compute_capability = soc_cc
        gpu.sources.append("compute_capability: device-tree compatible (SoC)")
    else:
        gpu.compute_capability = tables.nvidia_compute_capability(name)
        if gpu.compute_capability:
            gpu.sources.append("compute_capability: name table")
    gpu.cuda_driver_version = tables.jetson_cuda(l4t) if l4t else ""
    gpu.sources.append("jetson: device tree" + (f"; L4T {l4t} from {l4t_source}" if l4t else ""))
    if not l4t:
        probe.problem(
            "jetson_l4t_unknown",
            f"{name}: the L4T (JetPack) release is unknown, so the CUDA version of this Jetson cannot be told",
            f"run detection on the Jetson's own L4T system, or make {TEGRA_RELEASE} visible (bind-mount it into the container)",
            "warning",
            0,
        )
    return gpu


def kfd_targets(probe: Probe) -> Dict[str, str]:
    """bus id -> gfx target from the kfd topology (authoritative when amdgpu exposes it)."""
    out: Dict[str, str] = {}
    for node in probe.list_dir(KFD_NODES):
        props = probe.read(f"{KFD_NODES}/{node}/properties") or ""
        values = dict(re.findall(r"^(\w+)\s+(-?\d+)$", props, re.M))
        gfx = tables.gfx_from_target_version(int(values.get("gfx_target_version", "0") or 0))
        if not gfx:
            continue
        loc = int(values.get("location_id", "0"))
        domain = int(values.get("domain", "0"))
        bus = f"{domain:04x}:{loc >> 8:02x}:{(loc >> 3) & 0x1f:02x}.{loc & 0x7}"
        out[bus] = gfx
    return out


def rocm_version(probe: Probe) -> str:
    root = probe.system.env("ROCM_PATH") or "/opt/rocm"
    for path in (f"{root}/.info/version", f"{root}/.info/version-dev"):
        text = probe.read_line(path)
        if text:
            return text.split("-")[0]
    return ""


def vulkan(probe: Probe) -> Tuple[str, List[str]]:
    """(loader path or '', ICD manifest names) — what a Vulkan build of ggml needs to start."""
    loader = next((p for p in VULKAN_LOADERS if probe.system.exists(p)), "")
    icds: List[str] = []
    for d in VULKAN_ICD_DIRS:
        icds += [n for n in probe.list_dir(d) if n.endswith(".json")]
    return loader, sorted(set(icds))


def vulkan_devices(probe: Probe, loader: str, gpus: List[GPU]) -> Tuple[str, List[VulkanDevice]]:
    """(loader version, devices) as the Vulkan loader enumerates them, each linked to its GPU;
    nothing without a loader (see :mod:`.vulkan`)."""
    if not loader:
        return "", []
    version, devices = vulkan_probe.enumerate_devices(probe)
    vulkan_probe.match_gpus(devices, gpus)
    return version, devices


def level_zero(probe: Probe) -> str:
    return next((p for p in LEVEL_ZERO_LOADERS if probe.system.exists(p)), "")


def gpus(probe: Probe, os_name: str, wsl: bool, pci: Optional[List[GPU]] = None) -> List[GPU]:
    """Every GPU, completed from the drivers; ``pci`` is what :func:`pci_gpus` found (read again when None)."""
    found = pci_gpus(probe) if pci is None else pci
    nvidia = [g for g in found if g.vendor == "nvidia"]
    driver, driver_src = nvidia_module_version(probe)

    if not found and not wsl and probe.system.platform().machine in ("aarch64", "arm64"):
        jet = jetson_gpu(probe, driver)
        if jet:
            found.append(jet)
            return found

    smi: Optional[List[SmiGPU]] = None
    if nvidia or wsl or driver:
        smi = query_nvidia_smi(probe)
    by_bus = {s.bus_id: s for s in smi or []}

    for g in nvidia:
        if driver:
            g.driver_version = driver
            g.sources.append(f"driver: {driver_src}")
        s = by_bus.get(g.bus_id)
        if s is None and smi and len(smi) == len(nvidia):
            s = smi[nvidia.index(g)]
        fill_nvidia(g, s, os_name)
        g.kind = classify_kind("nvidia", g.name) if g.kind == "unknown" else g.kind
        if g.driver in ("nouveau", "") or (not driver and not s):
            probe.problem(
                "nvidia_driver_not_loaded",
                f"{g.name} has no NVIDIA driver loaded" + (" (it uses nouveau)" if g.driver == "nouveau" else ""),
                nvidia_driver_hint(g.compute_capability, install=True) + "; then reboot so that CUDA can be used",
                "error",
                g.index,
                action=Action.UPDATE_DRIVER,
            )
        elif g.cuda_driver_version:
            check_driver_age(probe, g, os_name)
        elif g.driver_version and not g.cuda_driver_version:
            probe.problem(
                "nvidia_driver_too_old",
                f"NVIDIA driver {g.driver_version} is too old to report a CUDA version",
                nvidia_driver_hint(g.compute_capability),
                "error",
                g.index,
                action=Action.UPDATE_DRIVER,
            )

    if wsl and smi and not nvidia:  # WSL2: the GPU is paravirtualized, only nvidia-smi sees it
        for s in smi:
            g = GPU(index=len(found), vendor="nvidia", name=s.name, bus_id=s.bus_id, driver="dxg", kind="discrete", sources=["wsl2: nvidia-smi"])
            fill_nvidia(g, s, "windows")  # the driver is the Windows host's
            found.append(g)

    if any(g.vendor == "amd" for g in found):
        targets = kfd_targets(probe)
        for g in found:
            if g.vendor != "amd":
                continue
            gfx = targets.get(g.bus_id, "")
            if gfx:
                g.sources.append("gfx: kfd topology")
            else:
                gfx = tables.amd_gfx_target(g.pci_device_id, g.name)
                if gfx:
                    g.sources.append("gfx: device id table")
            g.gfx_target = gfx
            if g.kind == "unknown" or (gfx and tables.amd_is_integrated(gfx)):
                g.kind = classify_kind("amd", g.name, gfx=gfx)
            if g.driver and g.driver != "amdgpu":
                probe.problem("amd_not_amdgpu", f"{g.name} uses the {g.driver} driver, not amdgpu", "ROCm and Vulkan need the amdgpu kernel driver", "warning", g.index)

    for g in found:
        if g.vendor == "intel":
            g.intel_generation, _ = tables.intel_generation_for(g.pci_device_id, g.name)
            if tables.intel_platform(g.pci_device_id):
                g.sources.append("generation: PCI device id (kernel id list)")
            if g.kind == "unknown":
                g.kind = classify_kind("intel", g.name, g.pci_device_id, bus_id=g.bus_id)
        elif g.kind == "unknown":
            g.kind = classify_kind(g.vendor, g.name, g.pci_device_id)
        if g.vendor in ("amd", "intel") and g.driver:
            # amdgpu-dkms (the ROCm kernel driver) and Intel's intel-i915-dkms (the Data Center GPU stack) have their own
            # version; only the in-tree driver's is the kernel's release
            module = probe.read_line(f"/sys/module/{g.driver}/version") if g.driver in ("amdgpu", "i915", "xe") else ""
            g.driver_version = g.driver_version or module or probe.system.platform().release
    return found
