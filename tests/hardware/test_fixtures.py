"""Every replay fixture (a real machine's dump) gives the facts, APIs, order and problems it should."""
from __future__ import annotations

from typing import Any, Dict, Optional

import pytest

from accelstack.domain import SEVERITIES
from accelstack.errors import Action
from accelstack.hardware.report import HardwareReport

from .conftest import CAPTURES, fixture_names, make_fixture, replay

MIB = 1024 * 1024
GIB = 1024 * MIB


def nv(name: str, dev: str, bus: str, driver_version: str, cc: str, cuda: str, vram_mib: Optional[int], **more: Any) -> Dict[str, Any]:
    """An NVIDIA discrete GPU on the proprietary Linux driver."""
    facts = dict(vendor="nvidia", name=name, kind="discrete", pci_vendor_id="10de", pci_device_id=dev, bus_id=bus, driver="nvidia",
                 driver_version=driver_version, compute_capability=cc, cuda_driver_version=cuda,
                 vram_total=vram_mib * MIB if vram_mib else None)
    facts.update(more)
    return facts


# name -> expected facts. "gpus" lists the first GPUs in order (only the keys given are checked);
# "apis" is the exact set of usable APIs; "first" the first preference entry; "problems" the exact codes.
EXPECTED: Dict[str, Dict[str, Any]] = {
    "linux-nvidia-4x-titanx-pascal-418": dict(
        os="linux", arch="x86_64", ngpus=4,
        gpus=[nv("TITAN X (Pascal)", "1b00", "0000:02:00.0", "418.39", "6.1", "10.1", 12196),
              nv("TITAN X (Pascal)", "1b00", "0000:03:00.0", "418.39", "6.1", "10.1", 12196),
              nv("TITAN X (Pascal)", "1b00", "0000:81:00.0", "418.39", "6.1", "10.1", 12196),
              nv("TITAN X (Pascal)", "1b00", "0000:82:00.0", "418.39", "6.1", "10.1", 12196)],
        apis={"cuda", "cpu"}, first=("cuda", 0), problems={"nvidia_driver_old", "vulkan_loader_missing"},
        # one problem for the four identical GPUs, and the newest branch Pascal can run (R580), never a newer one
        problem_gpus={"nvidia_driver_old": [0, 1, 2, 3]}, problem_hint={"nvidia_driver_old": "newest R580 release"},
    ),
    "linux-nvidia-rtx4070-550": dict(
        os="linux", arch="x86_64", ngpus=1,
        gpus=[nv("NVIDIA GeForce RTX 4070", "2786", "0000:2d:00.0", "550.40.07", "8.9", "12.4", 12282, vram_free=11852 * MIB)],
        apis={"cuda", "cpu"}, first=("cuda", 0), problems={"vulkan_loader_missing"},
    ),
    "linux-nvidia-rtx5090-rtx4090-580": dict(
        os="linux", arch="x86_64", ngpus=2,
        gpus=[nv("NVIDIA GeForce RTX 5090", "2b85", "0000:01:00.0", "580.82.09", "12.0", "13.0", 32607),
              nv("NVIDIA GeForce RTX 4090", "2684", "0000:02:00.0", "580.82.09", "8.9", "13.0", 24564)],
        apis={"cuda", "cpu"}, first=("cuda", 0), problems={"vulkan_loader_missing"},
    ),
    "linux-nvidia-8x-h100-550": dict(
        os="linux", arch="x86_64", ngpus=8,
        gpus=[nv("NVIDIA H100 80GB HBM3", "2330", "0000:18:00.0", "550.54.15", "9.0", "12.4", 81559),
              nv("NVIDIA H100 80GB HBM3", "2330", "0000:2a:00.0", "550.54.15", "9.0", "12.4", 81559)],
        apis={"cuda", "cpu"}, first=("cuda", 0), problems={"vulkan_loader_missing"},
    ),
    "linux-nvidia-h200-580-container": dict(  # captured by accelstack on a real H200 (its README)
        os="linux", version="Ubuntu 24.04.3 LTS", arch="x86_64", container="docker", ngpus=1,
        gpus=[nv("NVIDIA H200", "2335", "0000:00:06.0", "580.159.04", "9.0", "13.0", 143771)],
        apis={"cuda", "cpu"}, first=("cuda", 0), problems={"vulkan_loader_missing"},
    ),
    "linux-nvidia-8x-b200-580": dict(
        os="linux", arch="x86_64", ngpus=8,
        gpus=[nv("NVIDIA B200", "2901", "0000:05:00.0", "580.95.05", "10.0", "13.0", 183359, vram_free=16766 * MIB),
              nv("NVIDIA B200", "2901", "0000:06:00.0", "580.95.05", "10.0", "13.0", 183359, vram_free=26363 * MIB)],
        apis={"cuda", "cpu"}, first=("cuda", 0), problems={"vulkan_loader_missing"},
    ),
    "linux-nvidia-nouveau-intel-haswell": dict(
        os="linux", version="Antergos Linux", arch="x86_64", ngpus=2,
        gpus=[dict(vendor="intel", kind="integrated", pci_vendor_id="8086", pci_device_id="0412", bus_id="0000:00:02.0", driver="i915"),
              dict(vendor="nvidia", name="NVIDIA GeForce GTX 1060 6GB", kind="discrete", pci_device_id="1c03", bus_id="0000:01:00.0",
                   driver="nouveau", driver_version="", cuda_driver_version="", compute_capability="6.1")],
        apis={"cpu"}, first=("cpu", None), problems={"nvidia_driver_not_loaded", "vulkan_loader_missing"},
        problem_gpu={"nvidia_driver_not_loaded": 1},
    ),
    "linux-nvidia-driver-library-mismatch-580": dict(
        os="linux", arch="x86_64", ngpus=1,
        gpus=[dict(vendor="nvidia", driver="nvidia", driver_version="580.173.02", cuda_driver_version="13.0", bus_id="0000:01:00.0")],
        apis={"cpu"}, unusable={"cuda"}, first=("cpu", None),
        problems={"nvidia_driver_library_mismatch", "vulkan_loader_missing"},
    ),
    "linux-nvidia-open-555-russian-date": dict(
        os="linux", arch="x86_64", ngpus=1,
        gpus=[nv("NVIDIA GeForce RTX 3080", "2206", "0000:01:00.0", "555.58", "8.6", "12.5", None)],
        apis={"cuda", "cpu"}, first=("cuda", 0), problems={"vulkan_loader_missing"},
    ),
    "linux-nvidia-2x-quadro-rtx4000-535": dict(
        os="linux", arch="x86_64", ngpus=2,
        gpus=[nv("Quadro RTX 4000", "1eb1", "0000:06:00.0", "535.129.03", "7.5", "12.2", 8192),
              nv("Quadro RTX 4000", "1eb1", "0000:07:00.0", "535.129.03", "7.5", "12.2", 8192)],
        apis={"cuda", "cpu"}, first=("cuda", 0), problems={"vulkan_loader_missing"},
    ),
    "linux-nvidia-rtx3090-580-two-part-version": dict(
        os="linux", arch="x86_64", ngpus=1,
        gpus=[nv("NVIDIA GeForce RTX 3090", "2204", "0000:07:00.0", "580.142", "8.6", "13.0", 24576, vram_free=(24576 - 15005) * MIB)],
        apis={"cuda", "cpu"}, first=("cuda", 0), problems={"vulkan_loader_missing"},
    ),
    "wsl2-nvidia-rtx3060-laptop": dict(
        os="linux", version="Ubuntu 22.04", arch="x86_64", wsl=True, kernel="5.15.146.1-microsoft-standard-WSL2", ngpus=1,
        gpus=[dict(vendor="nvidia", name="NVIDIA GeForce RTX 3060 Laptop GPU", kind="discrete", bus_id="0000:01:00.0", driver="dxg",
                   driver_version="546.80", compute_capability="8.6", cuda_driver_version="12.3", vram_total=6144 * MIB)],
        apis={"cuda", "cpu"}, first=("cuda", 0), problems=set(),
    ),
    "linux-amd-2x-rx7900xtx-rocm": dict(
        os="linux", arch="x86_64", ngpus=2,
        gpus=[dict(vendor="amd", kind="discrete", pci_device_id="744c", bus_id="0000:03:00.0", driver="amdgpu", gfx_target="gfx1100", vram_total=24560 * MIB),
              dict(vendor="amd", kind="discrete", pci_device_id="744c", bus_id="0000:09:00.0", driver="amdgpu", gfx_target="gfx1100", vram_total=24560 * MIB)],
        gpu_sources={0: "gfx: kfd topology", 1: "gfx: kfd topology"},
        apis={"rocm", "cpu"}, first=("rocm", 0), problems={"vulkan_loader_missing"},
    ),
    "linux-amd-rx7900xtx-no-rocm": dict(
        os="linux", arch="x86_64", ngpus=1,
        gpus=[dict(vendor="amd", kind="discrete", pci_vendor_id="1002", pci_device_id="744c", pci_subsystem_id="148c:2422",
                   bus_id="0000:03:00.0", driver="amdgpu", gfx_target="gfx1100", vram_total=24560 * MIB)],
        gpu_sources={0: "gfx: device id table"},
        apis={"cpu"}, unusable={"rocm"}, first=("cpu", None), problems={"kfd_missing", "vulkan_loader_missing"}, rocm_version="",
    ),
    # issue 11 (planning's capture): gfx803, which no current ROCm release builds for
    "i11p-linux-amd-ellesmere-gfx803": dict(
        os="linux", arch="x86_64", ngpus=1,
        gpus=[dict(vendor="amd", kind="discrete", pci_device_id="67df", bus_id="0000:01:00.0", driver="amdgpu", gfx_target="gfx803", vram_total=8 * GIB)],
        gpu_sources={0: "gfx: kfd topology"},
        apis={"rocm", "cpu"}, first=("rocm", 0), first_reason="ROCm does not list gfx803", problems={"vulkan_loader_missing"},
    ),
    "linux-amd-780m-apu-docker": dict(
        os="linux", arch="x86_64", container="docker", ngpus=1,
        gpus=[dict(vendor="amd", name="AMD Radeon 740M / 760M / 780M Graphics", kind="integrated", pci_device_id="15bf", driver="amdgpu", gfx_target="gfx1103")],
        apis={"rocm", "cpu"}, first=("rocm", 0), first_reason="HSA_OVERRIDE_GFX_VERSION", problems={"vulkan_loader_missing"},
    ),
    "linux-amd-680m-apu-proxmox": dict(
        os="linux", version="Debian GNU/Linux 12 (bookworm)", arch="x86_64", ngpus=1,
        gpus=[dict(vendor="amd", name="AMD Radeon 680M", kind="integrated", pci_device_id="1681", bus_id="0000:74:00.0", gfx_target="gfx1035")],
        apis={"cpu"}, first=("cpu", None), problems={"kfd_missing", "vulkan_loader_missing"},
    ),
    "container-amd-mi300x-kfd-einval": dict(
        os="linux", version="Ubuntu 22.04.5 LTS", arch="x86_64", container="docker", ngpus=1,
        gpus=[dict(vendor="amd", name="AMD Instinct MI300X", kind="discrete", pci_device_id="74a1", driver="amdgpu", driver_version="6.7.0", gfx_target="gfx942")],
        apis={"cpu"}, unusable={"rocm"}, first=("cpu", None), problems={"kfd_not_writable", "vulkan_loader_missing"}, rocm_version="6.2.1",
        problem_hint={"kfd_not_writable": "--device /dev/kfd"},
    ),
    "linux-intel-arc-a770": dict(
        os="linux", arch="x86_64", kernel="6.17.0-35-generic", ngpus=1,
        gpus=[dict(vendor="intel", name="Intel Arc A770", kind="discrete", pci_vendor_id="8086", pci_device_id="56a0", driver="i915",
                   driver_version="6.17.0-35-generic", intel_generation="Xe-HPG (Alchemist)")],
        apis={"xpu", "cpu"}, first=("xpu", 0), problems={"vulkan_loader_missing"},
    ),
    "linux-cpu-pentium-e5700-no-avx": dict(
        os="linux", arch="x86_64", ngpus=0,
        cpu=dict(vendor="intel", model="Pentium(R) Dual-Core  CPU      E5700  @ 3.00GHz", x86_64_level=1, physical_cores=2, logical_cores=2),
        cpu_has={"sse2", "sse3", "ssse3", "cx16"}, cpu_lacks={"sse4.1", "sse4.2", "popcnt", "avx", "avx2", "fma", "f16c", "avx512f"},
        apis={"cpu"}, first=("cpu", None), first_reason="no AVX2", problems={"no_avx2"},
    ),
    "linux-arm64-graviton1": dict(
        os="linux", arch="arm64", ngpus=0,
        cpu=dict(vendor="arm", x86_64_level=None), cpu_has={"neon"}, cpu_lacks={"dotprod", "sve", "avx2"},
        apis={"cpu"}, first=("cpu", None), problems=set(),
    ),
    "linux-arm64-jetson-orin-nx": dict(
        os="linux", arch="arm64", ngpus=1,
        gpus=[dict(vendor="nvidia", name="NVIDIA Jetson Orin NX Engineering Reference Developer Kit", kind="integrated", driver="nvgpu",
                   driver_version="35.3.1", compute_capability="8.7", cuda_driver_version="11.4", l4t_version="35.3.1")],
        apis={"cuda", "cpu"}, first=("cuda", 0), problems={"vulkan_loader_missing"},
    ),
    # issue 11 (detection): Jetson/Tegra from the device tree and the L4T release
    "i11d-jetson-xavier-jp5": dict(
        os="linux", arch="arm64", ngpus=1,
        gpus=[dict(vendor="nvidia", name="NVIDIA Jetson AGX Xavier Developer Kit", kind="integrated", driver="nvgpu", driver_version="35.4.1",
                   compute_capability="7.2", cuda_driver_version="11.4", l4t_version="35.4.1", vram_total=None)],
        gpu_sources={0: "compute_capability: device-tree compatible (SoC)"},
        apis={"cuda", "cpu"}, first=("cuda", 0), problems={"vulkan_loader_missing"},
    ),
    "i11d-jetson-agx-orin-jp6": dict(
        os="linux", arch="arm64", ngpus=1,
        gpus=[dict(vendor="nvidia", name="NVIDIA Jetson AGX Orin Developer Kit", kind="integrated", driver="nvgpu", driver_version="540.3.0",
                   compute_capability="8.7", cuda_driver_version="12.2", l4t_version="36.3.0", vram_total=None)],
        gpu_sources={0: "compute_capability: device-tree compatible (SoC)"},
        apis={"cuda", "cpu"}, first=("cuda", 0), problems={"vulkan_loader_missing"},
    ),
    "windows7-laptop-intel-hd-quadro-m2000m-441": dict(
        os="windows", version="6.1.7601", arch="x86_64", ngpus=2,
        gpus=[dict(vendor="intel", name="Intel(R) HD Graphics 530", kind="integrated", pci_device_id="191b", driver_version="21.20.16.5076",
                   intel_generation="Gen9 (Skylake)", vram_total=GIB),
              dict(vendor="nvidia", name="NVIDIA Quadro M2000M", kind="discrete", pci_device_id="13b0", bus_id="0000:01:00.0", driver="wddm",
                   driver_version="441.66", compute_capability="5.0", cuda_driver_version="10.2", vram_total=4096 * MIB)],
        apis={"cuda", "vulkan", "cpu"}, unusable={"directml"}, first=("cuda", 1), problems={"nvidia_driver_old"},
        problem_gpu={"nvidia_driver_old": 1}, problem_hint={"nvidia_driver_old": "newest R470 release"},  # Windows 7's last branch
    ),
    "windows-nvidia-gtx1080ti-531": dict(
        os="windows", arch="x86_64", ngpus=1,
        gpus=[dict(vendor="nvidia", name="NVIDIA GeForce GTX 1080 Ti", kind="discrete", pci_device_id="1b06", bus_id="0000:09:00.0", driver="wddm",
                   driver_version="531.14", compute_capability="6.1", cuda_driver_version="12.1", vram_total=11264 * MIB)],
        apis={"cuda", "directml", "vulkan", "cpu"}, first=("cuda", 0), problems=set(),
    ),
    "windows-nvidia-rtx4060-591": dict(
        os="windows", arch="x86_64", ngpus=1,
        gpus=[dict(vendor="nvidia", name="NVIDIA GeForce RTX 4060", kind="discrete", pci_device_id="2882", driver_version="591.86",
                   compute_capability="8.9", cuda_driver_version="13.1", vram_total=8188 * MIB, vram_free=(8188 - 660) * MIB)],
        apis={"cuda", "directml", "vulkan", "cpu"}, first=("cuda", 0), problems=set(),
    ),
    "windows-intel-uhd-cometlake": dict(
        os="windows", arch="x86_64", ngpus=1,
        gpus=[dict(vendor="intel", name="Intel(R) UHD Graphics", kind="integrated", pci_vendor_id="8086", pci_device_id="9bc4",
                   pci_subsystem_id="1043:170d", intel_generation="Gen9.5 (Comet Lake)")],
        apis={"directml", "vulkan", "cpu"}, first=("vulkan", 0), problems=set(),
    ),
    "windows-ryzen-igpu-arc-b580": dict(
        os="windows", arch="x86_64", ngpus=2,
        cpu=dict(vendor="amd", model="AMD Ryzen 7 9800X3D 8-Core Processor", physical_cores=8, logical_cores=16),
        cpu_has={"avx2", "avx512f", "fma", "sse4.2"},
        gpus=[dict(vendor="amd", name="AMD Radeon(TM) Graphics", kind="integrated", pci_device_id="13c0", gfx_target="gfx1036", driver_version="32.0.21033.3005"),
              dict(vendor="intel", name="Intel(R) Arc(TM) B580 Graphics", kind="discrete", pci_device_id="e20b",
                   intel_generation="Xe2-HPG (Battlemage)", vram_total=12 * GIB)],
        apis={"directml", "vulkan", "xpu", "cpu"}, unusable=set(), first=("xpu", 1), problems=set(),
    ),
    # issue 27: Radeon on Windows, the HIP runtime of the Adrenalin driver (amdhip64_<N>.dll)
    "windows-amd-890m-gfx1150-hip7": dict(
        os="windows", version="10.0.26200", arch="x86_64", ngpus=1,
        cpu=dict(vendor="amd", model="AMD Ryzen AI 9 HX 370 w/ Radeon 890M", physical_cores=12, logical_cores=24),
        cpu_has={"avx2", "avx512f"},
        gpus=[dict(vendor="amd", name="AMD Radeon(TM) 890M Graphics", kind="integrated", pci_device_id="150e", gfx_target="gfx1150", hip_runtime="7")],
        apis={"rocm", "directml", "vulkan", "cpu"}, unusable=set(), first=("rocm", 0), problems=set(),
    ),
    "windows-amd-rx7900xtx-hip6": dict(
        os="windows", arch="x86_64", ngpus=1,
        gpus=[dict(vendor="amd", name="AMD Radeon RX 7900 XTX", kind="discrete", pci_device_id="744c", gfx_target="gfx1100", hip_runtime="6", vram_total=24 * GIB)],
        apis={"directml", "vulkan", "cpu"}, unusable={"rocm"}, first=("vulkan", 0), problems={"amd_hip_runtime_old"},
        problem_gpu={"amd_hip_runtime_old": 0}, problem_hint={"amd_hip_runtime_old": "Adrenalin Edition driver to 26.2.2 or newer"},
    ),
    "windows-amd-rx9070xt-gfx1201-hip6": dict(
        os="windows", arch="x86_64", ngpus=1,
        gpus=[dict(vendor="amd", name="AMD Radeon RX 9070 XT", kind="discrete", pci_device_id="7550", gfx_target="gfx1201", hip_runtime="6", vram_total=16 * GIB)],
        apis={"directml", "vulkan", "cpu"}, unusable={"rocm"}, first=("vulkan", 0), problems={"amd_hip_runtime_old"},
    ),
    # issue 11 (detection): Intel generation from the PCI device id
    "i11d-windows-adl-uhd46a3-rtx4060-laptop": dict(
        os="windows", version="10.0.26200", arch="x86_64", ngpus=2,
        cpu=dict(vendor="intel", model="12th Gen Intel(R) Core(TM) i7-12650H", physical_cores=10, logical_cores=16, x86_64_level=3),
        gpus=[dict(vendor="intel", name="Intel(R) UHD Graphics", kind="integrated", pci_device_id="46a3", intel_generation="Xe-LP (Gen12, Alder Lake)"),
              dict(vendor="nvidia", name="NVIDIA GeForce RTX 4060 Laptop GPU", kind="discrete", pci_device_id="28a0", bus_id="0000:01:00.0",
                   driver_version="581.15", compute_capability="8.9", cuda_driver_version="13.0", vram_total=8188 * MIB)],
        gpu_sources={0: "generation: PCI device id (kernel id list)"},
        apis={"cuda", "directml", "vulkan", "cpu"}, first=("cuda", 1), problems=set(),
    ),
    # issue 11 (detection): Windows VRAM past AdapterRAM's 4 GiB cap; NVIDIA driver present with an unknown version
    "i11d-windows-rtx4060-laptop-partial-wmi": dict(
        os="windows", version="10.0.26200", arch="x86_64", ngpus=2,
        gpus=[dict(vendor="intel", name="Intel(R) UHD Graphics", kind="integrated", intel_generation="Xe-LP (Gen12, Alder Lake)", vram_total=128 * MIB),
              dict(vendor="nvidia", name="NVIDIA GeForce RTX 4060 Laptop GPU", kind="discrete", pci_device_id="28a0", driver="wddm",
                   driver_version="", cuda_driver_version="", compute_capability="8.9", vram_total=None, vram_at_least=4293918720)],
        apis={"directml", "vulkan", "cpu"}, unusable={"cuda"}, first=("vulkan", 1), problems={"nvidia_driver_version_unknown"},
        problem_gpu={"nvidia_driver_version_unknown": 1},
    ),
    # issue 27: Core Ultra iGPUs are integrated, NPUs are no GPUs, a GPU the loaded driver could not initialize,
    # an NVIDIA driver version read from the driver's own nvidia-smi.exe, a Kepler card on an old driver
    "linux-intel-meteorlake-7d55-npu": dict(
        os="linux", arch="x86_64", kernel="6.8.0-45-generic", ngpus=1,
        gpus=[dict(vendor="intel", name="Intel Arc Graphics", kind="integrated", pci_device_id="7d55", bus_id="0000:00:02.0", driver="i915",
                   intel_generation="Xe-LPG (Meteor Lake)")],
        apis={"xpu", "cpu"}, first=("xpu", 0), problems={"vulkan_loader_missing"},
    ),
    "linux-amd-phoenix-780m-npu-amdxdna": dict(
        os="linux", arch="x86_64", ngpus=1,
        gpus=[dict(vendor="amd", kind="integrated", pci_device_id="15bf", bus_id="0000:c1:00.0", driver="amdgpu", gfx_target="gfx1103")],
        apis={"cpu"}, first=("cpu", None), problems={"kfd_missing", "vulkan_loader_missing"},
    ),
    "linux-nvidia-no-devices-rtx3090-550": dict(
        os="linux", version="Ubuntu 22.04.5 LTS", arch="x86_64", ngpus=1,
        gpus=[nv("NVIDIA GeForce RTX 3090", "2204", "0000:98:00.0", "550.144.03", "8.6", "12.4", None)],
        apis={"cpu"}, unusable={"cuda"}, first=("cpu", None), problems={"nvidia_gpu_not_initialized", "vulkan_loader_missing"},
        problem_hint={"nvidia_gpu_not_initialized": "dmesg"},
    ),
    "windows-nvidia-rtx4060-laptop-driver-unread-smi-system32": dict(
        os="windows", version="10.0.26200", arch="x86_64", ngpus=2,
        gpus=[dict(vendor="intel", name="Intel(R) UHD Graphics", kind="integrated", pci_device_id="46a3"),
              dict(vendor="nvidia", name="NVIDIA GeForce RTX 4060 Laptop GPU", kind="discrete", pci_device_id="28a0", bus_id="0000:01:00.0",
                   driver_version="581.15", compute_capability="8.9", cuda_driver_version="13.0", vram_total=8188 * MIB)],
        apis={"cuda", "directml", "vulkan", "cpu"}, first=("cuda", 1), problems=set(),
    ),
    # issue 27: the NVIDIA driver version from the registry's DriverVersion (WMI had none, nvidia-smi is nowhere)
    "windows-nvidia-rtx4060-laptop-driver-from-registry": dict(
        os="windows", version="10.0.26200", arch="x86_64", ngpus=2,
        gpus=[dict(vendor="intel", name="Intel(R) UHD Graphics", kind="integrated", pci_device_id="46a3"),
              dict(vendor="nvidia", name="NVIDIA GeForce RTX 4060 Laptop GPU", kind="discrete", pci_device_id="28a0", driver="wddm",
                   driver_version="581.15", compute_capability="8.9", cuda_driver_version="13.0", vram_total=8 * GIB, vram_at_least=None)],
        gpu_sources={1: "driver: registry DriverVersion of the display adapter's driver key (matched by MatchingDeviceId)"},
        apis={"cuda", "directml", "vulkan", "cpu"}, first=("cuda", 1), problems=set(),
    ),
    "linux-nvidia-gtx680-331": dict(
        os="linux", version="Ubuntu 14.04 LTS", arch="x86_64", ngpus=1,
        gpus=[dict(vendor="nvidia", name="GeForce GTX 680", kind="discrete", pci_device_id="1180", driver="nvidia", driver_version="331.38",
                   compute_capability="3.0", cuda_driver_version="")],
        apis={"cpu"}, unusable={"cuda"}, first=("cpu", None), problems={"nvidia_driver_too_old", "vulkan_loader_missing"},
        problem_hint={"nvidia_driver_too_old": "R470"},
    ),
    # issue 42: a GK107 part no name rule knows: its compute capability from the PCI device id; R470 is its branch, no warning
    "linux-nvidia-quadro-k600-gk107-470": dict(
        os="linux", version="Arch Linux", arch="x86_64", ngpus=1,
        gpus=[dict(vendor="nvidia", name="Quadro K600", kind="discrete", pci_device_id="0ffa", driver="nvidia", driver_version="470.223.02",
                   compute_capability="3.0", cuda_driver_version="11.4")],
        gpu_sources={0: "compute_capability: PCI device id (GK107)"},
        apis={"cuda", "cpu"}, first=("cuda", 0), problems={"vulkan_loader_missing"},
    ),
    # issue 42: the DGX Spark's GB10 shares the system's memory: integrated, whatever torchruntime's PCI database flags
    "linux-nvidia-dgx-spark-gb10-580": dict(
        os="linux", version="Ubuntu 24.04.3 LTS", arch="arm64", ngpus=1,
        gpus=[dict(vendor="nvidia", name="NVIDIA GB10", kind="integrated", pci_device_id="2e12", driver="nvidia", driver_version="580.126.09",
                   compute_capability="12.1", cuda_driver_version="13.0", vram_total=None)],
        apis={"cuda", "cpu"}, first=("cuda", 0), problems={"vulkan_loader_missing"},
    ),
    # issue 42: Windows' R595 driver reports CUDA 13.2 (nvidia-smi's header), not R591's 13.1
    "windows-nvidia-rtx4060-laptop-595": dict(
        os="windows", version="10.0.26100", arch="x86_64", ngpus=1,
        gpus=[dict(vendor="nvidia", name="NVIDIA GeForce RTX 4060 Laptop GPU", kind="discrete", pci_device_id="28a0", driver_version="595.79",
                   compute_capability="8.9", cuda_driver_version="13.2", vram_total=8188 * MIB)],
        apis={"cuda", "directml", "vulkan", "cpu"}, first=("cuda", 0), problems=set(),
    ),
    # issue 42: a Data Center GPU Max is named from its PCI id; Intel's DKMS i915 has its own version
    "linux-intel-max1100-pvc-dkms": dict(
        os="linux", version="Rocky Linux 9.4 (Blue Onyx)", arch="x86_64", ngpus=1,
        gpus=[dict(vendor="intel", name="Intel Data Center GPU Max 1100", kind="discrete", pci_device_id="0bda", driver="i915",
                   driver_version="1.24.4.12.240603.18", intel_generation="Xe-HPC (Ponte Vecchio)")],
        apis={"xpu", "cpu"}, first=("xpu", 0), problems={"vulkan_loader_missing"},
    ),
    "macos-apple-m3": dict(
        os="macos", arch="arm64", ngpus=1,
        cpu=dict(vendor="apple", model="Apple M3", x86_64_level=None), cpu_has={"neon", "dotprod", "fp16", "bf16", "i8mm"},
        gpus=[dict(vendor="apple", name="Apple M3", kind="integrated", pci_vendor_id="106b", apple_family="M3", metal_support="Metal 3")],
        apis={"metal", "cpu"}, first=("metal", 0), problems=set(),
    ),
    "macos-apple-m3-pro-truncated-json": dict(
        os="macos", arch="arm64", ngpus=1,
        gpus=[dict(vendor="apple", name="Apple M3 Pro", kind="integrated", pci_vendor_id="106b", apple_family="M3 Pro", metal_support="Metal 3")],
        apis={"metal", "cpu"}, first=("metal", 0), problems=set(),
    ),
    # issue 11 (detection): system_profiler of every macOS era
    "i11d-macos11-m1-json-khw-key": dict(
        os="macos", arch="arm64", ngpus=1,
        gpus=[dict(vendor="apple", name="Apple M1", kind="integrated", pci_vendor_id="106b", apple_family="M1", metal_support="Metal 2 (Apple7)")],
        apis={"metal", "cpu"}, first=("metal", 0), problems=set(),
    ),
    "i11d-macos11-intel-uhd630-radeon5500m-text": dict(
        os="macos", arch="x86_64", ngpus=2,
        gpus=[dict(vendor="intel", name="Intel UHD Graphics 630", kind="integrated", metal_support="Metal 2 (Mac2)", pci_device_id="", vram_total=None),
              dict(vendor="amd", name="AMD Radeon Pro 5500M", kind="discrete", pci_vendor_id="1002", metal_support="Metal 2 (Mac2)", vram_total=8 * GIB)],
        apis={"metal", "cpu"}, first=("metal", 1), problems=set(),
    ),
    "macos-imacpro-vega64": dict(
        os="macos", arch="x86_64", ngpus=1,
        gpus=[dict(vendor="amd", name="Radeon Pro Vega 64", kind="discrete", pci_vendor_id="1002", pci_device_id="6860", vram_total=16 * GIB,
                   gfx_target="gfx900", metal_support="Metal 2 (macOS GPUFamily2 v1)")],
        apis={"metal", "cpu"}, first=("metal", 0), problems=set(),
    ),
}


@pytest.fixture(scope="module")
def reports() -> Dict[str, HardwareReport]:
    return {name: replay(CAPTURES / name) for name in fixture_names()}


def test_every_fixture_has_expectations_and_a_readme():
    assert sorted(EXPECTED) == fixture_names()
    for name in fixture_names():
        readme = (CAPTURES / name / "README.md").read_text(encoding="utf-8")
        assert "hardware-dumps/" in readme and "Verbatim" in readme and "Transcribed" in readme


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_facts(name: str, reports: Dict[str, HardwareReport]):
    exp = EXPECTED[name]
    r = reports[name]
    assert r.os.name == exp["os"]
    assert r.os.arch == exp["arch"]
    assert r.os.wsl == exp.get("wsl", False)
    assert r.os.container == exp.get("container", "")
    assert r.os.rosetta is False
    for key in ("version", "kernel"):
        if key in exp:
            assert getattr(r.os, key) == exp[key]
    for key, value in exp.get("cpu", {}).items():
        assert getattr(r.cpu, key) == value, f"cpu.{key}"
    assert exp.get("cpu_has", set()) <= set(r.cpu.features)
    assert not exp.get("cpu_lacks", set()) & set(r.cpu.features)

    assert len(r.gpus) == exp["ngpus"]
    assert [g.index for g in r.gpus] == list(range(len(r.gpus)))
    for g, facts in zip(r.gpus, exp.get("gpus", [])):
        for key, value in facts.items():
            assert getattr(g, key) == value, f"gpu {g.index}.{key}"
    for idx, source in exp.get("gpu_sources", {}).items():
        assert source in r.gpus[idx].sources

    usable = {a.name for a in r.apis if a.usable}
    assert usable == exp["apis"]
    for name_ in exp.get("unusable", set()):
        api = r.api(name_)
        assert api is not None and not api.usable and api.evidence, f"{name_} should be listed as unusable, with why"
    first = r.preference[0]
    assert (first.api, first.gpu) == exp["first"]
    if "first_reason" in exp:
        assert exp["first_reason"] in first.reason
    assert set(r.problem_codes()) == exp["problems"]
    for code, gpu in exp.get("problem_gpu", {}).items():
        assert [p.gpu for p in r.problems if p.code == code] == [gpu]
    for code, gpus in exp.get("problem_gpus", {}).items():
        assert [p.gpus for p in r.problems if p.code == code] == [gpus]
    for code, text in exp.get("problem_hint", {}).items():
        assert all(text in p.hint for p in r.problems if p.code == code)
    if "rocm_version" in exp:
        assert r.rocm_version == exp["rocm_version"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preference_is_well_formed(name: str, reports: Dict[str, HardwareReport]):
    """CPU last and once; every entry names a usable API on a GPU that API drives; each has a reason."""
    r = reports[name]
    assert r.preference[-1].api == "cpu" and r.preference[-1].gpu is None
    assert [p.api for p in r.preference].count("cpu") == 1
    for p in r.preference[:-1]:
        api = r.api(p.api)
        assert api is not None and api.usable and p.gpu in api.gpus
        assert p.reason
    for p in r.problems:
        assert p.message and p.hint and p.severity in SEVERITIES and isinstance(p.action, Action)
        assert "accelstack" not in p.hint, "a library hint never names accelstack's command line; set its action"
        assert p.gpu is None or r.gpu(p.gpu) is not None


@pytest.mark.parametrize("name, code", [("linux-nvidia-nouveau-intel-haswell", "nvidia_driver_not_loaded"),
                                        ("linux-nvidia-4x-titanx-pascal-418", "nvidia_driver_old"),
                                        ("windows7-laptop-intel-hd-quadro-m2000m-441", "nvidia_driver_old"),
                                        ("linux-nvidia-driver-library-mismatch-580", "nvidia_driver_library_mismatch")])
def test_driver_problems_name_the_update_driver_action(name: str, code: str, reports: Dict[str, HardwareReport]):
    found = [p for p in reports[name].problems if p.code == code]
    assert found and all(p.action is Action.UPDATE_DRIVER and "driver" in p.hint for p in found)


def _pos(r: HardwareReport, api: str, gpu: Optional[int]) -> int:
    for i, p in enumerate(r.preference):
        if (p.api, p.gpu) == (api, gpu):
            return i
    raise AssertionError(f"{api} on GPU {gpu} not in the preference")


@pytest.mark.parametrize("name", sorted(n for n, e in EXPECTED.items() if "cuda" in e["apis"]))
def test_cuda_comes_before_directml_and_vulkan(name: str, reports: Dict[str, HardwareReport]):
    r = reports[name]
    cuda = r.api("cuda")
    assert cuda is not None and cuda.gpus
    for idx in cuda.gpus:
        for other in ("directml", "vulkan"):
            api = r.api(other)
            if api and api.usable and idx in api.gpus:
                assert _pos(r, "cuda", idx) < _pos(r, other, idx)
    # and CUDA on any NVIDIA GPU beats every non-CUDA entry
    assert r.preference[0].api == "cuda"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_discrete_before_integrated(name: str, reports: Dict[str, HardwareReport]):
    r = reports[name]
    for api in {p.api for p in r.preference if p.gpu is not None}:
        kinds = [r.gpus[p.gpu].kind for p in r.preference if p.api == api]
        if "integrated" in kinds and "discrete" in kinds:
            assert kinds.index("integrated") > len(kinds) - 1 - kinds[::-1].index("discrete")
    with_api = [g for g in r.gpus if any(p.gpu == g.index for p in r.preference)]
    if any(g.kind == "discrete" for g in with_api) and any(g.kind == "integrated" for g in with_api):
        assert r.gpus[r.preference[0].gpu].kind == "discrete"


def test_windows7_says_why_directml_is_unusable(reports):
    api = reports["windows7-laptop-intel-hd-quadro-m2000m-441"].api("directml")
    assert api is not None and not api.usable
    assert all("Windows 10" in e for e in api.evidence)


def test_mismatch_keeps_cuda_unusable_with_evidence(reports):
    r = reports["linux-nvidia-driver-library-mismatch-580"]
    assert "does not match" in r.api("cuda").evidence[0]
    mismatch = [p for p in r.problems if p.code == "nvidia_driver_library_mismatch"][0]
    assert mismatch.severity == "error" and "reboot" in mismatch.hint


def test_old_driver_retry_without_compute_cap(reports):
    """418 rejects compute_cap: the retry's answer (memory, driver) is used, the capability comes from the name."""
    g = reports["linux-nvidia-4x-titanx-pascal-418"].gpus[0]
    assert "vram, driver: nvidia-smi" in g.sources
    assert "compute_capability: name table" in g.sources


def test_truncated_system_profiler_json_is_salvaged_without_the_monitor_vendor(reports):
    g = reports["macos-apple-m3-pro-truncated-json"].gpus[0]
    assert g.pci_vendor_id == "106b"  # 10ac in the dump is the DELL monitor's vendor id


# -- ordering rules on machines built for the rule (variants of the fixtures) -----------------------

VULKAN_LOADER = "/usr/lib/x86_64-linux-gnu/libvulkan.so.1"


def _add_vulkan(root, *icds: str) -> None:
    """Give a Linux capture a Vulkan loader and ICD manifests (files that exist are all replay needs)."""
    (root / "files" / VULKAN_LOADER.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    (root / "files" / VULKAN_LOADER.lstrip("/")).write_bytes(b"")
    icd_dir = root / "files" / "usr/share/vulkan/icd.d"
    icd_dir.mkdir(parents=True, exist_ok=True)
    for icd in icds:
        (icd_dir / icd).write_text('{"file_format_version": "1.0.0", "ICD": {"library_path": "x.so"}}\n', encoding="utf-8")


def test_rocm_before_vulkan_on_a_supported_gfx_target(copy_capture):
    root = copy_capture("linux-amd-2x-rx7900xtx-rocm")
    _add_vulkan(root, "radeon_icd.x86_64.json")
    r = replay(root)
    assert {a.name for a in r.apis if a.usable} == {"rocm", "vulkan", "cpu"}
    assert [(p.api, p.gpu) for p in r.preference] == [("rocm", 0), ("rocm", 1), ("vulkan", 0), ("vulkan", 1), ("cpu", None)]
    assert "vulkan_loader_missing" not in r.problem_codes()


def test_vulkan_before_rocm_on_an_unsupported_gfx_target(copy_capture):
    root = copy_capture("linux-amd-780m-apu-docker")  # gfx1103: not in ROCm's list
    _add_vulkan(root, "radeon_icd.x86_64.json")
    r = replay(root)
    assert _pos(r, "vulkan", 0) < _pos(r, "rocm", 0)
    assert "HSA_OVERRIDE_GFX_VERSION" in r.preference[_pos(r, "rocm", 0)].reason


def _nvidia_4070(b, addr: str = "0000:01:00.0") -> None:
    b.pci(addr, "030000", "10de", "2786", driver="nvidia")
    b.file("/sys/module/nvidia/version", "550.40.07\n")
    b.smi([[0, "0000" + addr, "NVIDIA GeForce RTX 4070", 12282, 11852, "550.40.07", "8.9"]])


def test_amd_igpu_with_nvidia_dgpu(builder, tmp_path):
    b = builder()
    _nvidia_4070(b)
    b.pci("0000:c4:00.0", "030000", "1002", "15bf", driver="amdgpu")
    b.kfd_node(1, gfx_target_version=110003, location_id=0xC400, domain=0)
    b.device("/dev/kfd", rw=True)
    b.file(VULKAN_LOADER, "").file("/usr/share/vulkan/icd.d/nvidia_icd.json", "{}").file("/usr/share/vulkan/icd.d/radeon_icd.x86_64.json", "{}")
    r = replay(b.write(tmp_path / "mixed"))
    nvidia = next(g.index for g in r.gpus if g.vendor == "nvidia")
    amd = next(g.index for g in r.gpus if g.vendor == "amd")
    assert r.gpus[amd].kind == "integrated" and r.gpus[nvidia].kind == "discrete"
    assert (r.preference[0].api, r.preference[0].gpu) == ("cuda", nvidia)
    assert _pos(r, "vulkan", nvidia) < _pos(r, "vulkan", amd)
    assert _pos(r, "cuda", nvidia) < _pos(r, "rocm", amd)
    assert r.preference[-1].api == "cpu"


def test_intel_igpu_with_nvidia_dgpu_on_linux(builder, tmp_path):
    b = builder()
    b.pci("0000:00:02.0", "030000", "8086", "0412", driver="i915")
    _nvidia_4070(b)
    b.file(VULKAN_LOADER, "").file("/usr/share/vulkan/icd.d/nvidia_icd.json", "{}").file("/usr/share/vulkan/icd.d/intel_icd.x86_64.json", "{}")
    r = replay(b.write(tmp_path / "optimus"))
    assert [g.vendor for g in r.gpus] == ["intel", "nvidia"]
    assert [(p.api, p.gpu) for p in r.preference] == [("cuda", 1), ("vulkan", 1), ("vulkan", 0), ("cpu", None)]


def test_two_discrete_vendors(builder, tmp_path):
    b = builder()
    _nvidia_4070(b)
    b.pci("0000:03:00.0", "030000", "1002", "744c", driver="amdgpu", vram_total=24560 * MIB)
    b.kfd_node(1, gfx_target_version=110000, location_id=0x0300, domain=0)
    b.device("/dev/kfd", rw=True)
    r = replay(b.write(tmp_path / "two-vendors"))
    order = [(p.api, r.gpus[p.gpu].vendor if p.gpu is not None else None) for p in r.preference]
    assert order == [("cuda", "nvidia"), ("rocm", "amd"), ("cpu", None)]


# -- problems no dump shows, on machines built for them -------------------------------------------


def test_driver_too_old_to_report_a_cuda_version(builder, tmp_path):
    b = builder()
    b.pci("0000:02:00.0", "030000", "10de", "1b00", driver="nvidia")
    b.file("/sys/module/nvidia/version", "375.66\n")
    b.smi([[0, "00000000:02:00.0", "TITAN X (Pascal)", 12189, 12000, "375.66"]], old_driver=True)
    r = replay(b.write(tmp_path / "old"))
    g = r.gpus[0]
    assert (g.driver_version, g.cuda_driver_version, g.compute_capability) == ("375.66", "", "6.1")
    too_old = [p for p in r.problems if p.code == "nvidia_driver_too_old"]
    assert len(too_old) == 1 and too_old[0].gpu == 0 and "375.66" in too_old[0].message
    assert "R580" in too_old[0].hint and "Pascal" in too_old[0].hint  # never a driver branch the GPU cannot run
    cuda = r.api("cuda")
    assert cuda is not None and not cuda.usable and "375.66" in cuda.evidence[0] and [p.api for p in r.preference] == ["cpu"]


def test_rosetta_is_reported(builder, tmp_path):
    b = builder(system="Darwin", machine="x86_64")
    b.command(make_fixture.SYSCTL, stdout="hw.optional.arm64: 1\nmachdep.cpu.brand_string: Apple M3\nsysctl.proc_translated: 1\n")
    b.command(make_fixture.PROFILER_JSON, stdout=(CAPTURES / "macos-apple-m3" / "commands" / "1.out").read_text(encoding="utf-8"))
    r = replay(b.write(tmp_path / "rosetta"))
    assert r.os.rosetta and r.os.arch == "x86_64"
    assert r.cpu.vendor == "apple" and r.cpu.x86_64_level is None
    rosetta = [p for p in r.problems if p.code == "rosetta"]
    assert len(rosetta) == 1 and rosetta[0].severity == "error" and "arm64" in rosetta[0].hint
