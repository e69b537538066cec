"""Build the issue-27 fixtures (the decision classes real machines still break) from real public dumps.

Same format and README layout as ``tests/hardware/make_i11d_fixtures.py`` (whose ``url_readme`` it uses):
each README names the public dump, what is verbatim from it, what is transcribed and what is assumed.

    .venv/bin/python tests/hardware/make_class_fixtures.py            # rewrite every issue-27 fixture
    .venv/bin/python tests/hardware/make_class_fixtures.py NAME ...   # rewrite some
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable, Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its generator beside it
import make_i11d_fixtures as i11d  # noqa: E402

mf = i11d.mf
CaptureBuilder, CAPTURES, MIB, GIB = mf.CaptureBuilder, mf.CAPTURES, mf.MIB, mf.GIB
url_readme = i11d.url_readme

# -- Intel Core Ultra (Meteor Lake) iGPU, with its NPU -------------------------------------------------

MTL_URLS = ("https://github.com/strongtz/i915-sriov-dkms/issues/210 (Core Ultra 7 155H: i915 binds 0000:00:02.0, "
            "'[drm] Found METEORLAKE (device ID 7d55)'); https://github.com/system76/firmware-open/issues/580 "
            "('00:0b.0 Processing accelerators: Intel Corporation Meteor Lake NPU (rev 04)'); "
            "https://github.com/ZoLArk173/nputop/pull/2 (8086:7D1D driven by intel_vpu, Core Ultra 155H)")


def linux_intel_meteorlake_7d55_npu() -> CaptureBuilder:
    b = CaptureBuilder(release="6.8.0-45-generic")
    b.pci("0000:00:02.0", "030000", "8086", "7d55", driver="i915")
    b.pci("0000:00:0b.0", "120000", "8086", "7d1d", driver="intel_vpu")
    b.file("/etc/os-release", 'NAME="Ubuntu"\nVERSION_ID="24.04"\nPRETTY_NAME="Ubuntu 24.04.1 LTS"\n')
    b.memory = [32 * GIB, 24 * GIB]
    return b


# -- AMD Phoenix APU (Radeon 780M) with its XDNA NPU --------------------------------------------------

XDNA_URLS = ("https://github.com/Umio-Yasuno/amdgpu_top/issues/120 (Ryzen 7 7840U: 'amdxdna 0000:c2:00.1: enabling device', "
             "'[drm] Initialized amdxdna_accel_driver 0.0.0 for 0000:c2:00.1'); https://github.com/vladmandic/sdnext/issues/4074 "
             "(a Phoenix APU's lspci: the NPU is function 1 of its device, a 'Signal processing controller', beside the 'Phoenix Dummy Function')")


def linux_amd_phoenix_780m_npu_amdxdna() -> CaptureBuilder:
    b = CaptureBuilder(release="6.13.0-rc7")
    b.pci("0000:c1:00.0", "030000", "1002", "15bf", driver="amdgpu")
    b.pci("0000:c2:00.0", "130000", "1022", "14ec")
    b.pci("0000:c2:00.1", "118000", "1022", "1502", driver="amdxdna")
    b.memory = [32 * GIB, 24 * GIB]
    return b


# -- NVIDIA module loaded, nvidia-smi: "No devices were found" ------------------------------------------

NODEV_URL = "https://github.com/NVIDIA/open-gpu-kernel-modules/issues/789"
NODEV_DMESG = ("[  903.609564] NVRM: RmInitAdapter: Cannot initialize GSP firmware RM\n"
               "[  903.610907] NVRM: GPU 0000:98:00.0: RmInitAdapter failed! (0x62:0x65:1792)\n"
               "[  903.611884] NVRM: GPU 0000:98:00.0: rm_init_adapter failed, device minor number 0\n")


def linux_nvidia_no_devices_rtx3090_550() -> CaptureBuilder:
    b = CaptureBuilder(release="5.15.0-131-generic")
    b.pci("0000:98:00.0", "030000", "10de", "2204", driver="nvidia")
    b.file("/etc/os-release", 'NAME="Ubuntu"\nVERSION_ID="22.04"\nPRETTY_NAME="Ubuntu 22.04.5 LTS"\n')
    b.file("/sys/module/nvidia/version", "550.144.03\n")
    b.command(mf.SMI_QUERY, stdout="No devices were found\n", returncode=6)
    return b


# -- Windows dGPU laptop, NVIDIA driver version not in WMI --------------------------------------------

SYSTEM32_SMI = "C:\\Windows\\System32\\nvidia-smi.exe"


def windows_rtx4060_laptop_driver_unread_smi_system32() -> CaptureBuilder:
    """The partial-WMI laptop, where nvidia-smi is not on PATH but the driver's own copy is in System32."""
    b = i11d.windows_rtx4060_laptop_partial_wmi()
    b.device(SYSTEM32_SMI)
    b.command([SYSTEM32_SMI, *mf.SMI_QUERY[1:]], stdout="0, 00000000:01:00.0, NVIDIA GeForce RTX 4060 Laptop GPU, 8188, 7957, 581.15, 8.9\n")
    return b


# -- Windows dGPU laptop: NVIDIA driver version in neither WMI nor nvidia-smi, but in the registry --------

# Microsoft's documentation of the key and the two values the registry read takes from each adapter's key:
REGISTRY_URLS = ("https://learn.microsoft.com/windows-hardware/drivers/install/system-defined-device-setup-classes-available-to-vendors "
                 "(Display adapters: class GUID {4d36e968-e325-11ce-bfc1-08002be10318}); "
                 "https://learn.microsoft.com/windows-hardware/drivers/install/hklm-system-currentcontrolset-control-registry-tree "
                 "(HKLM\\SYSTEM\\CurrentControlSet\\Control\\Class: a subkey per setup class); "
                 "https://learn.microsoft.com/windows-hardware/drivers/install/devpkey-device-driverversion and "
                 "https://learn.microsoft.com/windows-hardware/drivers/install/devpkey-device-matchingdeviceid (the registry values "
                 "DriverVersion and MatchingDeviceId under the device's software key)")


def ps_json(value: object) -> str:
    """``value`` as Windows PowerShell 5.1's ConvertTo-Json -Compress prints it (``&`` ``'`` ``<`` ``>`` escaped), CRLF-ended."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for ch, esc in (("&", "\\u0026"), ("'", "\\u0027"), ("<", "\\u003c"), (">", "\\u003e")):
        text = text.replace(ch, esc)
    return text + "\r\n"


def windows_rtx4060_laptop_driver_from_registry() -> CaptureBuilder:
    """The RTX 4060 laptop with WMI's DriverVersion missing and no nvidia-smi anywhere: the registry has the version."""
    from accelstack.hardware.windows import REGISTRY_DRIVER

    b = CaptureBuilder(system="Windows", machine="AMD64", release="11", version="10.0.26200", win_version="10.0.26200")
    b.powershell({
        "gpus": [i11d.ADL_INTEL, dict(i11d.ADL_NVIDIA, DriverVersion=None)],
        "registry": [
            {"DriverDesc": "Intel(R) UHD Graphics", "MatchingDeviceId": "pci\\ven_8086&dev_46a3", "HardwareInformation.qwMemorySize": None},
            {"DriverDesc": "NVIDIA GeForce RTX 4060 Laptop GPU", "MatchingDeviceId": "pci\\ven_10de&dev_28a0", "HardwareInformation.qwMemorySize": 8589934592},
        ],
        "cpu": i11d.ADL_CPU, "features": i11d.ADL_FEATURES,
    })
    b.command(mf.SMI_QUERY, missing=True)
    b.command(REGISTRY_DRIVER, stdout=ps_json([
        {"MatchingDeviceId": "pci\\ven_8086&dev_46a3", "DriverVersion": i11d.ADL_INTEL["DriverVersion"]},
        {"MatchingDeviceId": "pci\\ven_10de&dev_28a0", "DriverVersion": i11d.ADL_NVIDIA["DriverVersion"]},
    ]))
    b.device(mf.VULKAN_DLL)
    b.memory = [16 * GIB, None]
    return b


# -- Kepler GTX 680 on driver 331 (both the driver and the architecture rule CUDA wheels out) ----------

GTX680_URLS = ("https://github.com/FoldingAtHome/fah-issues/issues/878 (GeForce GTX 680 = PCI\\VEN_10DE&DEV_1180, a Kepler GK104); "
               "http://manpages.ubuntu.com/manpages/trusty/man1/alt-nvidia-331-updates-smi.1.html (Ubuntu 14.04's driver "
               "package nvidia-331-updates 331.38, whose nvidia-smi covers Kepler GeForce boards)")


def linux_nvidia_gtx680_331() -> CaptureBuilder:
    b = CaptureBuilder(release="3.13.0-24-generic")
    b.pci("0000:01:00.0", "030000", "10de", "1180", driver="nvidia")
    b.file("/etc/os-release", 'NAME="Ubuntu"\nVERSION_ID="14.04"\nPRETTY_NAME="Ubuntu 14.04 LTS"\n')
    b.file("/sys/module/nvidia/version", "331.38\n")
    b.smi([[0, "0000:01:00.0", "GeForce GTX 680", 2047, 1980, "331.38"]], old_driver=True)
    return b


FIXTURES: Dict[str, Tuple[Callable[[], CaptureBuilder], str]] = {
    "linux-intel-meteorlake-7d55-npu": (
        linux_intel_meteorlake_7d55_npu,
        url_readme(
            "linux-intel-meteorlake-7d55-npu",
            "Core Ultra 7 155H laptop on Linux: the Meteor Lake iGPU 8086:7d55 ('Intel Arc Graphics', which torchruntime's "
            "database flags as discrete) at 0000:00:02.0, and the Meteor Lake NPU 8086:7d1d (class 0x1200, intel_vpu) at "
            "0000:00:0b.0. The iGPU must read as integrated and the NPU as an NPU, never a GPU.",
            MTL_URLS,
            ["nothing byte for byte: the dumps are dmesg and lspci lines, not the sysfs files detection reads"],
            ["iGPU: bus 0000:00:02.0, 8086:7d55, driver i915 (i915-sriov-dkms#210's dmesg)",
             "NPU: bus 0000:00:0b.0, class 0x120000 (lspci's 'Processing accelerators'), 8086:7d1d (firmware-open#580, nputop#2), driver intel_vpu (nputop#2)"],
            ["kernel 6.8.0-45-generic and Ubuntu 24.04.1 (a kernel that binds both drivers), 32 GiB RAM",
             "no Vulkan loader, no Level Zero loader (not the point of this capture)"],
        ),
    ),
    "linux-amd-phoenix-780m-npu-amdxdna": (
        linux_amd_phoenix_780m_npu_amdxdna,
        url_readme(
            "linux-amd-phoenix-780m-npu-amdxdna",
            "Ryzen 7 7840U laptop on Linux with the mainline amdxdna driver: the XDNA NPU 1022:1502 (class 0x1180, signal "
            "processing controller) at 0000:c2:00.1 must be reported as an NPU; the Radeon 780M iGPU stays the only GPU.",
            XDNA_URLS,
            ["nothing byte for byte: the dumps are dmesg and lspci lines"],
            ["NPU: bus 0000:c2:00.1 and driver amdxdna (amdgpu_top#120's dmesg); class 0x1180 'Signal processing controller' "
             "and the dummy function 0 beside it (sdnext#4074's lspci); device id 1502, the Phoenix NPU of the kernel's amdxdna id list"],
            ["the Radeon 780M at 0000:c1:00.0 as 1002:15bf with amdgpu (the 7840U's iGPU; amdgpu_top#120 runs amdgpu, its bus is not shown)",
             "the dummy function 0000:c2:00.0 as class 0x1300, 1022:14ec, no driver",
             "kernel 6.13.0-rc7 (the issue compiled amdxdna before 6.14 merged it), 32 GiB RAM, no /dev/kfd, no Vulkan loader"],
        ),
    ),
    "linux-nvidia-no-devices-rtx3090-550": (
        linux_nvidia_no_devices_rtx3090_550,
        url_readme(
            "linux-nvidia-no-devices-rtx3090-550",
            "RTX 3090 on Ubuntu 22.04 with the 550.144.03 open kernel module loaded, but the GPU failed to initialize "
            "(dmesg: 'RmInitAdapter: Cannot initialize GSP firmware RM', 'RmInitAdapter failed!'): nvidia-smi answers "
            "'No devices were found'. CUDA must not count as usable, and the advice must not be to install a driver.",
            NODEV_URL,
            ["nvidia-smi's answer `No devices were found`"],
            ["bus 0000:98:00.0 (the dmesg lines), RTX 3090 = 10de:2204, driver nvidia; module version 550.144.03 (the issue's "
             "driver, in /sys/module/nvidia/version); Ubuntu 22.04, kernel 5.15.0-131-generic"],
            ["nvidia-smi's exit status 6 (NVML_ERROR_NOT_FOUND, what it exits with when it prints this)",
             "Ubuntu 22.04.5 as the point release; no Vulkan loader"],
        ),
    ),
    "windows-nvidia-rtx4060-laptop-driver-unread-smi-system32": (
        windows_rtx4060_laptop_driver_unread_smi_system32,
        url_readme(
            "windows-nvidia-rtx4060-laptop-driver-unread-smi-system32",
            "The i11d partial-WMI RTX 4060 laptop (no DriverVersion in WMI, nvidia-smi not on PATH), where the NVIDIA driver's own "
            "nvidia-smi.exe is in C:\\Windows\\System32 (where current drivers install it): detection must read the driver version there.",
            i11d.ADL_URL,
            ["nothing: the inventory is a table, not a probe's output"],
            ["as in i11d-windows-rtx4060-laptop-partial-wmi; nvidia-smi's row as in i11d-windows-adl-uhd46a3-rtx4060-laptop (driver 581.15, 8.9)"],
            ["nvidia-smi.exe present in C:\\Windows\\System32 and answering there, not on PATH"],
        ),
    ),
    "windows-nvidia-rtx4060-laptop-driver-from-registry": (
        windows_rtx4060_laptop_driver_from_registry,
        url_readme(
            "windows-nvidia-rtx4060-laptop-driver-from-registry",
            "The i11d RTX 4060 laptop with a partial WMI report (no DriverVersion for the NVIDIA adapter) and no nvidia-smi, "
            "neither on PATH nor in C:\\Windows\\System32: detection reads the display class registry keys' DriverVersion "
            "(matched to the GPU by MatchingDeviceId) in a second, separate PowerShell read, and Windows' 32.0.15.8115 is NVIDIA's 581.15.",
            f"{i11d.ADL_URL}; the registry key and values: {REGISTRY_URLS}",
            ["nothing: the inventory is a table, and no public paste of this read's output was found"],
            ["as in i11d-windows-adl-uhd46a3-rtx4060-laptop: adapters, PCI ids, driver versions (32.0.101.7082 Intel, "
             "32.0.15.8115 = NVIDIA 581.15), Windows build, CPU; here the driver versions are the registry read's answer"],
            ["a partial report: WMI's DriverVersion of the NVIDIA adapter is null, nvidia-smi is found nowhere",
             "the registry read's JSON as Windows PowerShell 5.1's ConvertTo-Json -Compress prints it, the adapters' keys in "
             "the order of the first query's registry list, MatchingDeviceId written as there (detection matches it in any case)",
             "registry qwMemorySize 8 GiB for the NVIDIA adapter, 16 GiB RAM, vulkan-1.dll present (as in the i11d fixture)"],
        ),
    ),
    "linux-nvidia-gtx680-331": (
        linux_nvidia_gtx680_331,
        url_readme(
            "linux-nvidia-gtx680-331",
            "GeForce GTX 680 (Kepler, compute capability 3.0) on Ubuntu 14.04 with NVIDIA driver 331.38: the driver is too old for "
            "any torch CUDA wheel, and so is the architecture (no torch CUDA wheel has sm_30 kernels). The rejection must lead "
            "with the architecture: updating the driver changes nothing for torch.",
            GTX680_URLS,
            ["nothing byte for byte: the sources are a device id list and a driver package page"],
            ["the GPU 10de:1180 named GeForce GTX 680 (fah-issues#878); driver 331.38 (the Ubuntu 14.04 package), in "
             "/sys/module/nvidia/version and nvidia-smi; Ubuntu 14.04"],
            ["one board at 0000:01:00.0 with 2 GiB (2047 MiB, 1980 MiB free), kernel 3.13.0-24-generic",
             "nvidia-smi 331 rejects the compute_cap field (as drivers before ~510 do) and answers the query without it",
             "this machine is assembled from the two sources (no public dump shows a GTX 680 on 331 whole)"],
        ),
    ),
}


def main(argv: List[str]) -> int:
    return mf.write_built(FIXTURES, argv, "tests/hardware/make_class_fixtures.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
