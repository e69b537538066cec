"""Build the issue-11 detection fixtures (``tests/fixtures/captures/i11d-*``) from real dumps.

Same format and README layout as ``tests/fixtures/make_fixture.py`` (whose ``CaptureBuilder`` and
``Fixture`` it uses): outputs detection reads as they are are cut from the dump byte for byte,
other facts are transcribed, and what the dump does not show is listed as assumed.

    .venv/bin/python tests/hardware/make_i11d_fixtures.py            # rewrite every i11d fixture
    .venv/bin/python tests/hardware/make_i11d_fixtures.py NAME ...   # rewrite some
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import List

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("accelstack_make_fixture", HERE.parent / "fixtures" / "make_fixture.py")
assert _spec and _spec.loader
mf = sys.modules.get("accelstack_make_fixture") or importlib.util.module_from_spec(_spec)
if "accelstack_make_fixture" not in sys.modules:
    sys.modules["accelstack_make_fixture"] = mf
    _spec.loader.exec_module(mf)

CaptureBuilder, Fixture, dump_block = mf.CaptureBuilder, mf.Fixture, mf.dump_block
CAPTURES = mf.CAPTURES
MIB, GIB = mf.MIB, mf.GIB

# -- Jetson ----------------------------------------------------------------------------------------

# nvidia-smi on a JetPack 6 Orin: every field but the name is [N/A] (Chen-zexi/vllm-cli#11 shows the
# row "0, Orin (nvgpu), [N/A], [N/A], [N/A], [N/A], [N/A]"; jetpack-nixos#371 shows "CUDA Version: N/A").
JETSON_SMI_ROW = "0, [N/A], Orin (nvgpu), [N/A], [N/A], [N/A], [N/A]\n"


def jetson_xavier_jp5() -> CaptureBuilder:
    b = CaptureBuilder(machine="aarch64")
    b.file("/proc/device-tree/model", "NVIDIA Jetson AGX Xavier Developer Kit\x00")
    b.file("/proc/device-tree/compatible", "nvidia,p2972-0000\x00nvidia,tegra194\x00")
    b.file("/etc/nv_tegra_release", "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64, DATE: Tue Aug  1 19:57:35 UTC 2023\n")
    b.device("/sys/module/nvgpu")
    return b


def jetson_agx_orin_jp6() -> CaptureBuilder:
    b = CaptureBuilder(machine="aarch64")
    b.file("/proc/device-tree/model", "NVIDIA Jetson AGX Orin Developer Kit\x00")
    b.file("/proc/device-tree/compatible", "nvidia,p3737-0000+p3701-0005\x00nvidia,p3701-0005\x00nvidia,tegra234\x00")
    b.file("/etc/nv_tegra_release", "# R36 (release), REVISION: 3.0, GCID: 36191598, BOARD: generic, EABI: aarch64, DATE: Mon May  6 17:34:21 UTC 2024\n")
    b.file("/sys/module/nvidia/version", "540.3.0\n")
    b.command(mf.SMI_QUERY, stdout=JETSON_SMI_ROW)
    b.memory = [int(61.4 * GIB), int(51.6 * GIB)]
    return b


# -- macOS of every era ------------------------------------------------------------------------------

# exelban/stats#394 (2021-03-31, MacBook with M1 on macOS 11): `system_profiler SPDisplaysDataType -json`
# as the stored public copy has it; that copy ends inside the first display entry.
STATS_394_URL = "https://github.com/exelban/stats/issues/394"
STATS_394_JSON = """{
  "SPDisplaysDataType" : [
    {
      "_name" : "kHW_AppleM1Item",
      "spdisplays_metalfamily" : "spdisplays_mtlgpufamilyapple7",
      "spdisplays_ndrvs" : [
        {
          "_name" : "Color LCD",
          "_spdisplays_display-product-id" : "a03c",
          "_spdisplays_display-serial-number" : "...",
          "_spdisplays_display-vendor-id" : "610",
          "_spdisplays_displa"""

# marslo/ibook docs/osx (a MacBook Pro on macOS 11.1, Intel UHD Graphics 630 + Radeon Pro 5500M; ids masked
# by the author): `system_profiler SPDisplaysDataType`, the text form of macOS 11.
IBOOK_URL = "https://github.com/marslo/ibook (docs/osx, section 'system info'; code-index id 60028431156)"
IBOOK_TEXT = """Graphics/Displays:

    Intel UHD Graphics 630:

      Chipset Model: Intel UHD Graphics 630
      Type: GPU
      Bus: Built-In
      VRAM (Dynamic, Max): 1536 MB
      Vendor: Intel
      Device ID: 0x3e**
      Revision ID: 0x00**
      Automatic Graphics Switching: Supported
      gMux Version: 5.0.0
      Metal Family: Supported, Metal GPUFamily macOS 2
      Displays:
        Color LCD:
          Display Type: Built-In Retina LCD
          Resolution: 3072 x 1920 Retina
          Framebuffer Depth: 24-Bit Color (ARGB8888)
          Main Display: Yes
          Mirror: Off
          Online: Yes
          Automatically Adjust Brightness: Yes
          Connection Type: Internal

    AMD Radeon Pro 5500M:

      Chipset Model: AMD Radeon Pro 5500M
      Type: GPU
      Bus: PCIe
      PCIe Lane Width: x8
      VRAM (Total): 8 GB
      Vendor: AMD (0x1002)
      Device ID: 0x73**
      Revision ID: 0x00**
      ROM Revision: 113-******-***
      VBIOS Version: 113-********-***
      Option ROM Version: 113-********-***
      EFI Driver Version: 01.A1.190
      Automatic Graphics Switching: Supported
      gMux Version: 5.0.0
      Metal Family: Supported, Metal GPUFamily macOS 2
"""


def macos11_m1_json_khw() -> CaptureBuilder:
    b = CaptureBuilder(system="Darwin", machine="arm64", mac_version="11.2.3")
    b.command(mf.PROFILER_JSON, stdout=STATS_394_JSON)
    b.memory = [8 * GIB, None]
    return b


def macos11_intel_uhd630_radeon5500m_text() -> CaptureBuilder:
    b = CaptureBuilder(system="Darwin", machine="x86_64", mac_version="11.1")
    b.command(mf.PROFILER_JSON, stdout="", returncode=1)
    b.command(mf.PROFILER_TEXT, stdout=IBOOK_TEXT)
    b.memory = [16 * GIB, None]
    return b


# -- Intel generation by PCI id / Windows NVIDIA driver and VRAM --------------------------------------

# A public machine inventory (code-index ids 58234029735 / 58360938562): i7-12650H laptop, Windows 11 build
# 10.0.26200, NVIDIA GeForce RTX 4060 Laptop GPU PCI\VEN_10DE&DEV_28A0 driver 32.0.15.8115, Intel UHD Graphics
# (Alder Lake-P GT1) PCI\VEN_8086&DEV_46A3 driver 32.0.101.7082.
ADL_URL = "public machine inventory in a GitHub repository's docs (code-index ids 58234029735 and 58360938562: i7-12650H laptop, RTX 4060 Laptop + Alder Lake-P UHD 46A3, Windows 11 10.0.26200)"
ADL_CPU = {"Name": "12th Gen Intel(R) Core(TM) i7-12650H", "Manufacturer": "GenuineIntel", "NumberOfCores": 10, "NumberOfLogicalProcessors": 16}
ADL_FEATURES = {"13": True, "19": False, "36": True, "37": True, "38": True, "39": True, "40": True, "41": False, "43": False, "46": False}
ADL_INTEL = {"Name": "Intel(R) UHD Graphics", "PNPDeviceID": "PCI\\VEN_8086&DEV_46A3", "DriverVersion": "32.0.101.7082", "AdapterRAM": 134217728, "Status": "OK"}
ADL_NVIDIA = {"Name": "NVIDIA GeForce RTX 4060 Laptop GPU", "PNPDeviceID": "PCI\\VEN_10DE&DEV_28A0", "DriverVersion": "32.0.15.8115", "AdapterRAM": 4293918720, "Status": "OK"}


def windows_adl_uhd46a3_rtx4060_laptop() -> CaptureBuilder:
    b = CaptureBuilder(system="Windows", machine="AMD64", release="11", version="10.0.26200", win_version="10.0.26200")
    b.powershell({
        "gpus": [ADL_INTEL, ADL_NVIDIA],
        "registry": [
            {"DriverDesc": "Intel(R) UHD Graphics", "MatchingDeviceId": "pci\\ven_8086&dev_46a3", "HardwareInformation.qwMemorySize": None},
            {"DriverDesc": "NVIDIA GeForce RTX 4060 Laptop GPU", "MatchingDeviceId": "pci\\ven_10de&dev_28a0", "HardwareInformation.qwMemorySize": 8589934592},
        ],
        "cpu": ADL_CPU, "features": ADL_FEATURES,
    })
    b.smi([[0, "00000000:01:00.0", "NVIDIA GeForce RTX 4060 Laptop GPU", 8188, 7957, "581.15", "8.9"]])
    b.device(mf.VULKAN_DLL)
    b.memory = [16 * GIB, None]
    return b


def windows_rtx4060_laptop_partial_wmi() -> CaptureBuilder:
    """The same laptop seen through WMI alone: no registry VRAM, no driver version, no nvidia-smi."""
    b = CaptureBuilder(system="Windows", machine="AMD64", release="11", version="10.0.26200", win_version="10.0.26200")
    nvidia = dict(ADL_NVIDIA, DriverVersion=None)
    b.powershell({"gpus": [ADL_INTEL, nvidia], "registry": [], "cpu": ADL_CPU, "features": ADL_FEATURES})
    b.command(mf.SMI_QUERY, missing=True)
    b.device(mf.VULKAN_DLL)
    b.memory = [16 * GIB, None]
    return b


def url_readme(name: str, summary: str, url: str, verbatim: List[str], transcribed: List[str], assumed: List[str]) -> str:
    lines = [f"# {name}", "", summary, "",
             f"- Source (public, not in shared/reference/hardware-dumps/): {url}",
             f"- Built by `tests/hardware/make_i11d_fixtures.py`; replay with `accelstack detect --replay tests/fixtures/captures/{name}`.",
             "", "## Verbatim from the public source (byte for byte)", ""]
    lines += [f"- {v}" for v in verbatim]
    lines += ["", "## Transcribed (the dump's facts, written as the source detection reads would hold them)", ""]
    lines += [f"- {t}" for t in transcribed] or ["- nothing"]
    lines += ["", "## Assumed (not in the dump; needed for a complete, plausible source)", ""]
    lines += [f"- {a}" for a in assumed] or ["- nothing"]
    lines += ["", "Anything else detection asks about (files, commands, environment variables) is absent from this",
              "capture and therefore answers as missing on replay.", ""]
    return "\n".join(lines)


URL_FIXTURES = {
    "i11d-windows-adl-uhd46a3-rtx4060-laptop": (
        windows_adl_uhd46a3_rtx4060_laptop,
        url_readme(
            "i11d-windows-adl-uhd46a3-rtx4060-laptop",
            "Windows 11 laptop: the Alder Lake-P iGPU 8086:46A3 is named just `Intel(R) UHD Graphics` (the name rules would call it "
            "Gen9); the PCI id says Xe-LP (Gen12, Alder Lake). RTX 4060 Laptop on driver 581.15.",
            ADL_URL,
            ["nothing: the inventory is a table, not a probe's output"],
            ["PowerShell JSON, Win32_VideoController: the two adapters with their PCI ids and driver versions from the inventory "
             "(32.0.101.7082 Intel, 32.0.15.8115 = NVIDIA 581.15); Windows 10.0.26200; CPU i7-12650H, 10 cores / 16 threads",
             "nvidia-smi query: RTX 4060 Laptop, driver 581.15, compute capability 8.9 (NV-CUDAGPUS)"],
            ["WMI names `Intel(R) UHD Graphics` and `NVIDIA GeForce RTX 4060 Laptop GPU` (the names those drivers give); PNPDeviceID without SUBSYS/REV",
             "AdapterRAM 128 MiB (Intel) and 4293918720 (NVIDIA, the 32-bit cap); registry qwMemorySize 8 GiB for the NVIDIA adapter",
             "nvidia-smi: bus 01:00.0, 8188 MiB total (what an 8 GB RTX 40 laptop reports), 7957 MiB free",
             "CPU features of Alder Lake (AVX2, no AVX-512), 16 GiB RAM, vulkan-1.dll present"],
        ),
    ),
    "i11d-windows-rtx4060-laptop-partial-wmi": (
        windows_rtx4060_laptop_partial_wmi,
        url_readme(
            "i11d-windows-rtx4060-laptop-partial-wmi",
            "The same laptop seen through WMI alone: AdapterRAM is capped at 4 GiB, the NVIDIA driver version is missing and "
            "nvidia-smi does not answer. VRAM must read as unknown (at least 4 GiB), and the NVIDIA driver as present with an unknown version.",
            ADL_URL,
            ["nothing: the inventory is a table, not a probe's output"],
            ["as in i11d-windows-adl-uhd46a3-rtx4060-laptop: adapters, PCI ids, Intel driver version, Windows build, CPU"],
            ["a partial report: the NVIDIA adapter's DriverVersion is null, no display-class registry entries were readable, "
             "nvidia-smi is not found; everything else as in i11d-windows-adl-uhd46a3-rtx4060-laptop"],
        ),
    ),
    "i11d-macos11-m1-json-khw-key": (
        macos11_m1_json_khw,
        url_readme(
            "i11d-macos11-m1-json-khw-key",
            "M1 Mac on macOS 11: the JSON names the GPU by its unlocalized key `kHW_AppleM1Item` and carries Metal "
            "support as `spdisplays_metalfamily` = `spdisplays_mtlgpufamilyapple7` (the macOS 11/12 field).",
            STATS_394_URL,
            ["`system_profiler SPDisplaysDataType -json` output as the stored copy of the issue has it (it ends inside the first display entry, so the JSON is cut short)"],
            ["8 GB RAM (the same issue's `SPMemoryDataType` output: 8 GB LPDDR4)"],
            ["macOS 11.2.3 (the issue is from 2021-03-31, the stats app version 2.5.7 of that month; macOS 11 is what writes `spdisplays_metalfamily`)",
             "no `sysctl` answer recorded (CPU facts are not the point of this capture)"],
        ),
    ),
    "i11d-macos11-intel-uhd630-radeon5500m-text": (
        macos11_intel_uhd630_radeon5500m_text,
        url_readme(
            "i11d-macos11-intel-uhd630-radeon5500m-text",
            "Intel MacBook Pro on macOS 11.1 with Intel UHD Graphics 630 + AMD Radeon Pro 5500M: the text form says "
            "`Metal Family: Supported, Metal GPUFamily macOS 2` (the macOS 11/12 wording); the discrete GPU must come first.",
            IBOOK_URL,
            ["`system_profiler SPDisplaysDataType` text output (device and ROM ids masked with `*` by the author, kept as masked)"],
            ["macOS 11.1 (the same page's `sw_vers`), 16 GB RAM (its `SPHardwareDataType`)"],
            ["`system_profiler SPDisplaysDataType -json` failed with exit status 1 and no output, so detection reads the text form the page shows"],
        ),
    ),
}


FIXTURES: List[Fixture] = [
    Fixture(
        "i11d-jetson-xavier-jp5",
        "032",
        jetson_xavier_jp5,
        summary="Jetson AGX Xavier on JetPack 5 (L4T R35): libcuda reports CUDA 11.4 and compute capability 7.2 (Tegra194).",
        transcribed=[
            "CUDA driver 11.4 on JetPack 5 (dump) -> `/etc/nv_tegra_release` of an L4T R35 system (the line format of a real R35.4.1 release file)",
            "compute capability 7.2 (dump) -> SoC Tegra194 (the only Jetson SoC with CC 7.2, NV-LEGACY): `/proc/device-tree/compatible` "
            "= `nvidia,p2972-0000`, `nvidia,tegra194` (NUL-separated, as the Linux kernel's tegra194-p2972-0000.dts lists them)",
            "libcuda from /usr/lib/aarch64-linux-gnu/tegra (dump): the nvgpu driver, so `/sys/module/nvgpu` exists and no nvidia.ko is loaded",
        ],
        assumed=[
            "the board is the AGX Xavier developer kit (`/proc/device-tree/model` = `NVIDIA Jetson AGX Xavier Developer Kit`; the dump prints no name)",
            "L4T revision 4.1 (JetPack 5.1.2); any R35 revision gives the same CUDA 11.4",
            "no PCI GPUs (Jetson's GPU is not on PCI), no nvidia-smi (JetPack 5 has none)",
        ],
    ),
    Fixture(
        "i11d-jetson-agx-orin-jp6",
        "033",
        jetson_agx_orin_jp6,
        summary="Jetson AGX Orin 64GB on JetPack 6.0 (L4T R36.3): CUDA driver 12.2, compute capability 8.7; nvidia-smi answers [N/A] for every field.",
        transcribed=[
            "CUDA driver 12.2, Ollama variant jetpack6 (dump) -> `/etc/nv_tegra_release` of L4T R36.3 (JetPack 6.0, the JetPack 6 release with CUDA 12.2)",
            "compute=8.7, name=Orin (dump) -> `/proc/device-tree/compatible` ending in `nvidia,tegra234` (Orin)",
            "61.4 GiB total / 51.6 GiB available (dump; unified memory = system RAM) -> the capture's memory",
        ],
        assumed=[
            "64 GB AGX Orin module p3701-0005 on the p3737 developer kit carrier (model `NVIDIA Jetson AGX Orin Developer Kit`)",
            "JetPack 6's OpenRM module reports version 540.3.0 in `/sys/module/nvidia/version` (OE4T/linux-tegra-5.10#17 shows NVIDIA-SMI 540.3.0 with CUDA 12.2)",
            "nvidia-smi query output `0, [N/A], Orin (nvgpu), [N/A], [N/A], [N/A], [N/A]`, the all-[N/A] row of Chen-zexi/vllm-cli#11 "
            "(https://github.com/Chen-zexi/vllm-cli/pull/11); detection must not use it",
            "no PCI GPUs",
        ],
    ),
]


def main(argv: List[str]) -> int:
    wanted = set(argv)
    for name, (build, readme) in URL_FIXTURES.items():
        if not wanted or name in wanted:
            build().write(CAPTURES / name, readme)
            print(CAPTURES / name)
    for fx in FIXTURES:
        if not wanted or fx.name in wanted:
            readme = fx.readme().replace("tests/fixtures/make_fixture.py", "tests/hardware/make_i11d_fixtures.py")
            fx.build().write(CAPTURES / fx.name, readme)
            print(CAPTURES / fx.name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
