"""Build the AMD-Radeon-on-Windows fixtures (``tests/fixtures/captures/windows-amd-*``) from real dumps.

Same format as ``tests/fixtures/make_fixture.py`` (whose ``CaptureBuilder`` it uses). What these add
to the older Windows captures is the HIP runtime the Adrenalin driver installed: detection asks
whether ``C:\\Windows\\System32\\amdhip64_<N>.dll`` exists (newest major first), and a capture records
each answer in ``exists``. The dumps are Ollama server logs and an issue's hardware table: their
``compute=gfxNNNN driver=…`` facts are transcribed into the PowerShell answer detection reads.

    .venv/bin/python tests/hardware/make_amd_windows_fixtures.py          # rewrite every windows-amd fixture
    .venv/bin/python tests/hardware/make_amd_windows_fixtures.py NAME ... # rewrite some
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("accelstack_make_fixture", HERE.parent / "fixtures" / "make_fixture.py")
assert _spec and _spec.loader
mf = sys.modules.get("accelstack_make_fixture") or importlib.util.module_from_spec(_spec)
if "accelstack_make_fixture" not in sys.modules:
    sys.modules["accelstack_make_fixture"] = mf
    _spec.loader.exec_module(mf)

CaptureBuilder, CAPTURES, GIB = mf.CaptureBuilder, mf.CAPTURES, mf.GIB
SYSTEM32 = "C:\\Windows\\System32"
OLLAMA_12564 = "https://github.com/ollama/ollama/issues/12564"
THEROCK_8186 = "https://github.com/ROCm/TheRock/issues/8186"
OLLAMA_AMD_87 = "https://github.com/likelovewant/ollama-for-amd/issues/87"
ZEN_FEATURES = {"13": True, "19": False, "36": True, "37": True, "38": True, "39": True, "40": True, "41": False, "43": False, "46": False}
ZEN5_FEATURES = dict(ZEN_FEATURES, **{"41": True})


def _hip(b: CaptureBuilder, major: Optional[str]) -> None:
    """What detection learns from the system directory: the driver's newest amdhip64_<N>.dll."""
    for m in ("7", "6", "5"):
        b.device(f"{SYSTEM32}\\amdhip64_{m}.dll", exists=major is not None and int(m) <= int(major))


def _radeon(name: str, device: str, driver: str, vram: Optional[int], cpu: Dict[str, object], features: Dict[str, bool],
            hip: Optional[str], **platform: str) -> CaptureBuilder:
    b = CaptureBuilder(system="Windows", machine="AMD64", **platform)
    b.powershell({
        "gpus": [{"Name": name, "PNPDeviceID": f"PCI\\VEN_1002&DEV_{device}", "DriverVersion": driver, "AdapterRAM": 4293918720, "Status": "OK"}],
        "registry": [{"DriverDesc": name, "MatchingDeviceId": f"pci\\ven_1002&dev_{device.lower()}", "HardwareInformation.qwMemorySize": vram}],
        "cpu": cpu,
        "features": features,
    })
    b.device(mf.VULKAN_DLL)
    _hip(b, hip)
    return b


def rx7900xtx_hip6() -> CaptureBuilder:
    return _radeon("AMD Radeon RX 7900 XTX", "744C", "32.0.21025.1024", 24 * GIB,
                   {"Name": "AMD Ryzen 7 8-Core Processor", "Manufacturer": "AuthenticAMD", "NumberOfCores": 8, "NumberOfLogicalProcessors": 16},
                   ZEN_FEATURES, "6")


def radeon890m_hip7() -> CaptureBuilder:
    return _radeon("AMD Radeon(TM) 890M Graphics", "150E", "32.0.23017.1001", None,
                   {"Name": "AMD Ryzen AI 9 HX 370 w/ Radeon 890M", "Manufacturer": "AuthenticAMD", "NumberOfCores": 12, "NumberOfLogicalProcessors": 24},
                   ZEN5_FEATURES, "7", release="11", version="10.0.26200", win_version="10.0.26200")


def rx9070xt_hip6() -> CaptureBuilder:
    return _radeon("AMD Radeon RX 9070 XT", "7550", "32.0.21001.9024", 16 * GIB,
                   {"Name": "AMD Ryzen Processor", "Manufacturer": "AuthenticAMD", "NumberOfCores": 8, "NumberOfLogicalProcessors": 16},
                   ZEN_FEATURES, "6")


def readme(name: str, summary: str, url: str, verbatim: List[str], transcribed: List[str], assumed: List[str]) -> str:
    lines = [f"# {name}", "", summary, "", f"- Source (public; a dump in shared/reference/hardware-dumps/ only where named): {url}",
             f"- Built by `tests/hardware/make_amd_windows_fixtures.py`; replay with `accelstack detect --replay tests/fixtures/captures/{name}`.",
             "", "## Verbatim from the public source (byte for byte)", ""]
    lines += [f"- {v}" for v in verbatim] or ["- nothing: the source shows no output that detection reads itself"]
    lines += ["", "## Transcribed (the dump's facts, written as the source detection reads would hold them)", ""]
    lines += [f"- {t}" for t in transcribed] + [f"- {mf.PS_JSON}"]
    lines += ["", "## Assumed (not in the dump; needed for a complete, plausible source)", ""]
    lines += [f"- {a}" for a in assumed] or ["- nothing"]
    lines += ["", "Anything else detection asks about (files, commands, environment variables) is absent from this",
              "capture and therefore answers as missing on replay.", ""]
    return "\n".join(lines)


FIXTURES: Dict[str, Tuple[Callable[[], CaptureBuilder], str]] = {
    "windows-amd-rx7900xtx-hip6": (rx7900xtx_hip6, readme(
        "windows-amd-rx7900xtx-hip6",
        "Windows desktop, AMD Radeon RX 7900 XTX (gfx1100) on an Adrenalin driver whose HIP runtime is 6.4 (Ollama 0.12.4 log).",
        OLLAMA_12564,
        ["nothing: the log is Ollama's, not a probe detection runs"],
        ["`compute=gfx1100 ... description=\"AMD Radeon RX 7900 XTX\" ... driver=60450.10 pci_id=03:00.0 type=discrete total=\"24.0 GiB\"` "
         "-> Win32_VideoController `AMD Radeon RX 7900 XTX`, registry qwMemorySize 24 GiB",
         "driver=60450.10 is HIP 6.4.50 (Ollama reads the driver's amdhip64_6.dll) -> `amdhip64_6.dll` present, `amdhip64_7.dll` absent",
         "`cores=8 efficiency=0 threads=16` -> Win32_Processor 8 cores / 16 threads"],
        ["PCI device id 744C (the RX 7900 XTX's, pci.ids); the log prints only the bus address",
         "Adrenalin DriverVersion 32.0.21025.1024 (a 25.x-era version; the log has the HIP version only)",
         "CPU name `AMD Ryzen 7 8-Core Processor` (the log has its core counts only), features of a Zen 4 without AVX-512 flags",
         "`vulkan-1.dll` present"])),
    "windows-amd-890m-gfx1150-hip7": (radeon890m_hip7, readme(
        "windows-amd-890m-gfx1150-hip7",
        "Windows 11 laptop, Ryzen AI 9 HX 370 with its Radeon 890M iGPU (gfx1150, Strix Point) running AMD's ROCm 7.14 wheels from "
        "repo.amd.com/rocm/whl-multi-arch.",
        THEROCK_8186,
        ["nothing: the issue has a hardware table, not a probe's output"],
        ["`CPU | Ryzen AI 9 HX 370 (12C/24T, Zen5)` -> Win32_Processor 12 cores / 24 threads, AVX-512 (Zen 5)",
         "`iGPU | Radeon 890M, **gfx1150**` -> Win32_VideoController `AMD Radeon(TM) 890M Graphics`",
         "`OS | Windows 11 26200` -> platform 10.0.26200",
         "ROCm 7.14 wheels (rocm_sdk_device_gfx1150-7.14.0, rocm_sdk_core-7.14.0) run on the GPU, and they load the driver's HIP 7 "
         "runtime (compat-facts 4b) -> `amdhip64_7.dll` (and the older `amdhip64_6.dll` the driver keeps) present"],
        ["PCI device id 150E (Strix Point's, amdgpu's table)",
         "Adrenalin DriverVersion 32.0.23017.1001 (a 26.x-era version; the issue gives none)",
         "no registry VRAM size (an iGPU's carve-out, unknown here); `vulkan-1.dll` present"])),
    "windows-amd-rx9070xt-gfx1201-hip6": (rx9070xt_hip6, readme(
        "windows-amd-rx9070xt-gfx1201-hip6",
        "Windows, AMD Radeon RX 9070 XT (gfx1201, RDNA4; built but not release-tested in AMD's Windows ROCm) on a driver with HIP 6.4.",
        OLLAMA_AMD_87 + " (dump ../shared/reference/hardware-dumps/062-windows-amd-rx9070xt-ollama-rocm-log-gfx1201.md)",
        ["nothing: the log is Ollama's, not a probe detection runs"],
        ["`compute=gfx1201 driver=6.4 name=\"AMD Radeon RX 9070 XT\" total=\"15.9 GiB\"` -> Win32_VideoController `AMD Radeon RX 9070 XT`, "
         "registry qwMemorySize 16 GiB",
         "driver=6.4 (HIP 6.4) -> `amdhip64_6.dll` present, `amdhip64_7.dll` absent"],
        ["PCI device id 7550 (the RX 9070 XT's, pci.ids); the Windows log prints the marketing name only",
         "Adrenalin DriverVersion 32.0.21001.9024; CPU `AMD Ryzen Processor`, 8 cores / 16 threads (the template says only AMD)",
         "`vulkan-1.dll` present"])),
}


def main(argv: List[str]) -> int:
    return mf.write_built(FIXTURES, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
