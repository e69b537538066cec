"""Build the issue-42 fixtures (decisions real machines still trip) from real public dumps.

Same format and README layout as ``tests/hardware/make_i11d_fixtures.py`` (whose ``url_readme`` it uses):
each README names the public dump, what is verbatim from it, what is transcribed and what is assumed.

    .venv/bin/python tests/hardware/make_sourced_gpu_fixtures.py            # rewrite every issue-42 fixture
    .venv/bin/python tests/hardware/make_sourced_gpu_fixtures.py NAME ...   # rewrite some
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its generator beside it
import make_i11d_fixtures as i11d  # noqa: E402

mf = i11d.mf
CaptureBuilder, CAPTURES, MIB, GIB = mf.CaptureBuilder, mf.CAPTURES, mf.MIB, mf.GIB
url_readme = i11d.url_readme

# -- a low-end Kepler (GK107) Quadro K600 on the legacy R470 driver --------------------------------------

K600_URLS = ("https://github.com/korvahannu/arch-nvidia-drivers-installation-guide/issues/20 (a Quadro K600 on Arch Linux with "
             "nvidia-470xx-dkms, kernel 6.6.17-1-lts); https://github.com/envytools/envytools docs/hw/pciid.rst ('0x0ffa GK107 "
             "[Quadro K600]'); https://github.com/LibreELEC/LibreELEC.tv/pull/3038 (NVIDIA's supported-products list: '0ffa Quadro K600')")


def linux_nvidia_quadro_k600_gk107_470() -> CaptureBuilder:
    b = CaptureBuilder(release="6.6.17-1-lts")
    b.pci("0000:01:00.0", "030000", "10de", "0ffa", driver="nvidia")
    b.file("/etc/os-release", 'NAME="Arch Linux"\nID=arch\nPRETTY_NAME="Arch Linux"\n')
    b.file("/sys/module/nvidia/version", "470.223.02\n")
    b.smi([[0, "00000000:01:00.0", "Quadro K600", 979, 975, "470.223.02"]], old_driver=True)
    return b


# -- DGX Spark: the GB10's GPU shares the system's LPDDR5X (unified memory) ---------------------------------

GB10_URLS = ("https://github.com/snowflakedb/ArcticTraining/pull/345 (DGX Spark nvidia-smi: 'NVIDIA GB10', bus 0000000F:01:00.0, "
             "driver 580.126.09, CUDA Version 13.0, Memory-Usage 'Not Supported'); https://github.com/leptonai/gpud/pull/1170 "
             "(NVML: 'NVML memory APIs not supported for unified memory device', bus 000f:01:00.0, is_unified_memory); "
             "https://developer.nvidia.com/cuda/gpus (NVIDIA GB10: compute capability 12.1)")


def linux_nvidia_dgx_spark_gb10_580() -> CaptureBuilder:
    b = CaptureBuilder(machine="aarch64", release="6.11.0-1016-nvidia")
    b.pci("000f:01:00.0", "030200", "10de", "2e12", driver="nvidia")
    b.file("/etc/os-release", 'NAME="Ubuntu"\nVERSION_ID="24.04"\nPRETTY_NAME="Ubuntu 24.04.3 LTS"\n')
    b.file("/sys/module/nvidia/version", "580.126.09\n")
    b.smi([[0, "0000000F:01:00.0", "NVIDIA GB10", "[N/A]", "[N/A]", "580.126.09", "12.1"]])
    b.memory = [128 * GIB, 120 * GIB]
    return b


# -- Windows: an R595 driver reports CUDA 13.2 --------------------------------------------------------------

R595_URL = ("a public environment report in a GitHub repository (code-index id 69336118710): Windows, Python 3.11.9, torch "
            "2.5.1+cu121 on an 'NVIDIA GeForce RTX 4060 Laptop GPU' (8, 9); nvidia-smi 'Driver Version: 595.79  CUDA Version: 13.2', "
            "WDDM, bus 00000000:01:00.0, 8188MiB. The same pair on other Windows machines: code-index ids 54521000558, 59432267321, 61407276102")


def windows_nvidia_rtx4060_laptop_595() -> CaptureBuilder:
    b = CaptureBuilder(system="Windows", machine="AMD64", release="11", version="10.0.26100", win_version="10.0.26100")
    b.powershell({
        "gpus": [dict(i11d.ADL_NVIDIA, DriverVersion="32.0.15.9579")],
        "registry": [{"DriverDesc": "NVIDIA GeForce RTX 4060 Laptop GPU", "MatchingDeviceId": "pci\\ven_10de&dev_28a0",
                      "HardwareInformation.qwMemorySize": 8589934592}],
        "cpu": None, "features": {},
    })
    b.smi([[0, "00000000:01:00.0", "NVIDIA GeForce RTX 4060 Laptop GPU", 8188, 8188, "595.79", "8.9"]])
    b.device(mf.VULKAN_DLL)
    b.memory = [16 * GIB, None]
    return b


# -- Intel Data Center GPU Max 1100 on Intel's out-of-tree (DKMS) i915 -------------------------------------

PVC_URLS = ("https://github.com/intel-gpu/intel-gpu-i915-backports/issues/210 (Rocky Linux 9.4, kernel 5.14.0-427.42.1.el9_4.x86_64, "
            "intel-i915-dkms 1.24.4.12.240603.18-1; lspci -knn: 'ca:00.0 Display controller [0380]: Intel Corporation Ponte Vecchio XT "
            "(1 Tile) [Data Center GPU Max 1100] [8086:0bda] (rev 2f)', 'Kernel driver in use: i915'); "
            "https://github.com/intel-gpu/intel-gpu-i915-backports/pull/141 (the backport's modules carry a module version, for DKMS)")


def linux_intel_max1100_pvc_dkms() -> CaptureBuilder:
    b = CaptureBuilder(release="5.14.0-427.42.1.el9_4.x86_64")
    b.pci("0000:ca:00.0", "038000", "8086", "0bda", driver="i915")
    b.file("/etc/os-release", 'NAME="Rocky Linux"\nVERSION_ID="9.4"\nPRETTY_NAME="Rocky Linux 9.4 (Blue Onyx)"\n')
    b.file("/sys/module/i915/version", "1.24.4.12.240603.18\n")
    b.memory = [512 * GIB, 480 * GIB]
    return b


FIXTURES: Dict[str, Tuple[Callable[[], CaptureBuilder], str]] = {
    "linux-nvidia-quadro-k600-gk107-470": (
        linux_nvidia_quadro_k600_gk107_470,
        url_readme(
            "linux-nvidia-quadro-k600-gk107-470",
            "Quadro K600 (Kepler GK107, compute capability 3.0) on Arch Linux with the legacy nvidia-470xx driver: no name rule "
            "knows the K600, so the compute capability comes from the PCI device id 10de:0ffa; the driver advice must be the R470 "
            "branch the GPU can run, never 'R580 or newer'.",
            K600_URLS,
            ["nothing byte for byte: the sources are an issue's prose, a device id list and a supported-products list"],
            ["the GPU 10de:0ffa named Quadro K600 (envytools, NVIDIA's list); the nvidia-470xx driver and kernel 6.6.17-1-lts (the issue)"],
            ["driver 470.223.02 (the nvidia-470xx AUR package of February 2024, the issue's date), in /sys/module/nvidia/version and nvidia-smi",
             "one board at 0000:01:00.0 with 1 GiB (979 MiB, 975 MiB free)",
             "nvidia-smi 470 rejects the compute_cap field (as drivers before ~510 do) and answers the query without it",
             "no Vulkan loader (not the point of this capture)"],
        ),
    ),
    "linux-nvidia-dgx-spark-gb10-580": (
        linux_nvidia_dgx_spark_gb10_580,
        url_readme(
            "linux-nvidia-dgx-spark-gb10-580",
            "DGX Spark: the GB10 superchip's Blackwell GPU (10de:2e12, compute capability 12.1) shares the system's memory "
            "(nvidia-smi reports no memory of its own). It is an integrated GPU, never a discrete one, whatever a PCI database "
            "flags it as.",
            GB10_URLS,
            ["nvidia-smi's name `NVIDIA GB10`, driver `580.126.09` and bus `0000000F:01:00.0` (ArcticTraining#345)"],
            ["memory.total/free as `[N/A]` (what the query prints where the table shows 'Not Supported'); compute capability 12.1 "
             "(NVIDIA's CUDA GPUs page); PCI id 10de:2e12 ('GB20B [GB10]' in the PCI id database)"],
            ["PCI class 0x030200 (3D controller), kernel 6.11.0-1016-nvidia and Ubuntu 24.04.3 (DGX OS 7), 128 GiB RAM",
             "no Vulkan loader (not the point of this capture)"],
        ),
    ),
    "windows-nvidia-rtx4060-laptop-595": (
        windows_nvidia_rtx4060_laptop_595,
        url_readme(
            "windows-nvidia-rtx4060-laptop-595",
            "RTX 4060 Laptop on Windows with driver 595.79, which reports CUDA 13.2 (nvidia-smi's header): the R595 branch "
            "maps to CUDA 13.2 on Windows as on Linux, not to 13.1 (R591).",
            R595_URL,
            ["nvidia-smi's driver `595.79` and name `NVIDIA GeForce RTX 4060 Laptop GPU`"],
            ["nvidia-smi query CSV: bus 01:00.0, 8188 MiB, driver 595.79, compute capability 8.9 (the report's (8, 9)); WMI: the "
             "adapter 10de:28a0 with DriverVersion 32.0.15.9579 (Windows' form of 595.79)"],
            ["Windows 11 build 26100, 16 GiB RAM, 8188 MiB free (no process running: the report says 'No running processes found'), "
             "registry qwMemorySize 8 GiB, vulkan-1.dll present; CPU not in the report: `cpu` null, `features` empty"],
        ),
    ),
    "linux-intel-max1100-pvc-dkms": (
        linux_intel_max1100_pvc_dkms,
        url_readme(
            "linux-intel-max1100-pvc-dkms",
            "Intel Data Center GPU Max 1100 (Ponte Vecchio, 8086:0bda) on Rocky Linux 9.4 with Intel's out-of-tree i915 "
            "(intel-i915-dkms): the GPU is named from its PCI id, and its driver version is the DKMS module's, not the kernel's release.",
            PVC_URLS,
            ["lspci's `Ponte Vecchio XT (1 Tile) [Data Center GPU Max 1100] [8086:0bda]` and `Kernel driver in use: i915`"],
            ["bus 0000:ca:00.0, class 0x038000 (Display controller), 8086:0bda, driver i915; kernel 5.14.0-427.42.1.el9_4.x86_64 and "
             "Rocky Linux 9.4; the DKMS package 1.24.4.12.240603.18-1 (issue 210)"],
            ["/sys/module/i915/version reads `1.24.4.12.240603.18` (the package version without its Debian/RPM revision; PR 141 gives "
             "the backport modules a version)", "512 GiB RAM; no Level Zero loader, no Vulkan loader (not the point of this capture)"],
        ),
    ),
}


def main(argv: List[str]) -> int:
    return mf.write_built(FIXTURES, argv, "tests/hardware/make_sourced_gpu_fixtures.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
